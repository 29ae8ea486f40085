"""FlashStore: the session store as a circular log on a raw flash partition.

Over 600 lines because (and over the 1,000 the project allows a lib module, by choice) the append
path, the reclaim of old sectors and the recovery scan work on the same window buffer, sector
tables and index, and the scan runs at every open: a module of its own would put one more module
and class on a board's heap for code every boot loads anyway. A fifth of the lines are the
format's description and comments.

The block device speaks MicroPython's extended block protocol (esp32.Partition,
rp2.Flash, firmware/emulated/norflash.py): readblocks(b, buf, off),
writeblocks(b, buf, off) programs only (bits 1 -> 0), ioctl(6, b) erases.
It keeps the contract of lib/tern/store.py across power loss at any flash
operation. Layout (all integers little-endian):

Sector (one erase block) header, 32 bytes:
    0 magic b"TnF1"  4 version  5 flags (bit0: written in appended-ack mode)
    6 log2 of the block size  8 sector sequence  12 floor (sectors with a
    lower sequence are void)  16 next record sequence  20 last packet id
    22 block count  24 CRC-32 of bytes 0..23
    28 retired byte (0x00: nothing in this sector is live; in-place mode only)
A valid header of another version or geometry (6 and 22 read 0xFF in images
from before they were written: not checked) makes open() raise FlashCorrupt
naming both: nothing is erased.

Record, 8-byte aligned, never crossing a sector:
    0 type  1 flags  2 body length  4 record sequence  8 packet id
    10 header check (CRC-32 of the header, seeded with the record's address,
       low 16 bits: a scanner can trust the length, and a copy of a record
       inside some payload never passes for a record)
    12 S0 mark (QoS 2 PUBREC seen)  13 S1 status (released)  14, 15 more mark
       bytes: the mark state is F_MARKED toggled by each of 12, 14, 15 set,
       so mark and unmark program a byte in place (then append an OP)
    16 body  then CRC-32 over header (status bytes read as 0xFF) and body.
A status byte counts as set when at least half its bits are 0: a torn
one-byte program reads either way (the call never returned), a flipped bit
never changes a state.

Flags: F_RELOC (a copy made by reclaim), F_MARKED (its mark state then),
F_RENUM (a stale record's copy under a fresh sequence: see logrec). Sector
and record sequences are 32-bit and wrap (a sector's is never 0, which
means free); both are compared as serial numbers.

Types: the packet types PUBLISH/SUBSCRIBE/UNSUBSCRIBE (body = the packet),
INID (inbound QoS 2 id), META (body = key length, key, value), OP (appended
ack: flags = MARK/UNMARK/RELEASE/INREL, sequence/pid = its target), INCLEAR
(every inbound id before it is void), FLOOR (sequence field = new floor).

Write-ahead and recovery:
- append programs the record; mark/unmark/release program a status byte in
  place (or append an OP record when `append_acks=True`, for flash that cannot
  be re-programmed, or when the three mark bytes are used up); in_clear
  appends INCLEAR. Only live records count against the capacity, which keeps
  24 bytes a sector in hand: an ack never fails for room on a full store; a
  message also leaves 640 bytes for inbound QoS 2 ids and meta records, an
  inbound id 64 of them for meta, and a meta value counts as replacing the
  old one.
- reclaim: when only one free sector is left, the live records of the oldest
  sector are copied into the head (same record sequence, current mark state
  in the flags), a FLOOR record voids the oldest sector, then it is erased.
  The head keeps room for that copy, so reclaim never needs another sector.
  A torn erase leaves a sector below the floor: void whatever it contains.
- boot reads every sector header (the partition size bounds the work, not the
  history), orders valid sectors by sequence, skips void and retired ones,
  scans the rest record by record; a record with a bad CRC is skipped with a
  warning; a bad header makes the scan look for the next valid record in the
  sector; the newest copy of a record (by sequence) wins. If the head sector
  does not end cleanly (torn tail), it is never appended to again.
- RAM: 8 bytes per pending message (pid, address with kind and mark bits,
  record size), a few bytes per sector, fixed buffers. The boot scan builds
  that index in place (4 bytes more per entry while it runs: the record
  sequence), so nothing it keeps is spread over the heap between the scan's
  garbage; reserve() before open() sizes it once.
"""

from binascii import crc32
from struct import pack_into

from .wire import const, PUBLISH, SUBSCRIBE, UNSUBSCRIBE
from .logrec import (
    RH as _RH,
    T_INID,
    T_META,
    T_OP,
    T_INCLEAR,
    T_FLOOR,
    F_RELOC,
    F_MARKED,
    F_RENUM,
    STALE as _STALE,
    sd as _sd,
    OP_MARK,
    OP_UNMARK,
    OP_RELEASE,
    OP_INREL,
    KINDS as _KINDS,
    Log,
    OutboxUnknown,  # noqa: F401  (an app that uses FlashStore finds it here)
    u16 as _u16,
    u32 as _u32,
    put32 as _put32,
    hcrc,
    make_header,
)

try:
    from array import array
except ImportError:  # pragma: no cover
    from uarray import array

_MAGIC = b"TnF1"
_VERSION = const(1)
_SH = const(32)  # sector header bytes
_FLOOR_SZ = const(24)  # a record with no body
_KEEP = const(640)  # what a message leaves free: inbound QoS 2 ids and meta (the boot counter) on a full outbox
_MKEEP = const(64)  # what an inbound QoS 2 id leaves of it: a meta value
_WIN = const(512)
_SMALL = const(24)  # _rsize(0): a body-less record (OP, INID, INCLEAR)
_FF8 = b"\xff" * 8
try:  # CPython's struct packs bytes only ("s"); MicroPython's any buffer, as _write needs
    pack_into("<1s", bytearray(1), 0, memoryview(_FF8))
    _bs = None
except Exception:  # pragma: no cover - CPython
    _bs = bytes
_CHUNK = const(64)  # index growth step (entries)
ENOSPC = const(28)


def _inc(q):
    """The sector sequence after q: 32-bit, never 0 (0 = a free sector, no floor)."""
    return (q + 1) & 0xFFFFFFFF or 1


def _rsize(n):
    return (_RH + n + 4 + 7) & ~7


def _isset(b):
    # at least 4 of the 8 bits are 0
    v = b - ((b >> 1) & 0x55)
    v = (v & 0x33) + ((v >> 2) & 0x33)
    return ((v + (v >> 4)) & 0x0F) <= 4


def _grow(a, code, size, n):
    """a copied into a zeroed array of n items of size bytes (from bytes:
    no list of n objects on the way)."""
    b = array(code, bytes(size * n))
    for i in range(len(a)):
        b[i] = a[i]
    return b


class FlashCorrupt(Exception):
    """The partition cannot be used (wrong geometry)."""


