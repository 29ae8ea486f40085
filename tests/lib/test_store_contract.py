"""One contract (lib/tern/store.py), every backend: MemoryStore is the reference;
FlashStore (in-place and appended acks, group commit) on the emulated NOR
flash; FileStore on POSIX and on LittleFS over the emulated NOR flash
(MicroPython's VfsLfs2; littlefs-python under CPython). Durable backends must
also give back everything after a "reboot" (a new device object on the same
image file)."""

from check import MICROPYTHON, raises
from norflash import NorFlash, PowerCut
from storekit import LfsVolume, tmppath, rm, rmtree
from tern.store import MemoryStore, PUBLISH, SUBSCRIBE, UNSUBSCRIBE
from tern.flashstore import FlashStore
from tern.filestore import FileStore

MP_HEAPSIZE = "4m"


# -- backends -------------------------------------------------------------------
class MemoryBackend:
    durable = False

    def new(self):
        return MemoryStore().open()

    def reopen(self, st):
        return st

    def cleanup(self):
        pass


class FlashBackend:
    durable = True

    def __init__(self, blocks=8, **opts):
        self.path = tmppath("flash")
        self.blocks = blocks
        self.opts = opts
        self.dev = None

    def new(self):
        self.dev = NorFlash(self.path, blocks=self.blocks, fresh=True)
        return FlashStore(self.dev, **self.opts).open()

    def reopen(self, st):
        st.close()
        self.dev.close()
        self.dev = NorFlash(self.path, blocks=self.blocks)
        return FlashStore(self.dev, **self.opts).open()

    def cleanup(self):
        if self.dev is not None:
            self.dev.close()
        rm(self.path)


class PosixBackend:
    durable = True

    def __init__(self, **opts):
        self.path = tmppath("files")
        self.opts = opts

    def new(self):
        return FileStore(self.path, **self.opts).open()

    def reopen(self, st):
        st.close()
        return FileStore(self.path, **self.opts).open()

    def cleanup(self):
        rmtree(self.path)


class LfsBackend:
    durable = True

    def __init__(self, **opts):
        self.vol = LfsVolume(tmppath("lfs"))
        self.opts = opts

    def new(self):
        d, fs = self.vol.mount()
        return FileStore(d, fs=fs, **self.opts).open()

    def reopen(self, st):
        st.close()
        self.vol.unmount()
        d, fs = self.vol.mount()
        return FileStore(d, fs=fs, **self.opts).open()

    def cleanup(self):
        self.vol.cleanup()


# -- the contract -----------------------------------------------------------------
def content(st, pid):
    n = st.size(pid)
    buf = bytearray(n + 5)
    got = st.read(pid, 0, buf)
    assert got == n, (got, n)
    return bytes(buf[:n])


def expect(st, recs, marks, ins, meta, last):
    """recs: [(pid, kind, bytes)] in order."""
    assert st.pending() == [r[0] for r in recs], (st.pending(), [r[0] for r in recs])
    assert st.count() == len(recs)
    for pid, kind, data in recs:
        assert st.has(pid)
        assert st.kind(pid) == kind
        assert st.marked(pid) == (pid in marks), pid
        assert st.size(pid) == len(data)
        assert content(st, pid) == data
    for pid in range(1, 20):
        assert st.in_has(pid) == (pid in ins), pid
    for k in meta:
        assert st.meta(k) == meta[k], (k, st.meta(k))
    assert st.last_pid() == last, (st.last_pid(), last)


def check_contract(b):
    try:
        _contract(b)
    finally:
        b.cleanup()


