"""Emulated NOR flash: a file-backed block device with real NOR semantics.

One implementation for the MicroPython unix port and CPython. It speaks
MicroPython's extended block protocol, so `vfs.VfsLfs2`, the FlashStore and
anything else written for `esp32.Partition` / `rp2.Flash` run on it unchanged:

    readblocks(block, buf, offset=0)
    writeblocks(block, buf, offset=0)   program only: new = old AND buf
    ioctl(op, arg)                      1 init, 2 deinit, 3 sync, 4 block count,
                                        5 block size, 6 erase block (-> 0xFF)

NOR rules enforced: a program can only clear bits. Asking for a 1 where the
flash holds a 0 raises `NorViolation` (on real flash the bit would silently
stay 0 and the data would be wrong). Erase sets a whole block to 0xFF.

Power cut: `cut_at=N` makes the N-th flash operation (program or erase,
counted from 1 for this device object) a torn one -- a program leaves an
arbitrary prefix, or an arbitrary subset of the bits it meant to clear; an
erase leaves the block part erased and part old, or with random bits set --
chosen by a seeded RNG, and then raises `PowerCut`. The device is dead from
then on: every call raises `PowerCut`. To "reboot", open a new NorFlash on the
same file. Every operation is written through to the image file before it
returns, so a process killed at any point leaves the true flash contents.

Counters (bytes programmed, program operations, erases per block) are kept in
`<image>.wear` beside the image, updated on every operation and carried across
reopenings; `read_wear(path)` reads them from a host after the process died.
Reads are counted per device object (`reads`, `bytes_read`) but not persisted.

`path=None` gives a RAM-only device with the same semantics (no persistence).
"""

import os
import sys

# CPython's files are buffered: flush() hands the bytes to the OS (no fsync).
# MicroPython's are not, and its flush() is an fsync: not needed to survive a
# killed process, and very slow.
_FLUSH = sys.implementation.name != "micropython"

try:
    from array import array
except ImportError:  # pragma: no cover
    array = None

_WEAR_MAGIC = b"NORW"
_WEAR_HDR = 24  # magic(4) blocks(4) programs(8) bytes(8); then u32 erases per block

# ioctl operations of the MicroPython block protocol.
IOCTL_INIT = 1
IOCTL_DEINIT = 2
IOCTL_SYNC = 3
IOCTL_BLOCK_COUNT = 4
IOCTL_BLOCK_SIZE = 5
IOCTL_BLOCK_ERASE = 6


class NorViolation(Exception):
    """A program tried to turn a 0 bit back into 1 (only erase can do that)."""


class PowerCut(Exception):
    """The emulated power failed; this device object is dead."""


def _exists(path):
    try:
        os.stat(path)
        return True
    except OSError:
        return False


def _put_u(buf, off, value, n):
    for i in range(n):
        buf[off + i] = value & 0xFF
        value >>= 8


def _get_u(buf, off, n):
    v = 0
    for i in range(n - 1, -1, -1):
        v = (v << 8) | buf[off + i]
    return v


def read_wear(path):
    """The persisted counters of the image at `path`, as a dict (host side)."""
    with open(path + ".wear", "rb") as f:
        raw = f.read()
    if raw[:4] != _WEAR_MAGIC:
        raise ValueError("%s.wear: not a wear counter file" % path)
    blocks = _get_u(raw, 4, 4)
    erases = [_get_u(raw, _WEAR_HDR + 4 * i, 4) for i in range(blocks)]
    return {
        "blocks": blocks,
        "programs": _get_u(raw, 8, 8),
        "bytes_programmed": _get_u(raw, 16, 8),
        "erases": erases,
        "erases_total": sum(erases),
    }


