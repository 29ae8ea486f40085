"""FileStore beyond the shared contract: segment rotation and deletion, stuck
records moved forward, torn tails and bit flips caught by the CRC, group commit."""

import os

from check import Rng, raises, read_all
from test_norflash import tmppath, rmtree
from test_store_contract import LfsVolume
from tern.store import PUBLISH, SUBSCRIBE
from tern.filestore import FileStore

MP_HEAPSIZE = "4m"


def segs(path):
    return sorted(n for n in os.listdir(path) if n.endswith(".seg"))


def body(pid):
    return bytes((pid * 3 + i) & 0xFF for i in range(60))


def long_run(path, fs=None, n=1500):
    st = FileStore(path, fs=fs, segment_bytes=2048, max_segments=3).open()
    st.append(SUBSCRIBE, 65000, b"\x82\x08", b"stuck")
    st.mark(65000)
    st.in_add(9)
    st.set_meta("client", b"c1")
    window = []
    rng = Rng(3)
    most = 0
    for i in range(1, n + 1):
        st.append(PUBLISH, i, b"\x32\x3e", body(i))
        window.append(i)
        while len(window) > 1 + rng.below(6):
            st.release(window.pop(0))
        if fs is None:
            most = max(most, len(segs(path)))
        if i % 500 == 0:
            st.close()
            st = FileStore(path, fs=fs, segment_bytes=2048, max_segments=3).open()
            assert st.pending() == [65000] + window
    assert st.pending() == [65000] + window
    assert st.marked(65000) and read_all(st, 65000) == b"\x82\x08stuck"
    for q in window:
        assert read_all(st, q) == b"\x32\x3e" + body(q)
    assert st.in_has(9) and st.meta("client") == b"c1" and st.last_pid() == n
    st.close()
    return most


def test_segments_rotate_and_dead_ones_go():
    p = tmppath("seg")
    try:
        most = long_run(p)
        # ~100 KiB went through; at most max_segments (+ the one being opened) exist
        assert most <= 4, most
        assert len(segs(p)) <= 4, segs(p)
    finally:
        rmtree(p)


def test_segments_on_littlefs_over_nor():
    vol = LfsVolume(tmppath("seglfs"), blocks=32)
    try:
        d, fs = vol.mount()
        long_run(d, fs=fs, n=400)
        vol.unmount()
    finally:
        vol.cleanup()


def fresh_segment(p, n):
    """A new store in p holding PUBLISH records 1..n, closed: (its segment file, that file's bytes)."""
    rmtree(p)
    st = FileStore(p).open()
    for pid in range(1, n + 1):
        st.append(PUBLISH, pid, b"\x32\x3e", body(pid))
    st.close()
    name = p + "/" + segs(p)[-1]
    with open(name, "rb") as f:
        return name, f.read()


def test_torn_tail_is_ignored_and_never_appended_to():
    p = tmppath("torn")
    try:
        for cut in (1, 5, 17, 40, 81):
            name, data = fresh_segment(p, 5)
            with open(name, "wb") as f:  # the last record lost its last `cut` bytes
                f.write(data[: len(data) - cut])
            st = FileStore(p, verbose=False).open()
            assert st.pending() == [1, 2, 3, 4], (cut, st.pending())
            assert read_all(st, 4) == b"\x32\x3e" + body(4)
            st.append(PUBLISH, 5, b"\x32\x01", b"n")
            st.close()
            with open(name, "rb") as f:
                assert len(f.read()) == len(data) - cut  # the torn file was not appended to
            st = FileStore(p).open()
            assert st.pending() == [1, 2, 3, 4, 5] and read_all(st, 5) == b"\x32\x01n"
            st.close()
    finally:
        rmtree(p)


def test_bit_flip_skips_that_record_only():
    p = tmppath("flipf")
    try:
        for trial in range(8):
            rng = Rng(50 + trial)
            name, data = fresh_segment(p, 10)
            data = bytearray(data)
            rec = 16 + 62 + 4
            victim = 1 + rng.below(10)
            start = 20 + (victim - 1) * rec  # after the 20-byte SEG record
            pos = start + rng.below(rec)
            if pos - start in (12, 13, 14, 15):
                pos += 4
            data[pos] ^= 1 << rng.below(8)
            with open(name, "wb") as f:
                f.write(data)
            st = FileStore(p).open()
            want = [q for q in range(1, 11) if q != victim]
            assert st.pending() == want, (victim, st.pending())
            for q in want:
                assert read_all(st, q) == b"\x32\x3e" + body(q)
            st.close()
    finally:
        rmtree(p)


def copy_file(a, b):
    with open(a, "rb") as f:
        data = f.read()
    with open(b, "wb") as f:
        f.write(data)


def test_group_commit_defers_durability_to_commit():
    """On LittleFS over the NOR flash: what a power cut would leave is seen by
    mounting a copy of the flash image taken at that moment."""
    vol = LfsVolume(tmppath("grp"), blocks=16)
    snap = LfsVolume(tmppath("grpsnap"), blocks=16, format=False)

    def after_power_cut():
        copy_file(vol.path, snap.path)
        copy_file(vol.path + ".wear", snap.path + ".wear")
        d, fs = snap.mount()
        st2 = FileStore(d, fs=fs).open()
        got = st2.pending()
        st2.close()
        snap.unmount()
        return got

    try:
        d, fs = vol.mount()
        st = FileStore(d, fs=fs, group_commit=True).open()
        for pid in range(1, 6):
            st.append(PUBLISH, pid, b"\x32\x3e", body(pid))
        st.release(2)
        assert after_power_cut() == []  # not durable yet
        st.commit()
        assert after_power_cut() == [1, 3, 4, 5]  # one commit made it all durable
        st.close()
        vol.unmount()
    finally:
        vol.cleanup()
        snap.cleanup()


def test_record_over_64k_refused_before_it_is_written():
    """A record's length field is 16 bits: a bigger packet is refused up front
    instead of being accepted and then lost (its CRC fails) at the next boot."""
    p = tmppath("big")
    try:
        st = FileStore(p).open()
        st.append(PUBLISH, 1, b"\x32\x4e", b"a")
        e = raises(ValueError, st.append, PUBLISH, 2, b"\x32\x80\x80\x04", bytes(65536))
        assert "65536" in str(e) or "65540" in str(e), str(e)
        st.append(PUBLISH, 3, b"\x32\x4e", bytes(65535 - 2))  # the largest that fits
        st.close()
        st = FileStore(p).open()
        assert st.pending() == [1, 3] and st.size(3) == 65535
        st.close()
    finally:
        rmtree(p)
