"""Storage that fails and returns (issue 35): a NOR flash and a filesystem layer whose operations
raise OSError when told to, and go on working after. Not a test module: the test kit's rigs
(tests/lib/kit.py), the model (tests/lib/model.py), the store-level fault tests (test_store_faults.py)
and tools/store_sweep.py use it, on CPython and the MicroPython unix port alike; imported as
tests.lib.faults.

A Fault is armed for the k-th next operation of a kind ("write": a flash program or a file write;
"sync": a file or directory sync; "erase"; "create": a file opened for writing; "remove"; "any"),
failing before any byte lands, after all of them did, or torn (part of them), for `times`
operations in a row (-1: until heal()). Power cuts stay the media's own (NorFlash cut_at, CutFs).
"""

from cutfs import ShimFile
from norflash import NorFlash, PowerCut

from .check import Rng

BEFORE = 0
AFTER = 1
TORN = 2
RANDOM = 3  # each failure draws one of the three
WHEN = ("before", "after", "torn", "random")
KINDS = ("any", "write", "sync", "erase", "create", "remove")
EIO = 5
ENOSPC = 28


class Fault:
    """What fails next, and a count of what did."""

    def __init__(self, seed=1):
        self.rng = Rng(seed * 104729 + 7)
        self.kind = "any"
        self.when = BEFORE
        self.at = 0  # operations of the kind to let pass (1: the next fails); 0: not armed
        self.times = 0
        self.errno = EIO
        self.fired = 0  # failures so far
        self.ops = 0  # operations seen (every kind)

    def arm(self, kind, when, k, times=1, errno=EIO):
        self.kind, self.when, self.at, self.times, self.errno = kind, when, max(k, 1), times, errno

    def heal(self):
        self.at = 0

    def armed(self):
        return self.at > 0

    def hit(self, kind):
        """How this operation fails (BEFORE, AFTER, TORN), or -1: it does not."""
        self.ops += 1
        if not self.at or (self.kind != "any" and self.kind != kind):
            return -1
        if self.at > 1:
            self.at -= 1
            return -1
        self.fired += 1
        if self.times > 0:
            self.times -= 1
            if not self.times:
                self.at = 0
        return self.rng.below(3) if self.when == RANDOM else self.when

    def error(self, what):
        return OSError(self.errno, "injected %s failure" % what)


class FaultFlash(NorFlash):
    """NorFlash whose programs and erases fail as its Fault says (a torn one leaves a random
    prefix or subset of the bits, as a power cut does, and the flash goes on)."""

    def __init__(self, *args, **kw):
        self.fault = kw.pop("fault", None) or Fault()
        NorFlash.__init__(self, *args, **kw)

    def writeblocks(self, block, buf, offset=0):
        w = self.fault.hit("write")
        if w < 0:
            return NorFlash.writeblocks(self, block, buf, offset)
        self._alive()
        if w == AFTER:
            NorFlash.writeblocks(self, block, buf, offset)
        elif w == TORN:
            n = len(buf)
            pos = self._pos(block, offset, n)
            self._check_program(pos, buf, n)
            if self._tick():  # (a power cut due here comes first)
                self._torn_program(pos, buf, n)
            self._survive(self._torn_program, pos, buf, n)
        raise self.fault.error("program")

    def ioctl(self, op, arg=0):
        if op != 6:
            return NorFlash.ioctl(self, op, arg)
        w = self.fault.hit("erase")
        if w < 0:
            return NorFlash.ioctl(self, op, arg)
        self._alive()
        if w == AFTER:
            NorFlash.ioctl(self, op, arg)
        elif w == TORN:
            pos = self._pos(arg, 0, self.block_size)
            if self._tick():
                self._torn_erase(arg, pos)
            self._survive(self._torn_erase, arg, pos)
        raise self.fault.error("erase")

    def _survive(self, torn, *args):
        # NorFlash's torn operation, without the power cut that ends it
        try:
            torn(*args)
        except PowerCut:
            self.dead = False


class FaultFile(ShimFile):
    """A file of a FaultFs: writes fail as the fault says; the rest passes through."""

    def __init__(self, ffs, f):  # (over an open file, not ShimFile's path)
        self.ffs = ffs
        self.f = f

    def write(self, b):
        w = self.ffs.fault.hit("write")
        if w < 0:
            return self.f.write(b)
        if w == AFTER:
            self.f.write(b)
        elif w == TORN and len(b) > 1:
            self.f.write(bytes(b[: 1 + self.ffs.fault.rng.below(len(b) - 1)]))
        raise self.ffs.fault.error("write")

    def flush(self):
        return self.f.flush()

    def close(self):
        try:
            self.f.close()
        except Exception:
            # littlefs-python leaves a handle whose close raised open in Python's eyes although
            # LittleFS let it go; closed again by the collector, LittleFS asserts (the process dies)
            raw = getattr(self.f, "raw", None)
            if raw is not None:
                setattr(raw, "__IOBase_closed", True)
            raise


class FaultFs:
    """A complete FileStore filesystem layer (open, listdir, remove, mkdir, statvfs, sync_file,
    sync_dir) over `inner`, one too, whose writes, syncs, creates and removes fail as the fault
    says. A torn sync makes part of what waited durable where the inner layer can say so
    (torn_sync), else all or nothing."""

    def __init__(self, inner, fault=None):
        self.inner = inner
        self.fault = fault or Fault()

    def open(self, path, mode):
        if "w" in mode:
            w = self.fault.hit("create")
            if w >= 0:
                if w != BEFORE:
                    self.inner.open(path, mode).close()
                raise self.fault.error("create")
        f = self.inner.open(path, mode)
        return FaultFile(self, f) if ("w" in mode or "+" in mode or "a" in mode) else f

    def listdir(self, path):
        return self.inner.listdir(path)

    def mkdir(self, path):
        self.inner.mkdir(path)

    def statvfs(self, path):
        return self.inner.statvfs(path)

    def remove(self, path):
        w = self.fault.hit("remove")
        if w < 0 or w != BEFORE:
            self.inner.remove(path)
        if w >= 0:
            raise self.fault.error("remove")

    def sync_file(self, f):
        w = self.fault.hit("sync")
        if w < 0 or w == AFTER:
            self.inner.sync_file(f.f)
        elif w == TORN:
            torn = getattr(self.inner, "torn_sync", None)
            if torn is not None:
                torn(f.f, self.fault.rng.below)
            elif self.fault.rng.below(2):
                self.inner.sync_file(f.f)
        if w >= 0:
            raise self.fault.error("sync")

    def sync_dir(self, path):
        w = self.fault.hit("sync")
        if w < 0 or w != BEFORE:
            self.inner.sync_dir(path)
        if w >= 0:
            raise self.fault.error("directory sync")