class NorFlash:
    """The NOR rules, counters, wear file and torn writes, on a RAM mirror of the image. The rules
    are written once, here: a subclass keeping the image elsewhere (emuboard's Flash: the file only)
    replaces the storage primitives alone (_read, _check_program, _store_program, _store_erase,
    _chunk, _put)."""

    def __init__(self, path=None, blocks=64, block_size=4096, cut_at=0, seed=1, fresh=False):
        if blocks < 1 or block_size < 64 or block_size & (block_size - 1):
            raise ValueError("bad flash geometry")
        self._setup(path, blocks, block_size, cut_at, seed)
        self.mem = bytearray(self.size)
        self._mv = memoryview(self.mem)
        self._blank = bytearray(block_size)
        for i in range(block_size):
            self._blank[i] = 0xFF
        if path is None:
            for b in range(blocks):
                self.mem[b * block_size : (b + 1) * block_size] = self._blank
            return
        if fresh or not _exists(path):
            self._create()
        self._f = open(path, "r+b")
        if self._f.readinto(self.mem) != self.size:
            self._f.close()
            raise ValueError("%s: image is not %d bytes" % (path, self.size))
        self._load_wear()

    def _setup(self, path, blocks, block_size, cut_at, seed):
        """The state every flash has, whatever holds its bytes."""
        self.path = path
        self.blocks = blocks
        self.block_size = block_size
        self.size = blocks * block_size
        self.cut_at = cut_at  # 0: never
        self.ops = 0  # program + erase operations by this object
        self.dead = False
        self.torn = None  # description of the torn operation, once cut
        self._off = PowerCut("flash is powered off")
        self._rng = ((seed * 2654435761) & 0xFFFFFFFF) or 1
        for _ in range(8):  # small seeds: mix before use
            self._rand()
        self.reads = 0
        self.bytes_read = 0
        self._wbuf = bytearray(16)
        self.erase_counts = array("I", [0] * blocks)
        self.programs = 0
        self.bytes_programmed = 0
        self._f = None
        self._wf = None

    # -- image and counter files ------------------------------------------
    def _create(self):
        blank = self._blank
        with open(self.path, "wb") as f:
            for _ in range(self.blocks):
                f.write(blank)
        hdr = bytearray(_WEAR_HDR + 4 * self.blocks)
        hdr[0:4] = _WEAR_MAGIC
        _put_u(hdr, 4, self.blocks, 4)
        with open(self.path + ".wear", "wb") as f:
            f.write(hdr)

    def _load_wear(self):
        p = self.path + ".wear"
        if not _exists(p):
            hdr = bytearray(_WEAR_HDR + 4 * self.blocks)
            hdr[0:4] = _WEAR_MAGIC
            _put_u(hdr, 4, self.blocks, 4)
            with open(p, "wb") as f:
                f.write(hdr)
        self._wf = open(p, "r+b")
        raw = bytearray(_WEAR_HDR + 4 * self.blocks)
        n = self._wf.readinto(raw)
        if n != len(raw) or raw[0:4] != _WEAR_MAGIC or _get_u(raw, 4, 4) != self.blocks:
            raise ValueError("%s: wear counters do not match the image" % p)
        self.programs = _get_u(raw, 8, 8)
        self.bytes_programmed = _get_u(raw, 16, 8)
        for i in range(self.blocks):
            self.erase_counts[i] = _get_u(raw, _WEAR_HDR + 4 * i, 4)

    def _persist_program(self, pos, buf, n):
        if self._f is None:
            return
        self._f.seek(pos)
        self._f.write(buf if n == len(buf) else memoryview(buf)[:n])
        self._persist_counts()

    def _persist_block(self, block):
        if self._f is None:
            return
        bs = self.block_size
        self._f.seek(block * bs)
        self._f.write(memoryview(self.mem)[block * bs : (block + 1) * bs])
        self._persist_erase(block)

    def _persist_counts(self):
        if self._wf is None:
            return
        wb = self._wbuf
        _put_u(wb, 0, self.programs, 8)
        _put_u(wb, 8, self.bytes_programmed, 8)
        self._wf.seek(8)
        self._wf.write(wb)
        self._flush()

    def _persist_erase(self, block):
        if self._wf is None:
            return
        wb = self._wbuf
        _put_u(wb, 0, self.erase_counts[block], 4)
        self._wf.seek(_WEAR_HDR + 4 * block)
        self._wf.write(memoryview(wb)[0:4])
        self._flush()

    def _flush(self):
        if _FLUSH:
            self._f.flush()
            self._wf.flush()

    # -- storage primitives: the torn writes below work through these, so a
    # subclass keeping the image elsewhere (emuboard's Flash: the file only)
    # tears exactly as this one does
    _CHUNK = 4096

    def _chunk(self, pos, k):
        """A writable view of the k flash bytes at pos (k <= _CHUNK)."""
        return self._mv[pos : pos + k]

    def _put(self, pos, v):
        """Make the bytes of view v (from _chunk(pos, ...), changed) the flash's."""
        if self._f is not None:
            self._f.seek(pos)
            self._f.write(v)

    # -- helpers ------------------------------------------------------------
    def _rand(self):
        s = self._rng
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        self._rng = s
        return s

    def _alive(self):
        if self.dead:
            if _FLUSH:  # CPython: a fresh exception (a reused one grows its traceback)
                raise PowerCut("flash is powered off")
            # MicroPython: preallocated, as a finaliser may touch the flash while the heap is locked
            raise self._off

    def _pos(self, block, offset, n):
        if block < 0 or block >= self.blocks or offset < 0:
            raise ValueError("block %d offset %d out of range" % (block, offset))
        pos = block * self.block_size + offset
        if pos + n > self.size:
            raise ValueError("access past the end of the flash")
        return pos

    def _violation(self, at, had, b):
        raise NorViolation("program would set bits at 0x%x: flash holds 0x%02x, data 0x%02x" % (at, had, b))

    def _tick(self):
        """Count one program/erase; True if this is the operation to tear."""
        self.ops += 1
        return self.cut_at and self.ops >= self.cut_at

    # -- storage primitives of the RAM mirror ---------------------------------
    def _read(self, pos, buf, n):
        if n <= 16:
            mem = self.mem
            for i in range(n):
                buf[i] = mem[pos + i]
        else:
            buf[0:n] = self._mv[pos : pos + n]

    def _check_program(self, pos, buf, n):
        mem = self.mem
        if n <= 256:  # small programs (records, status bytes): no allocation
            for i in range(n):
                b = buf[i]
                if mem[pos + i] & b != b:
                    self._violation(pos + i, mem[pos + i], b)
            return
        new = int.from_bytes(buf, "big")
        if int.from_bytes(self._mv[pos : pos + n], "big") & new != new:
            for i in range(n):
                if mem[pos + i] & buf[i] != buf[i]:
                    self._violation(pos + i, mem[pos + i], buf[i])

    def _store_program(self, pos, buf, n):
        self.mem[pos : pos + n] = buf
        self._persist_program(pos, buf, n)

    def _store_erase(self, block, pos):
        self.mem[pos : pos + self.block_size] = self._blank
        self._persist_block(block)

    # -- block protocol: the NOR rules --------------------------------------
    def readblocks(self, block, buf, offset=0):
        self._alive()
        n = len(buf)
        self._read(self._pos(block, offset, n), buf, n)
        self.reads += 1
        self.bytes_read += n
        return 0

    def writeblocks(self, block, buf, offset=0):
        self._alive()
        n = len(buf)
        pos = self._pos(block, offset, n)
        self._check_program(pos, buf, n)  # a program can only clear bits
        if self._tick():
            self._torn_program(pos, buf, n)  # ends in _die(): PowerCut, or the process is killed
        self.programs += 1
        self.bytes_programmed += n
        self._store_program(pos, buf, n)  # buf clears only set bits (checked): old AND buf is buf itself
        return 0

    def ioctl(self, op, arg=0):
        if op == IOCTL_BLOCK_COUNT:
            return self.blocks
        if op == IOCTL_BLOCK_SIZE:
            return self.block_size
        self._alive()
        if op == IOCTL_INIT or op == IOCTL_DEINIT:
            return 0
        if op == IOCTL_SYNC:
            if self._f is not None and _FLUSH:
                self._f.flush()
            return 0
        if op == IOCTL_BLOCK_ERASE:
            self.erase(arg)
            return 0
        return None

    def erase(self, block):
        self._alive()
        pos = self._pos(block, 0, self.block_size)
        if self._tick():
            self._torn_erase(block, pos)
        self.erase_counts[block] += 1
        self._store_erase(block, pos)
        return 0

    # -- power cuts ---------------------------------------------------------
    def _torn_program(self, pos, buf, n):
        # A strict prefix (maybe nothing) or a random subset of the bits to clear.
        prefix = n and self._rand() & 1
        k = self._rand() % n if prefix else 0
        c = self._CHUNK
        i = 0
        while i < n:
            m = min(c, n - i)
            v = self._chunk(pos + i, m)
            for j in range(m):
                if not prefix:
                    v[j] &= buf[i + j] | (self._rand() & 0xFF)
                elif i + j < k:
                    v[j] &= buf[i + j]
            self._put(pos + i, v)
            i += m
        self.torn = ("program-prefix", pos, n, k) if prefix else ("program-bits", pos, n)
        self.programs += 1
        self.bytes_programmed += n
        self._persist_counts()
        self._die()

    def _torn_erase(self, block, pos):
        # The start erased and the rest old, the other way round, or weakly
        # erased (random bits back to 1).
        bs = self.block_size
        mode = self._rand() % 3
        lo = hi = 0
        if mode == 0:
            hi = 1 + self._rand() % (bs - 1)
        elif mode == 1:
            lo = 1 + self._rand() % (bs - 1)
            hi = bs
        c = min(self._CHUNK, bs)
        for i in range(0, bs, c):
            v = self._chunk(pos + i, c)
            for j in range(c):
                if mode == 2:
                    v[j] |= self._rand() & 0xFF
                elif lo <= i + j < hi:
                    v[j] = 0xFF
            self._put(pos + i, v)
        self.torn = ("erase", block, mode)
        self.erase_counts[block] += 1
        self._persist_erase(block)
        self._die()

    def _die(self):
        self.dead = True
        raise PowerCut("power cut at flash operation %d" % self.ops)

    # -- inspection -----------------------------------------------------------
    def counters(self):
        return {
            "programs": self.programs,
            "bytes_programmed": self.bytes_programmed,
            "erases": list(self.erase_counts),
            "erases_total": sum(self.erase_counts),
            "reads": self.reads,
            "bytes_read": self.bytes_read,
            "ops": self.ops,
        }

    def close(self):
        for f in (self._f, self._wf):
            if f is not None:
                f.close()
        self._f = self._wf = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
