"""FileStore after a transient ENOSPC from the filesystem (issue 25, defect 4).

The filesystem fills from elsewhere for a while: a sync fails, the store boots
again from what is durable, and the new segment it opens cannot be created
either. Once the filesystem has room again the store must go on as before:
every append taken, old segments collected, nothing "outbox full" with nothing
pending. (Before the fix the reopen listed the new segment before its file
existed: garbage collection stopped at that name for good.)
"""

from check import raises
from storekit import rmtree, tmppath
from tern.filestore import FileStore, OsFs
from tern.store import PUBLISH

ENOSPC = 28


class FillingFs(OsFs):
    """The real filesystem, full while `full` is set: no file created, no byte written or synced."""

    full = False

    def open(self, path, mode):
        if "w" not in mode:
            return OsFs.open(self, path, mode)
        if self.full:
            raise OSError(ENOSPC, "no space left on device")
        return FillingFile(self, OsFs.open(self, path, mode))

    def sync_file(self, f):
        if self.full:
            raise OSError(ENOSPC, "no space left on device")
        OsFs.sync_file(self, f.f)


class FillingFile:
    def __init__(self, fs, f):
        self.fs = fs
        self.f = f

    def write(self, b):
        if self.fs.full:
            raise OSError(ENOSPC, "no space left on device")
        return self.f.write(b)

    def close(self):
        self.f.close()


def run_after_full(group):
    p = tmppath("enospc")
    fs = FillingFs()
    try:
        st = FileStore(p, fs=fs, segment_bytes=512, max_segments=3, max_bytes=100000, verbose=False,
                       group_commit=group).open()
        pid = 0
        for _ in range(6):
            pid += 1
            st.append(PUBLISH, pid, b"\x32\x4e", bytes(100))
            st.commit()
        fs.full = True
        for _ in range(3):  # the filesystem stays full for a few attempts
            pid += 1
            e = raises(OSError, lambda: (st.append(PUBLISH, pid, b"\x32\x4e", bytes(100)), st.commit()))
            assert e.args[0] == ENOSPC, repr(e)
        fs.full = False
        live = st.pending()
        assert live == [1, 2, 3, 4, 5, 6], live  # what was durable before the filesystem filled
        for p0 in live:
            st.release(p0)
        # Room again: a long run of messages, each acknowledged, must never find the outbox full.
        for i in range(300):
            pid += 1
            st.append(PUBLISH, pid, b"\x32\x4e", bytes(100))
            st.commit()
            st.release(pid)
        assert st.pending() == [] and st.count() == 0
        names = [n for n in fs.listdir(p) if n.endswith(".seg")]
        assert len(names) <= 4, "segments not collected after the filesystem had room: %r" % names
        st.close()
        st = FileStore(p, fs=fs, verbose=False).open()
        assert st.pending() == [], st.pending()
        st.close()
    finally:
        rmtree(p)


def test_filestore_goes_on_after_a_transient_enospc():
    run_after_full(False)


def test_filestore_group_commit_goes_on_after_a_transient_enospc():
    run_after_full(True)
