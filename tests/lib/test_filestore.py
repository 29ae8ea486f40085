"""FileStore beyond the shared contract: segment rotation and deletion, stuck
records moved forward, torn tails and bit flips caught by the CRC, group commit,
and a full filesystem (the store's own budget, and one filled from elsewhere)."""

import os

from check import MICROPYTHON, Rng, raises, read_all
from storekit import LfsVolume, tmppath, rm, rmtree
from tern.store import PUBLISH, SUBSCRIBE
from tern.filestore import OutboxUnknown, FileStore

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


def test_a_damaged_record_is_said_to_a_function_given_as_verbose():
    # tern pub --outbox reports it (which file, what is lost) instead of printing on stdout
    p = tmppath("sayf")
    try:
        name, data = fresh_segment(p, 10)
        data = bytearray(data)
        data[20 + 2 * (16 + 62 + 4) + 16 + 30] ^= 4  # in the body of the third record: its CRC fails
        with open(name, "wb") as f:
            f.write(data)
        said = []
        st = FileStore(p, verbose=said.append).open()
        assert st.pending() == [1, 2, 4, 5, 6, 7, 8, 9, 10]
        assert len(said) == 1 and said[0].startswith("tern.filestore: segment "), said
        assert said[0].endswith(": record at 184 fails its CRC: skipped"), said
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


def test_group_commit_offline_publish_survives_kill_9():
    """A real Client, offline, its store in group commit mode: every publish() that returned survives
    a SIGKILL of the process. Before, nothing was committed until a connection came: 10 published, the
    process killed, 0 recovered (FileStore on POSIX under CPython: its file buffer; on LittleFS: the
    file's cache; FlashStore: its group buffer)."""
    import sys
    import norflash
    import tern
    from norflash import NorFlash
    from tern.flashstore import FlashStore

    here = __file__.rpartition("/")[0] or "."
    # the child imports tern and norflash from where this process has them (CPython: PYTHONPATH;
    # MicroPython: the MICROPYPATH it inherits)
    where = "%s:%s" % (norflash.__file__.rpartition("/")[0], tern.__file__.rpartition("/tern/")[0])
    for medium in ("posix", "lfs", "flash"):
        p = tmppath("kill")
        vol = LfsVolume(p, blocks=32) if medium == "lfs" else None
        if medium == "flash":
            NorFlash(p, blocks=8, fresh=True).close()
        try:
            os.system("PYTHONPATH=%s %s %s/killed_publisher.py %s %s 10 > %s.out 2>&1" % (where, sys.executable, here,
                                                                                          medium, p, p))
            with open(p + ".out") as f:
                lines = f.read().split("\n")
            acc = [int(x[4:]) for x in lines if x.startswith("ACC ")]
            assert len(acc) == 10 and "NOT KILLED" not in lines, lines
            if medium == "flash":
                dev = NorFlash(p, blocks=8)
                st = FlashStore(dev, verbose=False).open()
            else:
                d, fs = vol.mount() if vol else (p, None)
                st = FileStore(d, fs=fs, verbose=False).open()
            assert st.pending() == acc, (medium, st.pending(), acc)
            st.close()
            if medium == "flash":
                dev.close()
        finally:
            if vol:
                vol.cleanup()
            elif medium == "flash":
                rm(p)
            else:
                rmtree(p)
            os.remove(p + ".out")


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


# -- a full filesystem ---------------------------------------------------------------
ENOSPC = 28


def lfs_segs(d, fs):
    """Segment files in the store directory d of a mounted LfsVolume."""
    return sorted(n for n in (fs.listdir(d) if fs is not None else os.listdir(d)) if n.endswith(".seg"))


def fill_to_refusal(st, r, first=1, limit=2000):
    """Append PUBLISH records until the store refuses one; returns {pid: packet}."""
    got = {}
    for pid in range(first, first + limit):
        data = b"\x34\x4e" + bytes(r.bytes(30 + r.below(300)))
        try:
            st.append(PUBLISH, pid, data[:2], data[2:])
        except OSError as e:
            assert e.args[0] == ENOSPC, repr(e)
            return got
        got[pid] = data
    raise AssertionError("the store never filled")


def test_max_bytes_that_holds_no_message_is_refused_at_open_naming_the_minimum():
    """On LittleFS with 4 KiB blocks, FileStore(max_bytes=16384) opened, and its headroom and reserve
    took the whole budget: every append said "outbox full", 0 records held. Now open() refuses it with
    the minimum, and the minimum holds messages."""
    vol = LfsVolume(tmppath("least"), blocks=32)
    try:
        d, fs = vol.mount()
        e = raises(ValueError, FileStore(d, fs=fs, max_bytes=16384, verbose=False).open)
        assert "max_bytes=16384" in str(e) and "at least 20480 with 4096-byte blocks" in str(e), str(e)
        st = FileStore(d, fs=fs, max_bytes=20480, verbose=False).open()
        got = fill_to_refusal(st, Rng(5))
        assert len(got) >= 5, len(got)
        assert st.pending() == sorted(got)
        st.close()
        vol.unmount()
    finally:
        vol.cleanup()