class FlashStore(Log):
    _tag = "tern.flashstore: "

    def __init__(self, dev, append_acks=False, group_commit=False, group_bytes=512, verbose=True):
        self.dev = dev
        self.append_acks = bool(append_acks)
        self.group = bool(group_commit)
        self.verbose = verbose
        bs = dev.ioctl(5, 0)
        n = dev.ioctl(4, 0)
        if not bs or bs & (bs - 1) or bs < 256 or bs > 65536:
            raise FlashCorrupt("block size %r unsupported" % (bs,))
        if not n or n < 3:
            raise FlashCorrupt("a FlashStore needs at least 3 erase blocks, got %r" % (n,))
        self.bs = bs
        self.nsec = n
        sh = 0
        while (1 << sh) < bs:
            sh += 1
        self._shift = sh
        self._mask = bs - 1
        self._limit = bs - _FLOOR_SZ  # normal records end here; a FLOOR may use the rest
        self._maxrec = self._limit - _SH
        self._cap = (n - 2) * (self._maxrec - _FLOOR_SZ)  # live bytes at most (see _alloc)
        # per sector
        self._sseq = array("I", [0] * n)  # sequence of a data sector, 0 = free
        self._live = array("H", [0] * n)  # live record bytes
        self._pin = bytearray(n)  # holds OP/INCLEAR records: never retire
        self._ret = bytearray(n)  # retired
        self._blank = bytearray(n)  # known to be erased
        # buffers
        self._hdr = bytearray(_RH)
        self._sh = bytearray(_SH)
        self._crcb = bytearray(4)
        self._zero = bytearray(1)
        self._win = bytearray(_WIN)
        self._winmv = memoryview(self._win)
        self._smv = self._winmv[0:_SMALL]  # a body-less record, staged (see _write)
        self._hmv = self._winmv[0:_RH]  # a record header, staged
        self._fk = -1  # _write's last record format: its key and the format
        self._ra = 0  # the room _alloc took last, and its size
        self._rs = 0
        self._fmt = None
        self._stmv = self._smv
        self._stsz = _SMALL
        self._wa = 0
        self._wl = 0
        self._gbuf = bytearray(group_bytes if self.group else 0)
        self._gmv = memoryview(self._gbuf)
        self._gaddr = 0
        self._glen = 0
        self.dirty = False  # records wait in the group buffer (see store.py: commit)
        # index of pending messages, in record-sequence order (pid 0 = hole)
        self._ipid = array("H", [0] * _CHUNK)
        self._iaddr = array("I", [0] * _CHUNK)  # address | kind code << 1 | marked
        self._isz = array("H", [0] * _CHUNK)  # record bytes on flash
        self._n = 0
        self._lo = 0
        self._count = 0
        # inbound QoS 2 ids
        self._inpid = array("H", [0] * 8)
        self._inaddr = array("I", [0] * 8)
        self._inn = 0
        self._meta = {}  # key bytes -> [value, address, record bytes]
        self._head = -1
        self._hseed = 0
        self._off = 0
        self._sealed = False
        self._nextseq = 1
        self._floor = 0
        self._rseq = 1
        self._last = 0
        self._opened = False
        self._nfree = -1  # caches
        self._old = -2
        self._total = 0
        self.stats = {}

    # ------------------------------------------------------------ low level
    def _prog(self, addr, buf):
        self._wl = 0
        self._blank[addr >> self._shift] = 0
        try:
            self.dev.writeblocks(addr >> self._shift, buf, addr & self._mask)
        except OSError:
            self._failed()
            raise

    def _read(self, addr, buf):
        self.dev.readblocks(addr >> self._shift, buf, addr & self._mask)

    def _erase(self, s):
        self._wl = 0
        self._blank[s] = 0
        try:
            self.dev.ioctl(6, s)
        except OSError:
            self._failed()
            raise
        self._blank[s] = 1

    def _zap(self, a):
        # Program the status byte at a to 0 (a release in place: the one write of release(),
        # whose own frame has no room for a try), in a frame of 11 words.
        try:
            self.dev.writeblocks(a >> self._shift, self._zero, a & self._mask)
        except OSError:
            self._failed()
            raise

    # ------------------------------------------------------------ failures
    # (lib/tern/store.py, "When storage fails".) A program or erase that raises OSError may have
    # done nothing, all or part of its work: the flash is read again as a boot reads it, which is
    # then what RAM says (and what any reboot would find); a record the failed call was writing
    # that landed anyway is voided, so that the call did not happen. Every program and erase goes
    # through _prog, _erase, _zap, _write or _gflush, which call _failed and raise the error again.

    def _failed(self, lo=0, n=0):
        """After a program or erase raised: the flash read again, and [lo, lo + n), the
        record(s) being written, left holding no message or inbound id. Raises OutboxUnknown when
        that could not be done; returns, and the caller raises its error, when it was (or when
        this is a failure while reading again: the outer call sees it)."""
        if self._opened and not self._busy:  # (not at open, nor while reading again)
            self._retry(lo, n)

    def _again(self, lo, n):
        # (Log._retry's work)
        self._rescan()
        if n and self._void(lo, n):
            self._gflush()
            self._rescan()

    def _void(self, lo, n):
        """Void the messages and inbound ids found in [lo, lo + n): their release byte, or an
        appended release (append_acks). True if there were any."""
        hit = False
        for i in range(self._lo, self._n):
            a = self._iaddr[i] & ~7
            if self._ipid[i] and lo <= a < lo + n:
                self._kill(a, OP_RELEASE, self._ipid[i])
                hit = True
        for i in range(self._inn):
            a = self._inaddr[i]
            if lo <= a < lo + n:
                self._kill(a, OP_INREL, self._inpid[i])
                hit = True
        return hit

    def _kill(self, a, op, pid):
        if self.append_acks:
            self._small(T_OP, op, pid)
        else:
            self._zero[0] = 0
            self._prog(a + 13, self._zero)

    def _set_unknown(self, e):
        # Nothing is written until the flash is read again: every write comes through _gflush
        # (which sees _glen < 0) or _alloc (which sees _total over the capacity) first.
        self._unk = e
        self._glen = -1
        self._total = self._cap + 1
        self.epoch += 1  # (RAM is not what the flash holds: the session follows once it is)
        self.dirty = True

    def _rescan(self):
        """RAM as a boot leaves it: what the flash holds (the group buffer is gone)."""
        self._opened = False
        self._glen = 0
        self._wl = 0
        self._meta = {}
        self._inn = 0
        self._n = self._lo = self._count = 0
        self._head = -1
        self._off = 0
        self._sealed = False
        self._total = 0
        for s in range(self.nsec):
            self._live[s] = 0
            self._pin[s] = 0
            self._ret[s] = 0
        self._load()

    def _at(self, addr, n):
        """Index into the read window of `n` bytes at `addr` (same sector)."""
        wa = self._wa
        if wa <= addr and addr + n <= wa + self._wl:
            return addr - wa
        ln = (addr | self._mask) + 1 - addr  # to the sector's end
        if ln > _WIN:
            ln = _WIN
        self._read(addr, self._win if ln == _WIN else self._winmv[0:ln])
        self._wa = addr
        self._wl = ln
        return 0

    def _seed(self, s, off):
        return (self._sseq[s] * 4099 + off) & 0xFFFFFFFF

    def _mkhdr(self, t, flags, ln, rseq, pid, addr):
        make_header(self._hdr, t, flags, ln, rseq, pid, self._seed(addr >> self._shift, addr & self._mask))

    # ------------------------------------------------------------ boot
    def open(self):
        if self._opened:  # recovered already (by the app, before the session opens it):
            return self  # a second scan would count every record twice
        # A write of the scan's (a repair) that fails leaves the state unknown rather than
        # raise: the first write or commit reads the flash again (a board does not boot-loop)
        try:
            self._load()
        except OSError as e:
            self._set_unknown(e)
        return self

    def _load(self):
        dev = self.dev
        n = self.nsec
        bs = self.bs
        sh = self._sh
        r0 = getattr(dev, "bytes_read", 0)
        valid = []
        bad = []
        heads = 0
        for s in range(n):
            self._read(s * bs, sh)
            heads += 1
            if sh[0:4] == _MAGIC and _u32(sh, 24) == (crc32(memoryview(sh)[0:24]) & 0xFFFFFFFF):
                # a valid header from another format or geometry: its records
                # cannot be read here, and erasing them would lose them
                if sh[4] != _VERSION:
                    raise FlashCorrupt("partition holds format %d, not %d" % (sh[4], _VERSION))
                if sh[6] != 0xFF and (sh[6] != self._shift or _u16(sh, 22) != n & 0xFFFF):
                    raise FlashCorrupt(
                        "partition written as %d blocks of %d, now %d blocks of %d: erase it to start afresh"
                        % (_u16(sh, 22), 1 << sh[6], n, bs)
                    )
                q = _u32(sh, 8)
                if q is not None:
                    valid.append((q, s))
                    self._ret[s] = 1 if sh[28] == 0 else 0
            elif sh[0] != 0xFF or sh[8] != 0xFF or sh[24] != 0xFF:
                bad.append(s)
        # sector sequences wrap: ordered as serial numbers from the newest
        # (all lie within a few turns of the partition of each other)
        top = valid[0][0] if valid else 0
        for q, s in valid:
            if _sd(q, top) > 0:
                top = q
        key = lambda e: (e[0] - top) & 0xFFFFFFFF ^ 0x80000000
        valid.sort(key=key)
        head = -1
        floor = 0
        if valid:
            head = valid[-1][1]
            self._read(head * bs, sh)
            floor = _u32(sh, 12)
            self._rseq = _u32(sh, 16)
            self._last = _u16(sh, 20)
            self._sseq[head] = valid[-1][0]
            floor = self._scan_floor(head, floor)
        rhead = False
        for s in bad:
            q = self._recover(s, valid, floor)
            if q:
                valid.append((q, s))
                valid.sort(key=key)
                self._ret[s] = 0
                if valid[-1][1] == s:  # it was the head: its floor may be higher
                    head = s
                    rhead = True
                    floor = self._scan_floor(s, floor)
        if valid:
            self._nextseq = _inc(valid[-1][0])
        self._floor = floor
        for s in range(n):
            self._sseq[s] = 0
        data = []
        for q, s in valid:
            if not floor or _sd(q, floor) >= 0:
                self._sseq[s] = q
                data.append(s)
        scanned = 0
        # the index is built in place, in record-sequence order (_iseq: each
        # entry's sequence, for the scan only); reserve() before open sizes it
        self._iseq = array("i", bytes(4 * len(self._ipid)))
        self._n = 0
        ins = {}
        repair = []
        # record sequences wrap: the scan works on each one's serial distance
        # from the head's next sequence (small integers: see STALE in logrec)
        self._ref = self._rseq
        self._rseq = 0
        self._bootlast = -1
        end = _SH
        for s in data:
            if self._ret[s] and s != head:
                continue
            scanned += 1
            end, torn = self._scan(s, ins, repair)
            if s == head:
                self._off = end
                self._sealed = torn
        if head >= 0:
            self._head = head
            self._hseed = self._sseq[head] * 4099 - head * bs  # _seed of the head's records, less their address
            self._ret[head] = 0
            if not self._sealed and self._written_end(head, self._off) > self._off:
                self._sealed = True
            if self._off > self._limit or rhead:  # (never append under a damaged header)
                self._sealed = 2
        self._rseq = (self._rseq + self._ref) & 0xFFFFFFFF
        self._count = self._compact(0)
        for i in range(self._count):
            self._lv(self._iaddr[i], self._isz[i])
        self._iseq = None
        ik = sorted(ins)
        cap = 8
        while cap < len(ik) + 1:
            cap += 8
        self._inpid = array("H", bytes(2 * cap))
        self._inaddr = array("I", bytes(4 * cap))
        for i in range(len(ik)):
            e = ins[ik[i]]
            self._inpid[i] = e[0]
            self._inaddr[i] = e[1]
            self._lv(e[1], _FLOOR_SZ)
        self._inn = len(ik)
        for k in self._meta:
            m = self._meta[k]
            self._lv(m[1], m[2])
        self._opened = True
        self._nfree = -1
        self._old = -2
        # superseded copies found alive: release them so retiring stays safe
        if not self.append_acks:
            for a in repair:
                self._prog(a + 13, self._zero)
            for s in data:
                self._maybe_retire(s)
        self.stats = {
            "sectors": n,
            "headers_read": heads,
            "sectors_scanned": scanned,
            "bytes_read": getattr(dev, "bytes_read", 0) - r0,
            "pending": self._count,
        }
        del ins, repair

    def _recover(self, s, valid, floor):
        """Sequence of sector s, whose header is damaged (a flipped bit), found
        from its records: the one unused sequence at or above the floor whose
        seed makes the first two records check (or the first one, followed by
        erased flash). 0 when none does: junk, an erased sector with a flipped
        bit, a torn header over an empty sector, old data below the floor."""
        used = [q for q, _ in valid]
        top = used[-1] if used else 0
        h = self._hdr
        for k in range(-2 * self.nsec, 2 * self.nsec + 1):
            q = (top + k) & 0xFFFFFFFF
            if not q or q in used or (floor and _sd(q, floor) < 0) or (not used and k < 1):
                continue
            self._sseq[s] = q
            off = _SH
            good = 0
            while good < 2 and off + _RH <= self.bs:
                i = self._at(s * self.bs + off, _RH)
                if self._win[i] == 0xFF:
                    break
                h[0:_RH] = self._winmv[i : i + _RH]
                if not (self._good_hdr(s, off) and self._crc_ok(s * self.bs + off, _u16(h, 2))):
                    good = 0
                    break
                good += 1
                off += _rsize(_u16(h, 2))
            if good:
                self._say("sector %d: header damaged; sequence %d recovered from its records" % (s, q))
                return q
        self._sseq[s] = 0
        return 0

    def _scan_floor(self, s, floor):
        """FLOOR records in the head sector raise the floor."""
        off = _SH
        base = s * self.bs
        h = self._hdr
        while off + _RH <= self.bs:
            i = self._at(base + off, _RH)
            if self._win[i] == 0xFF:
                break
            h[0:_RH] = self._winmv[i : i + _RH]
            if not self._good_hdr(s, off):
                off = self._resync(s, off)  # (leaves a valid header in self._hdr)
                if off < 0:
                    break
            ln = _u16(h, 2)
            if h[0] == T_FLOOR and self._crc_ok(base + off, ln):
                f = _u32(h, 4)
                if not floor or _sd(f, floor) > 0:
                    floor = f
            off += _rsize(ln)
        return floor

    def _good_hdr(self, s, off):
        """Header in self._hdr is a record that can sit at this offset."""
        h = self._hdr
        t = h[0]
        if not (t == PUBLISH or t == SUBSCRIBE or t == UNSUBSCRIBE or T_INID <= t <= T_FLOOR):
            return False
        if _u16(h, 10) != (hcrc(self._hdr, 10, self._seed(s, off)) & 0xFFFF):
            return False
        return off + _rsize(_u16(h, 2)) <= self.bs

    def _crc_ok(self, addr, ln):
        """CRC of the record at addr whose header is in self._hdr."""
        c = hcrc(self._hdr, 12, 0)
        p = addr + _RH
        left = ln
        while left > 0:
            k = left if left < _WIN else _WIN
            i = self._at(p, k)
            c = crc32(self._winmv[i : i + k], c)
            p += k
            left -= k
        i = self._at(p, 4)
        return _u32(self._win, i) == c & 0xFFFFFFFF

    def _resync(self, s, off):
        """Offset of the next valid record in sector s after a bad header, or -1."""
        base = s * self.bs
        h = self._hdr
        off = (off + 8) & ~7
        while off + _FLOOR_SZ <= self.bs:
            i = self._at(base + off, _RH)
            if self._win[i] != 0xFF:
                h[0:_RH] = self._winmv[i : i + _RH]
                if self._good_hdr(s, off) and self._crc_ok(base + off, _u16(h, 2)):
                    return off
            off += 8
        return -1

    def _written_end(self, s, off, first=False):
        """Where the bytes of sector s that are not erased end, from off on
        (off itself when all are erased); first: any end past off will do.
        A window is known erased from its first byte and one compare of the
        window with itself shifted by a byte (a memcmp): byte by byte, a
        blank sector cost a board 2.3 million instructions at each sector
        switch (docs/benchmarks.md)."""
        base = s * self.bs
        end = off
        while off < self.bs:
            k = self.bs - off
            if k > _WIN:
                k = _WIN
            i = self._at(base + off, k)
            mv = self._winmv
            if mv[i] != 0xFF or mv[i + 1 : i + k] != mv[i : i + k - 1]:
                if first:
                    return off + 1
                j = i + k - 1
                while mv[j] == 0xFF:
                    j -= 1
                end = off + j - i + 1
            off += k
        return end

    def _scan(self, s, ins, repair):
        """Scan sector s in log order. Returns (end offset, torn tail)."""
        base = s * self.bs
        h = self._hdr
        off = _SH
        torn = False
        blank16 = True
        while off + _RH <= self.bs:
            i = self._at(base + off, _RH)
            w = self._win
            blank16 = True
            for j in range(i, i + _RH):
                if w[j] != 0xFF:
                    blank16 = False
                    break
            if blank16:
                break
            h[0:_RH] = self._winmv[i : i + _RH]
            if not self._good_hdr(s, off):
                nxt = self._resync(s, off)
                if nxt < 0:
                    torn = True
                    break
                self._say("sector %d: unreadable bytes at %d..%d skipped" % (s, off, nxt))
                off = nxt
                continue
            ln = _u16(h, 2)
            size = _rsize(ln)
            if not self._crc_ok(base + off, ln):
                self._say("sector %d: record at %d (type %d, pid %d) fails its CRC: skipped" % (s, off, h[0], _u16(h, 8)))
                torn = True  # if nothing valid follows, this is a torn tail
                off += size
                continue
            torn = False
            self._record(s, base + off, size, ins, repair)
            off += size
        return off, torn

    def _record(self, s, addr, size, ins, repair):
        h = self._hdr
        t = h[0]
        fl = h[1]
        r = _u32(h, 4) - self._ref
        if r > 0x7FFFFFFF:
            r -= 0x100000000
        elif r < -0x80000000:
            r += 0x100000000
        pid = _u16(h, 8)
        if t == PUBLISH or t == SUBSCRIBE or t == UNSUBSCRIBE:
            if r >= self._rseq:
                self._rseq = r + 1
            if not fl & F_RELOC and r > self._bootlast:
                self._bootlast = r
                self._last = pid
            i = self._efind(r)
            if fl & F_RENUM:  # a stale record's copy: the original has its pid
                for j in range(self._n):
                    if self._ipid[j] == pid:
                        i = j
            if i >= 0:  # an older copy: this one wins
                if not self.append_acks:
                    repair.append(self._iaddr[i] & ~7)
                self._ipid[i] = 0
            if _isset(h[13]):
                return
            mk = 1 if fl & F_MARKED else 0
            for j in (12, 14, 15):
                if _isset(h[j]):
                    mk ^= 1
            i = self._eslot(r)
            self._ipid[i] = pid
            self._iaddr[i] = addr | (_KINDS.index(t) << 1) | mk
            self._isz[i] = size
        elif t == T_INID:
            if r >= self._rseq:
                self._rseq = r + 1
            if fl & F_RENUM:  # a stale id's copy: the original has its pid
                for k in list(ins):
                    if ins[k][0] == pid:
                        ins[r] = ins.pop(k)
            old = ins.pop(r, None)
            if old is not None and not self.append_acks:
                repair.append(old[1])
            if not _isset(h[13]):
                ins[r] = [pid, addr]
        elif t == T_META:
            if r >= self._rseq:
                self._rseq = r + 1
            body = bytearray(_u16(h, 2))
            self._read(addr + _RH, body)
            if not self._meta_rec(body, r, addr, size):
                self._say("meta record at 0x%x malformed: skipped" % addr)
        elif t == T_OP:
            self._pin[s] = 1
            if fl == OP_INREL:
                ins.pop(r, None)
                return
            i = self._efind(r)
            if i >= 0:
                if fl == OP_RELEASE:
                    self._ipid[i] = 0
                elif fl == OP_MARK:
                    self._iaddr[i] |= 1
                elif fl == OP_UNMARK:
                    self._iaddr[i] &= ~1
        elif t == T_INCLEAR:
            self._pin[s] = 1
            ins.clear()
        # T_FLOOR: read before the scan

    def _epos(self, r):
        """Where sequence r is or would go in the scan's index (binary search)."""
        q = self._iseq
        lo = 0
        hi = self._n
        if hi and q[hi - 1] < r:  # (records come mostly in order)
            return hi
        while lo < hi:
            m = (lo + hi) >> 1
            if q[m] < r:
                lo = m + 1
            else:
                hi = m
        return lo

    def _efind(self, r):
        """Index entry of live record sequence r during the scan, or -1."""
        i = self._epos(r)
        return i if i < self._n and self._iseq[i] == r and self._ipid[i] else -1

    def _eslot(self, r):
        """An entry for sequence r during the scan, in order: a hole r left, or
        room made at its place (holes closed first; grown only when full)."""
        i = self._epos(r)
        n = self._n
        q = self._iseq
        if i < n and q[i] == r:
            return i
        ip, ia, iz = self._ipid, self._iaddr, self._isz
        if n == len(ip):
            if self._compact(0, q) == n:
                self.reserve(n + _CHUNK)
                self._iseq = _grow(q, "i", 4, n + _CHUNK)
                ip, ia, iz, q = self._ipid, self._iaddr, self._isz, self._iseq
            n = self._n
            i = self._epos(r)
        k = n
        while k > i:  # (only relocated copies land before the end)
            ip[k], ia[k], iz[k], q[k] = ip[k - 1], ia[k - 1], iz[k - 1], q[k - 1]
            k -= 1
        q[i] = r
        self._n = n + 1
        return i

    # ------------------------------------------------------------ space
    def _free(self):
        if self._nfree < 0:
            c = 0
            for s in range(self.nsec):
                if not self._sseq[s]:
                    c += 1
            self._nfree = c
        return self._nfree

    def _oldest(self):
        if self._old != -2:
            return self._old
        best = -1
        bq = 0
        for s in range(self.nsec):
            q = self._sseq[s]
            if q and s != self._head and (best < 0 or _sd(q, bq) < 0):
                best = s
                bq = q
        self._old = best
        return best

    def _alloc(self, size, keep=_KEEP):
        """Address for a record of `size` bytes in the head; makes room first.
        A record that stays live must leave 24 bytes per sector unused: then
        some sector always has room for an OP, INCLEAR or FLOOR record besides
        its live ones, so acknowledging (which frees) never fails for room.
        keep: bytes of that capacity to leave free besides (None: an ack, not
        counted; below 0: a meta value that frees that much once written). A
        message leaves _KEEP, so that with the outbox full an inbound QoS 2
        message is still taken and the firmware's boot counter still written
        (a boot that cannot write it would never drain); an inbound id leaves
        _MKEEP of it, so ids the broker holds cannot use it all up."""
        if size > self._maxrec:
            raise ValueError("record of %d bytes does not fit a %d-byte sector" % (size, self.bs))
        if keep is not None and self._total + size + keep > self._cap:
            if self._unk is None:
                raise OSError(ENOSPC, "flash outbox full")
            self._retry()  # (the state was unknown: _total is over the capacity until it is read)
            return self._alloc(size, keep)
        off = self._off
        if self._nfree > 1 and not self._sealed and self._head >= 0 and off + size <= self._limit:
            # the steady case, as _room would find it: a spare sector (so no reclaim to keep room
            # for) and room in the head
            self._off = off + size
            off += self._head * self.bs
        else:
            off = self._room(size, keep)
        self._ra = off  # the room just taken (where _write programs) and its size
        self._rs = size
        return off

    def _room(self, size, keep):
        """_alloc's room for a record, making it first: reclaim, sector switch."""
        for _ in range(4 * self.nsec + 4):
            if self._sealed == 1 and not self._free():
                self._unseal()
            if self._head >= 0 and not self._sealed:
                free = self._free()
                o = self._oldest() if free <= 1 else -1
                res = self._live[o] if o >= 0 else 0
                room = self._limit - self._off
                # (with no spare sector, a record that may be voided leaves room for its appended
                # release besides the reclaim's copy: see _failed)
                if free and room >= size + res + (_FLOOR_SZ if o >= 0 and keep is not None and self.append_acks else 0):
                    a = self._head * self.bs + self._off
                    self._off += size
                    return a
                if o >= 0 and room >= res:
                    self._gflush()
                    self._reclaim(o)
                    continue
                if keep is None and not free and room >= size:
                    # An ack with no spare sector and less room in the head
                    # than the reclaim of the oldest needs (a cut tore a copy
                    # into the room kept for it, flash-acks seed 6353): it
                    # frees, so it goes in rather than fail and wedge the outbox.
                    a = self._head * self.bs + self._off
                    self._off += size
                    return a
            self._gflush()
            self._switch()
        raise OSError(ENOSPC, "flash outbox full")

    def _unseal(self):
        """The head has a torn tail and no sector is free (the spare went to
        the head after an earlier cut, and power failed again before a reclaim
        gave it back): rather than refuse every append and appended ack for
        good, append after the torn bytes. The torn program never reached past
        its record (the scan's end skips a torn record whose header reads) nor
        past the last byte that is not erased, so the next record goes after
        both; a boot finds it by the scan's resync (a zero byte where the
        scan ended makes it resync rather than stop, if erased bytes were
        there)."""
        base = self._head * self.bs
        off = self._off
        end = self._written_end(self._head, off)
        if end > off and self._win[self._at(base + off, 1)] == 0xFF:
            self._zero[0] = 0  # (so a scan stopping at erased bytes there resyncs instead)
            self._prog(base + off, self._zero)
        self._off = (end + 7) & ~7
        self._sealed = False

    def _switch(self):
        """Open the next free sector (erasing it if needed) as the head."""
        n = self.nsec
        start = self._head + 1 if self._head >= 0 else 0
        s = -1
        for k in range(n):
            c = (start + k) % n
            if not self._sseq[c]:
                s = c
                break
        if s < 0:
            s = self._scrap()
        if not self._blank[s] and self._written_end(s, 0, True):
            self._erase(s)
        old = self._head
        sh = self._sh
        pack_into(
            "<4sBBBBIIIHHIi", sh, 0, _MAGIC, _VERSION, 1 if self.append_acks else 0, self._shift, 0xFF,
            self._nextseq, self._floor, self._rseq & 0xFFFFFFFF, self._last, self.nsec & 0xFFFF, 0, -1)
        pack_into("<I", sh, 24, crc32(memoryview(sh)[0:24]))
        self._sseq[s] = self._nextseq  # before programming: a torn header is junk
        self._nfree = -1
        self._old = -2
        self._nextseq = _inc(self._nextseq)
        self._total -= self._live[s]
        self._live[s] = 0
        self._pin[s] = 0
        self._ret[s] = 0
        try:
            self._prog(s * self.bs, sh)
        except OSError:
            raise  # (_prog read the flash again: RAM says what it holds)
        except BaseException:
            self._sseq[s] = 0
            self._nfree = -1
            self._old = -2
            raise
        self._head = s
        self._hseed = self._sseq[s] * 4099 - s * self.bs  # _seed of the head's records, less their address
        self._off = _SH
        self._sealed = False
        if old >= 0:
            self._maybe_retire(old)

    def _scrap(self):
        """No sector is free: one that holds nothing live and no acks, erased and reused (writes
        that failed can leave only junk in the head, too little room to reclaim the oldest sector
        into, and no spare). With none free there is no void sector below the floor, so the floor
        the next header carries is all that voids anything. ENOSPC if there is none."""
        for s in range(self.nsec):
            if self._sseq[s] and not self._live[s] and not self._pin[s]:
                self._sseq[s] = 0
                self._nfree = -1
                self._old = -2
                if s == self._head:
                    self._head = -1
                return s
        raise OSError(ENOSPC, "flash outbox full")

    def _reclaim(self, o):
        """Copy what is live in sector o into the head, void it, erase it."""
        lo = o * self.bs
        hi = lo + self.bs
        for i in range(self._lo, self._n):
            if self._ipid[i]:
                a = self._iaddr[i]
                if lo <= a < hi:
                    self._move(i, a & 1)
        for i in range(self._inn):
            a = self._inaddr[i]
            if lo <= a < hi:
                na = self._take(_FLOOR_SZ)
                if self._copy(a, na, F_RELOC):
                    self._inaddr[i] = na
                    self._lv(na, _FLOOR_SZ)
        for k in self._meta:
            m = self._meta[k]
            if lo <= m[1] < hi:
                na = self._take(m[2])
                if self._copy(m[1], na, F_RELOC):
                    self._lv(na, m[2])
                    m[1] = na
        # void the old sector, then erase it
        f = _inc(self._sseq[o])
        a = self._head * self.bs + self._off
        self._mkhdr(T_FLOOR, 0, 0, f, 0, a)
        c = hcrc(self._hdr, 12, 0) & 0xFFFFFFFF
        _put32(self._crcb, 0, c)
        self._prog(a, self._hdr)
        self._prog(a + _RH, self._crcb)
        self._off += _FLOOR_SZ
        if not self._floor or _sd(f, self._floor) > 0:
            self._floor = f
        self._sseq[o] = 0
        self._total -= self._live[o]
        self._live[o] = 0
        self._nfree = -1
        self._old = -2
        self._pin[o] = 0
        self._ret[o] = 0
        self._erase(o)

    def _take(self, size):
        """Room in the head for a copy during reclaim (reserved by _alloc)."""
        a = self._head * self.bs + self._off
        self._off += size
        return a

    def _move(self, i, marked):
        """Relocate index entry i into the head with the given mark state."""
        a = self._iaddr[i]
        size = self._isz[i]
        src = a & ~7
        na = self._take(size)
        if self._copy(src, na, F_RELOC | (F_MARKED if marked else 0)):
            self._lv(src, -size)
            self._lv(na, size)
            self._iaddr[i] = na | (a & 6) | (1 if marked else 0)
            return True
        # the source went bad: drop it (its copy stays invalid on flash)
        self._lv(src, -size)
        self._drop(i)
        return False

    def _copy(self, src, dst, flags):
        """Copy the record at src to dst with new flags; False if src is corrupt."""
        h = self._hdr
        self._read(src, h)
        ln = _u16(h, 2)
        old = hcrc(self._hdr, 12, 0)
        r = _u32(h, 4)
        if (self._rseq - r) & 0xFFFFFFFF >= _STALE:  # (see STALE in logrec)
            r = self._rseq & 0xFFFFFFFF
            self._rseq = r + 1
            flags |= F_RENUM
        h[1] = (h[1] & ~(F_RELOC | F_MARKED | F_RENUM)) | flags
        self._mkhdr(h[0], h[1], ln, r, _u16(h, 8), dst)
        new = hcrc(self._hdr, 12, 0)
        if ln + _RH + 4 <= _WIN:
            # in one program: one that fails leaves no copy, a torn one or a whole one (which
            # the flash read again then counts: the reclaim got that far), not a header alone
            w = self._winmv
            self._wl = 0
            self._read(src + _RH, w[_RH : _RH + ln + 4])
            if _u32(self._win, _RH + ln) != crc32(w[_RH : _RH + ln], old) & 0xFFFFFFFF:
                self._say("record at 0x%x went bad on flash: dropped" % src)
                return False
            w[0:_RH] = h
            _put32(self._win, _RH + ln, crc32(w[_RH : _RH + ln], new) & 0xFFFFFFFF)
            self._prog(dst, w[0 : _RH + ln + 4])
            return True
        self._prog(dst, h)
        p = 0
        while p < ln:
            k = ln - p
            if k > _WIN:
                k = _WIN
            mv = self._winmv[0:k]
            self._read(src + _RH + p, mv)
            old = crc32(mv, old)
            new = crc32(mv, new)
            self._prog(dst + _RH + p, mv)
            p += k
        self._read(src + _RH + ln, self._crcb)
        if _u32(self._crcb, 0) != old & 0xFFFFFFFF:
            self._say("record at 0x%x went bad on flash: dropped" % src)
            return False
        _put32(self._crcb, 0, new & 0xFFFFFFFF)
        self._prog(dst + _RH + ln, self._crcb)
        return True

    def _maybe_retire(self, s):
        if (
            self.append_acks
            or s < 0
            or s == self._head
            or not self._sseq[s]
            or self._live[s]
            or self._pin[s]
            or self._ret[s]
        ):
            return
        self._zero[0] = 0
        self._prog(s * self.bs + 28, self._zero)
        self._ret[s] = 1

    def _early(self):
        """Reclaim the oldest sector ahead of time once nothing in it is live."""
        if self._head < 0 or self._sealed or self._free() > 1:
            return False
        o = self._oldest()
        if o < 0 or self._live[o]:
            return False
        self._reclaim(o)
        return True

    def idle(self):
        """Optional: do deferred flash work (erase the next spare). True if it did."""
        self._gflush()
        return self._early()

    # ------------------------------------------------------------ writing
    def _write(self, tf, pid, head, body, rseq=-1):
        """Program one record (type | flags << 8; sequence rseq, or the next
        one) into the room _alloc just took (or stage it in the group
        buffer). Built in the read window (which any write leaves stale) by
        struct's pack_into, a copy in C (a slice store cost a board 2,850
        instructions whatever its length), and programmed by one writeblocks
        call, not two to four; the padding is written erased-looking, as a
        group write has it. The views of the window are kept per size
        (body-less records and the last message size), and so is the format,
        so same-sized messages allocate nothing but what crc32 returns."""
        lh = len(head)
        lb = len(body)
        ln = lh + lb
        size = (ln + 27) & ~7  # _rsize(ln)
        if rseq < 0:
            rseq = self._rseq
        if rseq > 0x3FFFFFFF:  # (a 32-bit sequence; below, a small int: no long-int arithmetic)
            rseq &= 0xFFFFFFFF
        addr = self._ra
        self._wl = 0
        w = self._win
        h = self._hmv
        pack_into("<HHIHhi", w, 0, tf, ln, rseq, pid, -1, -1)
        # the header check, seeded as _seed says (crc32 takes the seed modulo 2^32; the record is
        # in the head), its low 16 bits (packed as 32, two status bytes then erased again: no
        # long-int arithmetic on a board)
        pack_into("<I", w, 10, crc32(h, self._hseed + addr))
        w[12] = w[13] = 0xFF
        if _bs:
            head = _bs(head)
            body = _bs(body)
        c = crc32(body, crc32(head, crc32(h)))
        if size > _WIN:
            pack_into("<I", self._crcb, 0, c)
            return self._big(addr, size, head, body)
        # (rseq, h and lh are used again below: their first values are done with, and a frame
        # no larger than before the try below keeps what its allocation costs a board)
        rseq = lh | lb << 16
        if rseq != self._fk:
            self._fmt = "<%ds%dsI%ds" % (lh, lb, size - ln - 20)
            self._fk = rseq
        pack_into(self._fmt, w, _RH, head, body, c, _FF8)
        if size == _SMALL:
            h = self._smv
        else:
            if size != self._stsz:
                self._stmv = self._winmv[0:size]
                self._stsz = size
            h = self._stmv
        if self.group:
            lh = self._glen
            if lh and (self._gaddr + lh != addr or lh + size > len(self._gbuf)):
                self._gflush()
                lh = 0
            if size <= len(self._gbuf):
                if not lh:
                    self._gaddr = addr
                self._gbuf[lh : lh + size] = h
                self._glen = lh + size
                self.dirty = True
                return
        # _prog without its call (the head sector's header is programmed, so it is not blank)
        try:
            self.dev.writeblocks(addr >> self._shift, h, addr & self._mask)
        except OSError:
            self._failed(addr, size)
            raise

    def _big(self, addr, size, head, body):
        # _write's record larger than the read window, its header in it and its CRC in _crcb:
        # four programs (after the group buffer's, whose room comes first)
        if self.group:
            self._gflush()
        lh = len(head)
        ln = lh + len(body)
        d = self.dev
        b = addr >> self._shift
        m = self._mask
        try:
            d.writeblocks(b, self._hmv, addr & m)
            if lh:
                d.writeblocks(b, head, (addr + _RH) & m)
            if ln - lh:
                d.writeblocks(b, body, (addr + _RH + lh) & m)
            d.writeblocks(b, self._crcb, (addr + _RH + ln) & m)
        except OSError:
            self._failed(addr, size)
            raise

    def _gflush(self):
        # Clean only once programmed; a program that raises is _failed's (the buffer's messages
        # and inbound ids that landed voided: the publish() or in_add() committing them raises).
        # _glen < 0: the state is unknown, read the flash again first.
        if self._glen:
            if self._glen < 0:
                return self._retry()
            self._wl = 0
            try:
                self.dev.writeblocks(self._gaddr >> self._shift, self._gmv[0 : self._glen], self._gaddr & self._mask)
            except OSError:
                self._failed(self._gaddr, self._glen)
                raise
            self._glen = 0
            self.dirty = self.seen != self.epoch

    def _small(self, t, flags, pid):
        """Append a body-less record (OP, INID, INCLEAR). Its sequence is taken
        after the room is made: a reclaim may give the target a fresh one."""
        a = self._alloc(_FLOOR_SZ, _MKEEP if t == T_INID else None)
        if t == T_OP:
            r = self._rseq_of(self._inaddr[self._infind(pid)] if flags == OP_INREL else self._iaddr[self._find(pid)] & ~7)
        else:
            r = self._rseq
            self._rseq += 1
        self._write(t | flags << 8, pid, b"", b"", r)
        if t != T_INID:
            self._pin[a >> self._shift] = 1  # what it says must be read at boot
        return a

    # ------------------------------------------------------------ index
    def _drop(self, i):
        self._ipid[i] = 0
        self._count -= 1
        while self._lo < self._n and not self._ipid[self._lo]:
            self._lo += 1
        if self._lo == self._n:
            self._lo = self._n = 0

    def _compact(self, lo, q=None):
        """Close the index's holes (released or superseded entries) from lo
        to its end, moving q (the scan's sequences) alike; the live count."""
        ip, ia, iz = self._ipid, self._iaddr, self._isz
        j = 0
        for i in range(lo, self._n):
            if ip[i]:
                ip[j], ia[j], iz[j] = ip[i], ia[i], iz[i]
                if q is not None:
                    q[j] = q[i]
                j += 1
        self._lo = 0
        self._n = j
        return j

    def _slot(self):
        if self._n == len(self._ipid):
            if self._compact(self._lo) == len(self._ipid):
                self.reserve(self._n + _CHUNK)
        return self._n

    def reserve(self, n):
        """Index room for n live records, taken at boot while the heap is
        whole: grown late, in a long outage on a small heap, the copy can find
        no free block big enough (MemoryError at publish, seen at 130 pending
        in 32 KiB). Holes are compacted before the index grows."""
        if n > len(self._ipid):
            self._ipid = _grow(self._ipid, "H", 2, n)
            self._iaddr = _grow(self._iaddr, "I", 4, n)
            self._isz = _grow(self._isz, "H", 2, n)

    def _lv(self, addr, d):
        self._live[addr >> self._shift] += d
        self._total += d

    def _rseq_of(self, addr):
        self._read(addr, self._hdr)
        return _u32(self._hdr, 4)

    # ------------------------------------------------------------ contract
    def append(self, kind, pid, head, body=b""):
        # A frame of 11 words, so not taken from the heap: no locals (head holds the index entry
        # once written); the room's address and size are _ra and _rs.
        self._check(kind, pid)
        self._alloc((len(head) + len(body) + 27) & ~7)  # _rsize
        self._write(kind, pid, head, body)
        self._rseq += 1
        self._last = pid
        head = self._n
        if head == len(self._ipid):
            head = self._slot()
        self._ipid[head] = pid
        self._iaddr[head] = self._ra | (kind // 3 - 1) << 1  # the kind code, as _check returns it
        self._isz[head] = self._rs
        self._n = head + 1
        self._count += 1
        self._live[self._ra >> self._shift] += self._rs  # _lv
        self._total += self._rs

    def _setmark(self, pid, want):
        """Flip the mark: in place, program the next erased mark byte (12, 14,
        15: each one set toggles the state); once all are used, or in
        appended-ack mode, append an OP record. Never a copy: on a full store
        a copy could find no room, and a broker that lost the session (unmark
        of every PUBREC seen) would then stop the client from reconnecting."""
        self._gflush()
        i = self._get(pid)
        a = self._iaddr[i]
        if a & 1 == want:
            return
        src = a & ~7
        h = self._hdr
        self._read(src, h)
        if not self.append_acks:
            for j in (12, 14, 15):
                if not _isset(h[j]):
                    self._zero[0] = 0
                    self._prog(src + j, self._zero)
                    self._iaddr[i] = a ^ 1
                    return
        r = _u32(h, 4)
        na = self._alloc(_FLOOR_SZ, None)
        i = self._get(pid)
        if self._iaddr[i] & ~7 != src:
            r = self._rseq_of(self._iaddr[i] & ~7)  # (a stale one got a fresh sequence)
        if not self.append_acks and self._iaddr[i] & ~7 != src:
            # the reclaim making room copied it, with fresh mark bytes: an OP
            # after that copy would override the in-place marks made on it
            # later, so it gets none (nothing was written in its room)
            self._off -= _FLOOR_SZ
            return self._setmark(pid, want)
        self._write(T_OP | (OP_MARK if want else OP_UNMARK) << 8, pid, b"", b"", r)
        self._pin[na >> self._shift] = 1
        self._iaddr[i] = (self._iaddr[i] & ~1) | want

    def release(self, pid):
        if self._glen:
            self._gflush()
        i = self._lo  # (the oldest, mostly: found without a search)
        if i == self._n or self._ipid[i] != pid:
            i = self._find(pid) if pid else -1
            if i < 0:
                return
        if self.append_acks:
            self._small(T_OP, OP_RELEASE, pid)
            i = self._find(pid)
        a = self._iaddr[i] & ~7
        s = a >> self._shift
        if not self.append_acks:
            self._wl = 0  # (_prog's work without its frame: the record's sector is not blank)
            self._zap(a + 13)
        self._live[s] -= self._isz[i]  # _lv
        self._total -= self._isz[i]
        self._drop(i)
        if s != self._head and not self._live[s]:
            self._maybe_retire(s)
        if self._nfree < 2:  # (-1: not known)
            self._early()

    def size(self, pid):
        if self._glen > 0:  # (not while the state is unknown: reads are what RAM says)
            self._gflush()
        self._read(self._iaddr[self._get(pid)] & ~7, self._hdr)
        return _u16(self._hdr, 2)

    def read(self, pid, offset, buf):
        if self._glen > 0:
            self._gflush()
        a = self._iaddr[self._get(pid)] & ~7
        self._read(a, self._hdr)
        n = _u16(self._hdr, 2) - offset
        if n <= 0:
            return 0
        if n > len(buf):
            n = len(buf)
        self._read(a + _RH + offset, buf if n == len(buf) else memoryview(buf)[0:n])
        return n

    def count(self):
        return self._count

    def pending(self):
        # one list of the exact size: a comprehension's growth steps, right
        # after a boot's scan, are what a small heap could not find
        ip = self._ipid
        out = [0] * self._count
        j = 0
        for i in range(self._lo, self._n):
            if ip[i]:
                out[j] = ip[i]
                j += 1
        return out

    def _infind(self, pid):
        ip = self._inpid
        for i in range(self._inn):
            if ip[i] == pid:
                return i
        return -1

    def in_add(self, pid):
        self._gflush()
        if self._infind(pid) >= 0:
            return
        a = self._small(T_INID, 0, pid)
        if self._inn == len(self._inpid):
            n = self._inn + 8
            self._inpid = _grow(self._inpid, "H", 2, n)
            self._inaddr = _grow(self._inaddr, "I", 4, n)
        self._inpid[self._inn] = pid
        self._inaddr[self._inn] = a
        self._inn += 1
        self._lv(a, _FLOOR_SZ)

    def in_has(self, pid):
        return self._infind(pid) >= 0

    def _in_del(self, i):
        a = self._inaddr[i]
        self._inn -= 1
        self._inpid[i] = self._inpid[self._inn]
        self._inaddr[i] = self._inaddr[self._inn]
        self._lv(a, -_FLOOR_SZ)
        self._maybe_retire(a >> self._shift)

    def in_release(self, pid):
        self._gflush()
        i = self._infind(pid)
        if i < 0:
            return
        a = self._inaddr[i]
        if self.append_acks:
            self._small(T_OP, OP_INREL, pid)
            i = self._infind(pid)
        else:
            self._zero[0] = 0
            self._prog(a + 13, self._zero)
        self._in_del(i)

    def in_clear(self):
        self._gflush()
        if not self._inn:
            return
        self._small(T_INCLEAR, 0, 0)
        while self._inn:
            self._in_del(self._inn - 1)

    def set_meta(self, key, value):
        try:
            self._set_meta(key, value)
        except OSError:
            # the flash read again: the value is set if its record landed (meta is not voided)
            if self._unk is not None or self.meta(key) != bytes(value):
                raise

    def _set_meta(self, key, value):
        self._gflush()
        kv = self._meta_kv(key, value)
        if kv is None:
            return
        k, v, cur = kv
        size = _rsize(1 + len(k) + len(v))
        a = self._alloc(size, 0 if cur is None else -cur[2])  # (a new value replaces the old one)
        r = self._rseq
        self._write(T_META, 0, bytes((len(k),)) + k, v, r)
        self._rseq += 1
        cur = self._meta.get(k)  # the reclaim may have moved the old one
        self._meta[k] = [v, a, size, r]
        self._lv(a, size)
        if cur is not None:
            self._lv(cur[1], -cur[2])
            self._maybe_retire(cur[1] >> self._shift)

    def commit(self):
        self._gflush()
        self.dirty = self.seen != self.epoch

    def close(self):
        self._gflush()
        self._opened = False