def _contract(b):
    st = b.new()
    expect(st, [], (), (), {"client": None}, 0)
    p7 = b"\x32\x0a\x00\x03a/b\x00\x07" + b"hello"
    p9 = bytes(range(256)) + b"\x00" * 44
    st.append(PUBLISH, 7, p7[:9], p7[9:])
    st.append(SUBSCRIBE, 3, b"\x82\x06\x00\x03\x00\x01x\x01")
    st.append(PUBLISH, 9, p9[:2], memoryview(p9)[2:])
    st.append(UNSUBSCRIBE, 1, memoryview(b"\xa2\x05\x00\x01"), bytearray(b"\x00\x01y"))
    e = raises(ValueError, st.append, PUBLISH, 7, b"\x30", b"")
    assert "7" in str(e)
    recs = [
        (7, PUBLISH, p7),
        (3, SUBSCRIBE, b"\x82\x06\x00\x03\x00\x01x\x01"),
        (9, PUBLISH, p9),
        (1, UNSUBSCRIBE, b"\xa2\x05\x00\x01\x00\x01y"),
    ]
    expect(st, recs, (), (), {}, 1)
    # partial reads
    buf = bytearray(10)
    assert st.read(9, 250, buf) == 10 and buf == p9[250:260]
    assert st.read(9, 295, buf) == 5 and buf[:5] == p9[295:300]
    assert st.read(9, 300, buf) == 0
    assert not st.has(8) and not st.has(0)
    for f in (st.kind, st.marked, st.size, st.mark, st.unmark):
        raises(KeyError, f, 8)
    raises(KeyError, st.read, 8, 0, buf)
    # marks: mark, unmark, mark again (QoS 2 PUBREC seen twice across sessions)
    st.mark(9)
    st.mark(9)
    st.mark(7)
    st.unmark(7)
    st.unmark(3)  # unmarked already: nothing
    st.mark(1)
    st.unmark(1)
    st.mark(1)
    expect(st, recs, (9, 1), (), {}, 1)
    # releases
    st.release(3)
    st.release(3)
    st.release(12345)
    del recs[1]
    # inbound ids and meta
    st.in_add(5)
    st.in_add(6)
    st.in_add(5)
    st.in_release(5)
    st.in_release(11)
    st.in_add(12)
    st.set_meta("client", b"dev-1")
    st.set_meta("proto", bytearray(b"\x05"))
    st.set_meta("client", b"dev-2")
    st.set_meta("subs", b"")
    meta = {"client": b"dev-2", "proto": b"\x05", "subs": b"", "nothing": None}
    st.commit()
    expect(st, recs, (9, 1), (6, 12), meta, 1)
    if not b.durable:
        st.close()
        return
    st = b.reopen(st)
    expect(st, recs, (9, 1), (6, 12), meta, 1)
    # identifiers advance: the newest appended, even when released
    st.append(PUBLISH, 2, b"\x30\x03", b"\x00\x01z")
    st.release(2)
    st.unmark(9)
    st.in_clear()
    st.in_add(4)
    st.commit()
    expect(st, recs, (1,), (4,), meta, 2)
    st = b.reopen(st)
    expect(st, recs, (1,), (4,), meta, 2)
    st.mark(9)
    st.append(PUBLISH, 5, b"\x30\x01", b"q")
    for pid in (7, 9, 1, 5):
        st.release(pid)
    st.in_release(4)
    st.commit()
    expect(st, [], (), (), meta, 5)
    st = b.reopen(st)
    expect(st, [], (), (), meta, 5)
    st.close()


def test_contract_memory():
    check_contract(MemoryBackend())


def test_memory_has_across_the_pid_wrap():
    # MemoryStore.has() answers a new pid without a search while the pid lies
    # beyond the span of live ids: records held while the ids wrap round past
    # them must still be found (and skipped, as the session's allocator does),
    # and once released, not.
    st = MemoryStore().open()
    st.append(PUBLISH, 5, b"\x32\x03", b"\x00\x01a")
    last = 5
    skipped = []
    for _ in range(65535 + 100):
        last = p = last % 65535 + 1
        if st.has(p):
            skipped.append(p)
            continue
        st.append(PUBLISH, p, b"\x32\x03", b"\x00\x01b")
        if p != 9:  # 9 is held too, behind 5, and released out of order below
            st.release(p)
    assert skipped == [5, 9], skipped
    assert st.pending() == [5, 9] and st.has(5) and st.has(9)
    st.release(9)
    assert st.pending() == [5] and not st.has(9) and st.has(5)
    st.release(5)
    assert st.pending() == [] and not st.has(5) and st.count() == 0
    st.append(PUBLISH, 5, b"\x32\x03", b"\x00\x01c")
    buf = bytearray(8)
    assert st.read(5, 0, buf) == 5 and buf[:5] == b"\x32\x03\x00\x01c"
    raises(ValueError, st.append, PUBLISH, 5, b"\x30", b"")


def test_contract_flash_in_place_acks():
    check_contract(FlashBackend())


def test_contract_flash_appended_acks():
    check_contract(FlashBackend(append_acks=True))


def test_contract_flash_group_commit():
    check_contract(FlashBackend(group_commit=True))


def test_contract_file_posix():
    check_contract(PosixBackend())


def test_contract_file_posix_group_commit():
    check_contract(PosixBackend(group_commit=True, segment_bytes=512))


def test_contract_file_littlefs_on_nor():
    check_contract(LfsBackend())


def test_contract_across_many_reclaims():
    """The same contract on a tiny flash whose log wraps many times in between."""
    for opts in ({}, {"append_acks": True}):
        b = FlashBackend(blocks=4, **opts)
        try:
            st = b.new()
            for i in range(200):  # ~5 trips round the 4 sectors
                st.append(PUBLISH, 100 + i, b"\x32\x40", b"p" * 62)
                st.release(100 + i)
            st = b.reopen(st)
            assert st.pending() == [] and st.last_pid() == 299
            st.close()
        finally:
            b.cleanup()