def test_full_littlefs_takes_every_ack_and_drains():
    """Filled until the store says ENOSPC (before: littlefs-python raised its
    own LittleFSError here, and under VfsLfs2 the first mark after it failed
    with ENOSPC, as releases did): every kind of ack still goes through, mark/unmark cycles write far more
    ack records than the free space left (so segments must be compacted),
    and after releases the store takes appends again and reboots to the
    right pending set."""
    vol = LfsVolume(tmppath("full"), blocks=16)
    try:
        d, fs = vol.mount()
        st = FileStore(d, fs=fs, verbose=False).open()
        st.set_meta("client", b"c1")
        for i in (5, 6, 7):
            st.in_add(i)
        r = Rng(9)
        data = fill_to_refusal(st, r)
        pids = sorted(data)
        assert len(pids) > 20, len(pids)
        assert st.pending() == pids
        before = lfs_segs(d, fs)
        marked = set()
        for rnd in range(24):  # ~1,900 ack records: more than the volume has free
            for p in pids[rnd % 3 :: 3]:
                st.mark(p)
                marked.add(p)
            for p in pids[(rnd + 1) % 3 :: 3]:
                st.unmark(p)
                marked.discard(p)
        assert lfs_segs(d, fs)[0] > before[-1], (before, lfs_segs(d, fs))  # every old segment moved on
        st.in_add(8)  # an inbound QoS 2 id and a meta update still fit (room is kept for them)
        st.set_meta("client", b"c2")
        e = raises(OSError, st.append, PUBLISH, 1999, b"\x34\x4e", b"x" * 340)  # still full: refused cleanly
        assert e.args[0] == ENOSPC and "outbox full" in str(e), repr(e)
        assert st.pending() == pids
        st.in_release(5)
        st.in_clear()
        st.in_add(9)
        st.release(pids[0])
        st.release(pids[1])
        st.close()
        st = FileStore(d, fs=fs, verbose=False).open()  # reboot: all of it durable
        left = pids[2:]
        assert st.pending() == left
        for p in left:
            assert st.marked(p) == (p in marked), p
            assert read_all(st, p) == data[p]
        assert [i for i in range(5, 10) if st.in_has(i)] == [9]
        assert st.meta("client") == b"c2" and st.last_pid() == pids[-1]
        for p in left[: len(left) // 2]:  # acks free room: appends are taken again
            st.release(p)
        more = fill_to_refusal(st, r, 3000)
        assert len(more) > 5, len(more)
        for p in st.pending():
            st.release(p)
        st.close()
        st = FileStore(d, fs=fs, verbose=False).open()
        assert st.pending() == [] and st.count() == 0
        st.close()
        vol.unmount()
    finally:
        vol.cleanup()


def fill_filesystem(vol, fs):
    """Other files take every free block of the volume (LittleFS keeps a block
    for copy-on-write while one file grows: a next file takes that); returns
    their paths."""
    paths = []
    for i in range(8):
        path = ("/filler%d" if fs is not None else vol.mp + "/filler%d") % i
        paths.append(path)
        f = fs.open(path, "wb") if fs is not None else open(path, "wb")
        n = 0
        try:
            for n in range(4096):
                f.write(bytes(512))
                f.flush()
                getattr(f, "raw", f).flush()  # (littlefs-python: the sync is the raw file's flush)
        except Exception as e:  # littlefs-python: LittleFSError; VfsLfs2: OSError
            assert "28" in str(e) or "NOSPC" in str(e), repr(e)
        try:
            f.close()
        except Exception:
            pass
        if n < 2:
            return paths
    raise AssertionError("the volume never filled")


def test_write_failing_half_way_on_a_full_filesystem():
    """The filesystem fills from elsewhere, under the store's budget: a record
    whose write fails part-way raises OSError(ENOSPC, "outbox full ...") and
    the store goes on in a new segment. Before: littlefs-python raised its
    own LittleFSError, and the appends and the release made after it
    returned but were gone after a reboot (the failed file took them);
    VfsLfs2 raised a bare OSError 28; on POSIX the record whose append had
    raised came back after a reboot (a later flush completed it)."""
    vol = LfsVolume(tmppath("half"), blocks=16)
    try:
        d, fs = vol.mount()
        st = FileStore(d, fs=fs, verbose=False).open()
        want = {}
        for pid in range(1, 6):
            want[pid] = b"\x32\x4e" + body(pid)
            st.append(PUBLISH, pid, want[pid][:2], want[pid][2:])
        st.mark(3)
        fillers = fill_filesystem(vol, fs)
        e = raises(OSError, st.append, PUBLISH, 6, b"\x32\x4e", bytes(3000))
        assert e.args[0] == ENOSPC and "outbox full" in str(e), repr(e)
        assert st.pending() == [1, 2, 3, 4, 5] and st.marked(3)
        for f in fillers:
            fs.remove(f) if fs is not None else os.remove(f)
        for pid in (7, 8):
            want[pid] = b"\x32\x4e" + body(pid)
            st.append(PUBLISH, pid, want[pid][:2], want[pid][2:])
        st.release(2)
        st.unmark(3)
        st.close()
        st = FileStore(d, fs=fs).open()
        assert st.pending() == [1, 3, 4, 5, 7, 8], st.pending()
        assert not st.marked(3)
        for pid in st.pending():
            assert read_all(st, pid) == want[pid]
        st.close()
        vol.unmount()
    finally:
        vol.cleanup()
    if not MICROPYTHON:
        posix_write_failing_half_way()


def test_group_commit_failed_write_voids_what_was_not_durable():
    """Group commit: a failed write voids what the segment held past its last
    sync (here a mark staged before it, whose PUBREL the session has queued)
    and the store reads its segments again (lib/tern/store.py, "When storage
    fails"). It stays dirty, its epoch moved on, until the session has
    followed: Session.out commits and follows before any byte leaves, so the
    PUBREL announcing the lost mark never does (model file-lfs-gc seed 33: QoS
    2 twice). On a full LittleFS voiding may itself fail: then the state is
    unknown and every commit says so until there is room."""
    vol = LfsVolume(tmppath("grpfail"), blocks=16)
    try:
        d, fs = vol.mount()
        st = FileStore(d, fs=fs, group_commit=True, verbose=False).open()
        for pid in range(1, 4):
            st.append(PUBLISH, pid, b"\x34\x4e", body(pid))
        st.commit()
        st.mark(2)  # staged: its PUBREL would be queued behind it
        fillers = fill_filesystem(vol, fs)
        e = raises(OSError, st.append, PUBLISH, 4, b"\x34\x4e", bytes(3000))
        assert e.args[0] in (ENOSPC, 5), repr(e)
        assert st.dirty
        failed = st.epoch != st.seen  # (else the budget refused it before any write: nothing failed)
        if not MICROPYTHON:
            assert failed  # littlefs-python fails the write part-way
        if isinstance(e, OutboxUnknown):
            raises(OutboxUnknown, st.commit)  # nothing goes while the state is unknown
        for f in fillers:
            fs.remove(f) if fs is not None else os.remove(f)
        st.commit()  # known now: what the segments hold
        if failed:
            assert st.dirty and st.epoch != st.seen  # until the session has followed
            assert st.pending() == [1, 2, 3] and not st.marked(2)
            st.seen = st.epoch
            st.commit()
        assert not st.dirty and st.marked(2) != failed
        st2 = FileStore(d, fs=fs).open()
        assert st2.pending() == [1, 2, 3] and st2.marked(2) != failed  # what the store said is what is durable
        st2.close()
        st.mark(2)
        st.commit()
        st.close()
        st = FileStore(d, fs=fs).open()
        assert st.pending() == [1, 2, 3] and st.marked(2)
        st.close()
        vol.unmount()
    finally:
        vol.cleanup()


def posix_write_failing_half_way():
    """POSIX (CPython; the MicroPython unix port has no setrlimit): a file-size
    limit makes the kernel take part of a record and refuse the rest (EFBIG),
    the real thing a full disk does to a write."""
    import resource
    import signal

    p = tmppath("halfposix")
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    sig = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        st = FileStore(p).open()
        for pid in range(1, 4):
            st.append(PUBLISH, pid, b"\x32\x4e", body(pid))
        name = p + "/" + segs(p)[-1]
        size = os.path.getsize(name)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, old[1]))
        try:
            e = raises(OSError, st.append, PUBLISH, 4, b"\x32\x4e", bytes(500))
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, old)
        assert e.errno == 27, e  # EFBIG
        assert os.path.getsize(name) == size + 100  # the record is in the file half-written
        st.append(PUBLISH, 5, b"\x32\x4e", body(5))
        st.release(1)
        st.close()
        st = FileStore(p, verbose=False).open()
        assert st.pending() == [2, 3, 5], st.pending()
        assert read_all(st, 5) == b"\x32\x4e" + body(5)
        st.close()
    finally:
        signal.signal(signal.SIGXFSZ, sig)
        rmtree(p)
