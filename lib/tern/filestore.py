"""FileStore: the session store as append-only segment files in a directory.

Over 600 lines because, as in flashstore.py, the append path, segment reclaim and the recovery
scan share one index and write buffer and the scan runs at every open (a module of its own costs a
board one more module on the heap).

Runs on any filesystem: LittleFS on boards (through os/vfs), POSIX on hosts,
or any object with open/listdir/remove/mkdir passed as `fs` (e.g. a
littlefs-python filesystem on a host). An `fs` that also has sync_file and
sync_dir is a complete layer (e.g. an OsFs subclass that counts or cuts
operations) and is used as it is. Same contract as lib/tern/store.py.

Segments are named NNNNNNNN.seg and hold records in the FlashStore format
(see flashstore.py: 16-byte header with an address-seeded check, body,
CRC-32; the status bytes are never programmed: every change is an appended
record). A segment opens with a SEG record carrying the next record sequence
and the last packet id, so nothing needed survives only in deleted files.

- append writes the record, flushes and syncs (os.fsync on CPython, the file's
  flush -- a LittleFS file sync -- and os.sync() when present on MicroPython).
  With group_commit=True, nothing is flushed until commit(), which makes every
  change since the last commit durable at once (the session commits before
  publish() returns and before any packet leaves while `dirty`: releases
  are what waits, until the next packet).
- mark/unmark/release/in_release/in_clear/set_meta append small records.
- every open starts a new segment: a torn tail (caught by the CRC) is never
  appended to. A record that would take a segment past `segment_bytes` goes
  to a new one (a bigger record gets a segment of its own).
- the oldest segment is deleted once nothing in it is live; when more than
  `max_segments` exist, the oldest one's stuck live records are copied forward
  (same record sequence, so order is kept, unless a stale one: see logrec;
  segment numbers wrap after 99999999) and it is deleted (one such move
  per call). Segments are only ever deleted oldest first, so an appended
  release always outlives the record it releases.

Capacity (a full outbox must still take its acks, or it never drains):
- the budget is what the filesystem had free at open() (os.statvfs, or
  littlefs-python's fs_stat) less 3 blocks (LittleFS's copy-on-write block,
  directory growth, slack), plus what the segments already take; `max_bytes`
  caps it, and is the only budget where the filesystem cannot tell its free
  space. A segment file counts as whole blocks of block size - 64 bytes
  (LittleFS keeps pointers in each); segment_bytes is cut to an eighth of
  the budget on a small filesystem, then rounded down to whole such blocks
  (at least one) less 40 bytes. A max_bytes in which an empty store would
  take no 64-byte message is refused at open (ValueError naming the least
  budget that would).
- only live records (messages, inbound ids, the latest meta values) count
  toward fullness. append raises OSError(ENOSPC, "outbox full"), with nothing
  written, unless the live records and the new one, packed into segments,
  leave room for an ack record, 640 bytes for inbound QoS 2 ids and meta
  updates (in_add/set_meta may use those, so a full outbox still takes an
  inbound QoS 2 message and a boot counter), and twice the headroom of moving
  the largest segment's live records forward (a power cut may stop a move
  half-way, and the boot after it opens a segment first).
- acks (release, mark, unmark, in_release, in_clear) never count: when the
  files come near the budget, the oldest segment's live records are moved
  forward (same record sequence) and the segment deleted, which always fits
  in that headroom. So an ack never fails for room, and releases make room
  for appends again.
- a write, sync or file create that fails anyway (the filesystem filled from
  elsewhere, an I/O error) raises OSError (ENOSPC as "outbox full
  (filesystem)") as lib/tern/store.py says ("When storage fails"): what the
  segment holds past its last good sync (POSIX may keep any part of it, now
  or after a power cut; LittleFS may commit it when the file closes) is
  voided, zeros written over it and synced (the boot scan skips them), and
  the segments are read again; the next write opens a new segment. So the
  failed call did not happen, a half-written record never comes back, and
  with group_commit the changes not yet committed are gone (the session
  re-derives its view). If voiding or reading fails too, the state is
  unknown (OutboxUnknown) until a later write or commit manages both. A
  segment counts only once its directory entry is synced; a delete whose
  directory sync fails is kept (a dead segment that comes back at a power
  cut holds nothing live).
"""

import os
from binascii import crc32

from .wire import const
from .logrec import (
    RH as _RH,
    T_INID,
    T_META,
    T_OP,
    T_INCLEAR,
    F_RELOC,
    F_MARKED,
    F_RENUM,
    STALE as _STALE,
    OP_MARK,
    OP_UNMARK,
    OP_RELEASE,
    OP_INREL,
    KINDS as _KINDS,
    Log,
    OutboxUnknown,  # noqa: F401  (an app that uses FileStore finds it here)
    apply_op,
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

T_SEG = const(0x35)
_SEGS = const(99999999)  # segment numbers (8 digits) wrap after this
_E = const(20)  # a record without a body: SEG, OP, INCLEAR, INID
_SPARE = const(3)  # blocks of the free space left to the filesystem
_RSV = const(640)  # live bytes messages leave to inbound ids and meta updates (32 ids)
ENOSPC = const(28)
ENOENT = const(2)
_MICROPYTHON = __import__("sys").implementation.name == "micropython"


class OsFs:
    """The running system's filesystem (LittleFS via vfs on boards, POSIX on hosts)."""

    def open(self, path, mode):
        return open(path, mode)

    def listdir(self, path):
        return os.listdir(path)

    def remove(self, path):
        os.remove(path)

    def mkdir(self, path):
        os.mkdir(path)

    def statvfs(self, path):
        return os.statvfs(path)

    def sync_file(self, f):
        f.flush()
        if hasattr(os, "fsync"):
            os.fsync(f.fileno())
        elif hasattr(os, "sync"):
            os.sync()

    def sync_dir(self, path):
        if hasattr(os, "fsync") and hasattr(os, "O_RDONLY"):
            fd = os.open(path, os.O_RDONLY)  # pyright: ignore[reportAttributeAccessIssue]  (CPython)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        elif hasattr(os, "sync"):
            os.sync()


def _oserror(e):
    """A filesystem object's own error (e.g. littlefs.LittleFSError) as OSError."""
    if isinstance(e, OSError) or type(e).__name__ != "LittleFSError":
        return e
    return OSError(-getattr(e, "code", 5), str(e))


class _ObjFs:
    """An object with open/listdir/remove/mkdir (e.g. littlefs-python's LittleFS)."""

    def __init__(self, fs):
        self.fs = fs

    def open(self, path, mode):
        try:
            return self.fs.open(path, mode)
        except Exception as e:
            raise _oserror(e)

    def listdir(self, path):
        try:
            return self.fs.listdir(path)
        except Exception as e:
            raise _oserror(e)

    def remove(self, path):
        try:
            self.fs.remove(path)
        except Exception as e:
            raise _oserror(e)

    def mkdir(self, path):
        try:
            self.fs.mkdir(path)
        except Exception as e:
            raise _oserror(e)

    def statvfs(self, path):
        # littlefs-python: fs_stat() and used_block_count, as os.statvfs's first five
        s = self.fs.fs_stat()
        free = s.block_count - self.fs.used_block_count
        return (s.block_size, s.block_size, s.block_count, free, free)

    def sync_file(self, f):
        f.flush()
        raw = getattr(f, "raw", None)  # a buffered wrapper: sync the file below it too
        if raw is not None:
            raw.flush()

    def sync_dir(self, path):
        pass


class FileStore(Log):
    _tag = "tern.filestore: "

    def __init__(self, path, fs=None, group_commit=False, segment_bytes=16384, max_segments=4, verbose=True,
                 max_bytes=0):
        self.path = path.rstrip("/") or "/"
        if fs is None:
            fs = OsFs()
        elif not hasattr(fs, "sync_file"):
            fs = _ObjFs(fs)
        self.fs = fs
        self.group = bool(group_commit)
        self.segment_bytes = segment_bytes
        self.max_segments = max(2, max_segments)
        self.max_bytes = max_bytes
        self.verbose = verbose
        self._hdr = bytearray(_RH)
        self._crcb = bytearray(4)
        self._f = None
        self._cur = 0
        self._off = 0
        self.dirty = False
        self._soff = 0  # end of what the last sync made durable in the current segment
        self._vseg = 0  # a segment whose bytes from _voff on are to be voided (see _fail)
        self._voff = 0
        self._segs = []  # segment numbers, oldest first
        self._live = {}  # segment -> bytes of its live records
        self._sz = {}  # segment -> file size (the current one: _off)
        self._cap = 0  # byte budget of all segment files (0: none)
        self._u = 1  # allocation unit (the filesystem's block)
        self._seg = segment_bytes
        self._mx = _E  # largest live record (for the headroom)
        # index in record-sequence order (pid 0 = hole)
        self._ipid = array("H")
        self._iseg = array("I")
        self._iaddr = array("I")  # offset << 3 | kind code << 1 | marked
        self._ilen = array("I")  # body length
        self._irs = array("I")  # record sequence
        self._lo = 0
        self._n = 0
        self._in = {}  # pid -> (segment, offset, rseq)
        self._meta = {}  # key -> [value, segment, offset, rseq]
        self._rseq = 1
        self._last = 0
        self.stats = {}

    # ------------------------------------------------------------ helpers
    def _name(self, seg):
        return "%s/%08d.seg" % (self.path, seg)

    @staticmethod
    def _seed(seg, off):
        return (seg * 0x9E3779B1 + off) & 0xFFFFFFFF

    # ------------------------------------------------------------ boot
    def open(self):
        self._load()
        self._budget()
        self.stats = {"segments": len(self._segs), "pending": self._n - self._lo, "budget": self._cap}
        # A first segment that cannot be made (a full filesystem) or a move that fails is not an
        # error at boot: the next write tries again (a board does not boot-loop over it).
        try:
            self._new_segment()
            self._gc()
            self._room(0)
        except OSError:
            pass
        return self

    def _load(self):
        """The segments read: the index, inbound ids and meta values they hold."""
        fs = self.fs
        try:
            names = fs.listdir(self.path)
        except OSError:
            fs.mkdir(self.path)
            names = []
        segs = []
        for n in names:
            if len(n) == 12 and n.endswith(".seg") and n[:8].isdigit():
                segs.append(int(n[:8]))
        segs.sort()
        if segs and segs[-1] - segs[0] > _SEGS // 2:  # the numbers wrapped: 99999999 comes before 1
            segs = [s for s in segs if s > _SEGS // 2] + [s for s in segs if s <= _SEGS // 2]
        ents = {}
        ins = {}
        self._ref = None  # record sequences wrap: the scan works on serial distances from the first
        self._bootlast = -0x80000001
        self._meta = {}  # (a recovery after a failed write boots again from scratch)
        self._rseq = 1
        self._last = 0
        self._sz = {}
        for seg in segs:
            self._scan(seg, ents, ins)
        ref = self._ref or 0
        if self._ref is not None:
            self._rseq = (self._rseq + ref) & 0xFFFFFFFF
        keys = sorted(ents)
        self._ipid = array("H", [0] * len(keys))
        self._iseg = array("I", [0] * len(keys))
        self._iaddr = array("I", [0] * len(keys))
        self._ilen = array("I", [0] * len(keys))
        self._irs = array("I", [0] * len(keys))
        self._lo = 0
        self._n = len(keys)
        self._segs = segs
        self._live = {}
        for s in segs:
            self._live[s] = 0
        mx = _E
        for i in range(len(keys)):
            e = ents[keys[i]]
            self._ipid[i] = e[0]
            self._iseg[i] = e[1]
            self._iaddr[i] = e[2]
            self._ilen[i] = e[3]
            self._irs[i] = (keys[i] + ref) & 0xFFFFFFFF
            self._live[e[1]] += e[3] + _E
            mx = max(mx, e[3] + _E)
        self._mx = mx
        self._in = {}
        for r in ins:
            pid, seg, off = ins[r]
            self._in[pid] = (seg, off, (r + ref) & 0xFFFFFFFF)
            self._live[seg] += _E
        for k in self._meta:
            m = self._meta[k]
            self._live[m[1]] += _E + 1 + len(k) + len(m[0])
        self._cur = 0
        self._f = None

    def _budget(self):
        """The byte budget of the segment files and the segment size (see the module doc)."""
        u = 1
        cap = 0
        try:
            st = self.fs.statvfs(self.path)
            u = self._u = st[1] or st[0]  # (_foot counts in these blocks)
            cap = (st[4] - _SPARE) * u + self._foot()
            if cap < 1:
                cap = 1
        except Exception:  # no statvfs here: only max_bytes bounds the store
            pass
        self._u = u
        if self.max_bytes and (not cap or self.max_bytes < cap):
            cap = self.max_bytes
        self._cap = cap
        self._seg = self._segfor(cap)
        m = self.max_bytes
        if m and not self._takes(m):
            # a budget that holds no message (its headroom and reserve take it all) is refused here,
            # not by every publish() as "outbox full"
            least = m + 1 if u <= 64 else (m // u + 1) * u  # (on blocks, it is a whole number of them)
            while not self._takes(least):
                least += 1 if u <= 64 else u
            raise ValueError("FileStore max_bytes=%d holds no message (headroom and reserve take it all): "
                             "at least %d%s" % (m, least, " with %d-byte blocks" % u if u > 1 else ""))

    def _segfor(self, cap):
        # a small filesystem gets small segments (the headroom is a segment's
        # worth); on blocks, a segment and an ack fill whole blocks
        s = self.segment_bytes
        u = self._u
        if cap and s > cap // 8:
            s = cap // 8
        if u > 64:
            s = max(s // (u - 64), 1) * (u - 64) - 2 * _E
        return max(s, 256)

    def _takes(self, cap):
        """Would an empty store with this budget take a 64-byte message (see _take and _room)?"""
        s = self._seg
        self._seg = self._segfor(cap)
        mx = 64 + _E
        q = self._seg - _E - mx
        k = 1 + _RSV // _E  # (as _need counts them)
        if q > 0 and (mx + _RSV) // q + 1 < k:
            k = (mx + _RSV) // q + 1
        h = self._head(mx)
        ok = k * self._blk(max(self._seg, mx + _E)) + self._u + h <= cap and self._blk(_E + mx) + h <= cap
        self._seg = s
        return ok

    def _scan(self, seg, ents, ins):
        self._sz[seg] = 0
        try:
            with self.fs.open(self._name(seg), "rb") as f:
                data = f.read()
        except OSError:
            self._say("segment %d unreadable: skipped" % seg)
            return
        h = self._hdr
        mv = memoryview(data)
        n = len(data)
        self._sz[seg] = n
        p = 0
        while p + _RH + 4 <= n:
            v = self._valid(seg, mv, p)
            ln = _u16(h, 2)
            if v == 1:
                self._say("segment %d: record at %d fails its CRC: skipped" % (seg, p))
                p += _RH + ln + 4
                continue
            if not v:
                q = self._resync(seg, mv, p + 1)
                if q < 0:
                    if p + _RH <= n and self.verbose:
                        self._say("segment %d: torn tail at %d ignored" % (seg, p))
                    return
                self._say("segment %d: unreadable bytes %d..%d skipped" % (seg, p, q))
                p = q
                continue
            self._record(seg, p, ln, mv, ents, ins)
            p += _RH + ln + 4

    def _resync(self, seg, mv, p):
        while p + _RH + 4 <= len(mv):
            if self._valid(seg, mv, p) == 2:
                return p
            p += 1
        return -1

    def _valid(self, seg, mv, p):
        """The record at p in mv, its header copied into self._hdr: 2 valid,
        1 a header that checks but a bad CRC, 0 none there."""
        h = self._hdr
        h[0:_RH] = mv[p : p + _RH]
        ln = _u16(h, 2)
        if not (
            (h[0] in _KINDS or T_INID <= h[0] <= T_SEG)
            and p + _RH + ln + 4 <= len(mv)
            and _u16(h, 10) == hcrc(h, 10, self._seed(seg, p)) & 0xFFFF
        ):
            return 0
        return 2 if _u32(mv, p + _RH + ln) == crc32(mv[p + _RH : p + _RH + ln], hcrc(h, 12, 0)) & 0xFFFFFFFF else 1

    def _record(self, seg, off, ln, mv, ents, ins):
        h = self._hdr
        t = h[0]
        fl = h[1]
        r = _u32(h, 4)
        if self._ref is None:
            self._ref = r
            self._rseq = 0
        r -= self._ref
        if r > 0x7FFFFFFF:
            r -= 0x100000000
        elif r < -0x80000000:
            r += 0x100000000
        pid = _u16(h, 8)
        if t == T_SEG:
            if r > self._rseq:
                self._rseq = r
            if r - 1 > self._bootlast:
                self._bootlast = r - 1
                self._last = pid
            return
        if t == T_OP:
            apply_op(ents, ins, fl, r, 2)
            return
        if t == T_INCLEAR:
            ins.clear()
            return
        if r >= self._rseq:
            self._rseq = r + 1
        if t in _KINDS:
            if not fl & F_RELOC and r > self._bootlast:
                self._bootlast = r
                self._last = pid
            if fl & F_RENUM:  # a stale record's copy: the original has its pid
                for k in list(ents):
                    if ents[k][0] == pid:
                        del ents[k]
            ents[r] = [pid, seg, (off << 3) | (_KINDS.index(t) << 1) | (1 if fl & F_MARKED else 0), ln]
        elif t == T_INID:
            if fl & F_RENUM:
                for k in list(ins):
                    if ins[k][0] == pid:
                        del ins[k]
            ins[r] = (pid, seg, off)
        elif t == T_META:
            self._meta_rec(mv[off + _RH : off + _RH + ln], r, seg, off)

    # ------------------------------------------------------------ segments
    def _new_segment(self):
        if self._unk is not None:
            self._retry()
        if self._f is not None:
            self._sync()
            self._f.close()
            self._f = None
        if self._cur:
            self._sz[self._cur] = self._off
        self._cur = 0  # (none open until its file exists)
        seg = (self._segs[-1] % _SEGS + 1) if self._segs else 1
        try:
            self._f = self.fs.open(self._name(seg), "wb")
        except Exception as e:
            # Listed only once its file exists: a name without a file (the
            # filesystem full) would stop garbage collection there for good.
            self._fail(e)
        self._segs.append(seg)
        self._live[seg] = 0
        self._cur = seg
        self._off = self._soff = 0
        self._emit(T_SEG, 0, self._rseq, self._last, b"", b"")
        self._sync()
        self._soff = 0  # (nothing in it counts until its name is durable too)
        try:
            self.fs.sync_dir(self.path)
        except Exception as e:
            self._fail(e)
        self._soff = self._off

    def _emit(self, t, flags, rseq, pid, head, body):
        """Write one record at the end of the current segment (a new one if it
        would go past the segment size, or none is open); returns its offset."""
        lh = len(head)
        ln = lh + len(body)
        if self._f is None or (self._off > _E and self._off + ln + _E > self._seg):
            self._new_segment()
        off = self._off
        h2 = self._hdr
        make_header(h2, t, flags, ln, rseq, pid, self._seed(self._cur, off))
        c = crc32(body, crc32(head, hcrc(h2, 12, 0))) & 0xFFFFFFFF
        _put32(self._crcb, 0, c)
        f = self._f
        self.dirty = True
        try:
            f.write(h2)
            if lh:
                f.write(head)
            if ln - lh:
                f.write(body)
            f.write(self._crcb)
        except Exception as e:
            self._fail(e)
        self._off = off + _RH + ln + 4
        return off

    def _sync(self):
        if self._off > self._soff and self._f is not None:  # (not `dirty`: it also says the session is to follow)
            try:
                self.fs.sync_file(self._f)
            except Exception as e:
                self._fail(e)
            self._soff = self._off
        self.dirty = self.seen != self.epoch

    def _fail(self, e):
        """A write, sync or create failed (see the module doc): the current segment's bytes past
        its last good sync voided, the segments read again; then raise e (ENOSPC as "outbox full
        (filesystem)"), or OutboxUnknown when that could not be done. No segment is left open:
        the next write opens one."""
        e = _oserror(e)
        if self._busy or not isinstance(e, OSError):  # (while voiding: the outer call says unknown)
            raise e
        f = self._f
        self._f = None
        if f is not None:
            try:
                f.close()
            except Exception:
                pass
        if self._cur:  # (what a failed write left there is past _off: _void looks at the file)
            self._vseg = self._cur
            self._voff = self._soff
        self._cur = 0
        self._unk = e
        self._retry()
        if e.args and e.args[0] == ENOSPC:
            raise OSError(ENOSPC, "outbox full (filesystem)")
        raise e

    def _again(self, lo, n):
        # (Log._retry's work: void what is to be voided, read the segments again; a filesystem
        # object's own error, littlefs-python's from a file's write, as OSError)
        try:
            if self._vseg:
                self._void(self._vseg, self._voff)
                self._vseg = 0
            self._load()
        except Exception as e:
            raise _oserror(e)

    def _set_unknown(self, e):
        # (nothing is written until the segments are read again: every change starts with _known)
        self._unk = e
        self.epoch += 1  # (what RAM says is not what the files hold: the session follows once it is)
        self.dirty = True

    def _void(self, seg, at):
        """Zeros over segment seg from `at` to its end, synced: no record there is read again."""
        try:
            f = self.fs.open(self._name(seg), "r+b")
        except OSError as e:
            if e.args and e.args[0] == ENOENT:
                return  # never made: nothing to void
            raise
        try:
            end = f.seek(0, 2)
            if end > at:
                f.seek(at)
                z = bytes(256)
                while at < end:
                    k = end - at if end - at < 256 else 256
                    f.write(z if k == 256 else z[:k])
                    at += k
                self.fs.sync_file(f)
        finally:
            f.close()

    def _done(self):
        """End of one change: durable now unless group commit defers it."""
        if not self.group:
            self._sync()

    # ------------------------------------------------------------ capacity
    def _blk(self, x):
        """Bytes a file of x bytes takes: whole blocks of u - 64 data bytes."""
        d = self._u - 64
        return (x + d - 1) // d * self._u if d > 0 else x

    def _foot(self):
        t = 0
        for s in self._segs:
            t += self._blk(self._off if s == self._cur else self._sz.get(s, 0))
        return t

    def _mv(self, n):
        """What moving n live bytes forward may add: a new segment, and a block
        more of the current one where segments span blocks."""
        return self._blk(n + _E) + (self._u if self._seg > self._u - 64 else 0)

    def _head(self, mx):
        """Headroom kept free: moving the largest segment forward, twice (a
        power cut may stop a move half-way, and the boot after it opens a
        segment before the move is done again)."""
        return 2 * self._mv(max(self._seg, mx + _E)) + self._blk(_E)

    def _fits(self, w):
        o = self._off
        if self._f is None or (o > _E and o + w > self._seg):
            g = self._blk(w + _E)
        else:
            g = self._blk(o + w) - self._blk(o)
        return self._foot() + g + self._head(self._mx) <= self._cap

    def _room(self, w):
        """Before writing w bytes: move the oldest segments' live records
        forward and delete them while the files are near the budget."""
        if not self._cap:
            return True
        for _ in range(4 * len(self._segs) + 8):
            if self._fits(w):
                return True
            old = self._segs[0]
            if old == self._cur:
                self._new_segment()
                continue
            if self._foot() + self._mv(self._live[old]) > self._cap:
                return False  # (only where the budget shrank since these were written)
            self._relocate(old)
            if not self._drop(old):
                return False
        return self._fits(w)

    def _take(self, n, old=0, rsv=0):
        """Room for a live record of n bytes (replacing one of `old` bytes,
        leaving rsv more) or OSError(ENOSPC): see Capacity in the module doc."""
        if not self._cap:
            return
        mx = max(self._mx, n)
        k = self._need(n - old + rsv + self._lv(), (0 if old else 1) + rsv // _E, mx)
        if k * self._blk(max(self._seg, mx + _E)) + self._u + self._head(mx) > self._cap:
            raise OSError(ENOSPC, "outbox full")
        self._mx = mx
        if not self._room(n):
            raise OSError(ENOSPC, "outbox full")

    def _need(self, lv, more, mx):
        """Segments that lv live bytes take once moved forward: a closed one
        holds more than q of them; at most one a live record anyway."""
        q = self._seg - _E - mx
        k = self._n - self._lo + len(self._in) + len(self._meta) + more
        return lv // q + 1 if q > 0 and lv // q + 1 < k else k

    def _lv(self):
        t = 0
        for s in self._live:
            t += self._live[s]
        return t

    def _drop(self, old):
        """Delete the oldest segment (nothing in it is live)."""
        if self._unk is not None:
            return False
        self._sync()  # the copies (and releases) are durable before the delete
        try:
            self.fs.remove(self._name(old))
        except OSError as e:
            if not e.args or e.args[0] != ENOENT:  # (gone: removed by a call that raised after)
                return False  # still there: tried again later (what it releases must outlive it)
        self._segs.pop(0)
        self._live.pop(old, None)
        self._sz.pop(old, None)
        try:
            self.fs.sync_dir(self.path)
        except OSError:
            pass  # if it comes back at a power cut, it holds nothing live
        return True

    def _gc(self):
        """Delete dead segments, oldest first; move stuck records when too many."""
        moved = False
        while len(self._segs) > 1:
            old = self._segs[0]
            if old == self._cur:
                return
            if self._live.get(old, 0):
                # (not while the live records need that many segments: no churn)
                if moved or len(self._segs) <= max(self.max_segments, self._need(self._lv(), 0, self._mx) + 1):
                    return
                if self._cap and self._foot() + self._mv(self._live[old]) > self._cap:
                    return
                self._relocate(old)
                moved = True
            if not self._drop(old):
                return

    def _copy(self, seg, off, flags):
        """Re-append the record at (seg, off) with new flags; returns the new offset or -1."""
        h = self._hdr
        with self.fs.open(self._name(seg), "rb") as f:
            f.seek(off)
            if (f.readinto(h) or 0) < _RH:
                return -1
            ln = _u16(h, 2)
            rest = f.read(ln + 4)
        if len(rest) < ln + 4:
            return -1
        if crc32(memoryview(rest)[0:ln], hcrc(h, 12, 0)) & 0xFFFFFFFF != _u32(rest, ln):
            self._say("segment %d: record at %d went bad: dropped" % (seg, off))
            return -1
        r = _u32(h, 4)
        if (self._rseq - r) & 0xFFFFFFFF >= _STALE:  # (see STALE in logrec)
            r = self._rseq
            self._rseq = (r + 1) & 0xFFFFFFFF
            flags |= F_RENUM
        self._cr = r
        return self._emit(h[0], (h[1] & ~(F_RELOC | F_MARKED | F_RENUM)) | flags, r, _u16(h, 8), b"", rest[0:ln])

    def _relocate(self, seg):
        """Copy every live record of seg forward (the copies may open new segments)."""
        for i in range(self._lo, self._n):
            if self._ipid[i] and self._iseg[i] == seg:
                o = self._iaddr[i]
                n = self._ilen[i] + _E
                no = self._copy(seg, o >> 3, F_RELOC | (F_MARKED if o & 1 else 0))
                self._live[seg] -= n
                if no < 0:
                    self._hole(i)
                    continue
                self._iseg[i] = self._cur
                self._iaddr[i] = (no << 3) | (o & 7)
                self._irs[i] = self._cr
                self._live[self._cur] += n
        for pid in list(self._in):
            s, o, r = self._in[pid]
            if s == seg:
                no = self._copy(seg, o, F_RELOC)
                self._live[seg] -= _E
                if no < 0:
                    del self._in[pid]
                    continue
                self._in[pid] = (self._cur, no, self._cr)
                self._live[self._cur] += _E
        for k in self._meta:
            m = self._meta[k]
            if m[1] == seg:
                n = _E + 1 + len(k) + len(m[0])
                no = self._copy(seg, m[2], F_RELOC)
                self._live[seg] -= n
                if no >= 0:
                    m[1] = self._cur
                    m[2] = no
                    m[3] = self._cr
                    self._live[self._cur] += n

    # ------------------------------------------------------------ index
    def _hole(self, i):
        self._ipid[i] = 0
        while self._lo < self._n and not self._ipid[self._lo]:
            self._lo += 1
        if self._lo > 64 and self._lo * 2 > self._n:
            lo = self._lo
            self._ipid = self._ipid[lo:]
            self._iseg = self._iseg[lo:]
            self._iaddr = self._iaddr[lo:]
            self._ilen = self._ilen[lo:]
            self._irs = self._irs[lo:]
            self._n -= lo
            self._lo = 0

    # ------------------------------------------------------------ contract
    def _known(self):
        # Every change starts from a known state: after a failure left it unknown, the segments
        # are read again first (OutboxUnknown while that fails).
        if self._unk is not None:
            self._retry()

    def append(self, kind, pid, head, body=b""):
        self._known()
        kc = self._check(kind, pid)
        n = len(head) + len(body)
        if n > 65535:  # the record's length field: a longer one would not read back
            raise ValueError("record of %d bytes over 65535" % n)
        self._take(n + _E, 0, _RSV)
        r = self._rseq
        off = self._emit(kind, 0, r, pid, head, body)
        self._rseq = (self._rseq + 1) & 0xFFFFFFFF
        self._last = pid
        self._ipid.append(pid)
        self._iseg.append(self._cur)
        self._iaddr.append((off << 3) | (kc << 1))
        self._ilen.append(n)
        self._irs.append(r)
        self._n += 1
        self._live[self._cur] += n + _E
        self._done()

    def _setmark(self, pid, want):
        self._known()
        if self._iaddr[self._get(pid)] & 1 == want:
            return
        self._room(_E)
        i = self._get(pid)  # (the room made may have moved it)
        self._emit(T_OP, OP_MARK if want else OP_UNMARK, self._irs[i], pid, b"", b"")
        self._iaddr[i] = (self._iaddr[i] & ~1) | want
        self._done()

    def release(self, pid):
        self._known()
        if not self.has(pid):
            return
        self._room(_E)
        i = self._find(pid)
        if i < 0:  # (a record that went bad while being moved)
            return
        self._emit(T_OP, OP_RELEASE, self._irs[i], pid, b"", b"")
        self._live[self._iseg[i]] -= self._ilen[i] + _E
        self._hole(i)
        self._done()
        self._gc()

    def size(self, pid):
        return self._ilen[self._get(pid)]

    def read(self, pid, offset, buf):
        i = self._get(pid)
        ln = self._ilen[i]
        n = ln - offset
        if n <= 0:
            return 0
        if n > len(buf):
            n = len(buf)
        if self._iseg[i] == self._cur:
            self._sync()
        with self.fs.open(self._name(self._iseg[i]), "rb") as f:
            f.seek((self._iaddr[i] >> 3) + _RH + offset)
            got = f.readinto(buf if n == len(buf) else memoryview(buf)[0:n])
        return got or 0

    def count(self):
        c = 0
        for i in range(self._lo, self._n):
            if self._ipid[i]:
                c += 1
        return c

    def in_add(self, pid):
        self._known()
        if pid in self._in:
            return
        self._take(_E)
        r = self._rseq
        off = self._emit(T_INID, 0, r, pid, b"", b"")
        self._rseq = (self._rseq + 1) & 0xFFFFFFFF
        self._in[pid] = (self._cur, off, r)
        self._live[self._cur] += _E
        self._done()

    def in_has(self, pid):
        return pid in self._in

    def in_release(self, pid):
        self._known()
        if pid not in self._in:
            return
        self._room(_E)
        e = self._in[pid]
        self._emit(T_OP, OP_INREL, e[2], pid, b"", b"")
        del self._in[pid]
        self._live[e[0]] -= _E
        self._done()
        self._gc()

    def in_clear(self):
        self._known()
        if not self._in:
            return
        self._room(_E)
        self._emit(T_INCLEAR, 0, self._rseq, 0, b"", b"")
        self._rseq = (self._rseq + 1) & 0xFFFFFFFF
        for pid in self._in:
            self._live[self._in[pid][0]] -= _E
        self._in = {}
        self._done()
        self._gc()

    def set_meta(self, key, value):
        self._known()
        kv = self._meta_kv(key, value)
        if kv is None:
            return
        k, v, cur = kv
        n = _E + 1 + len(k)
        self._take(n + len(v), 0 if cur is None else n + len(cur[0]))
        r = self._rseq
        off = self._emit(T_META, 0, r, 0, bytes((len(k),)) + k, v)
        self._rseq = (self._rseq + 1) & 0xFFFFFFFF
        cur = self._meta.get(k)  # (the room made may have moved the old one)
        self._meta[k] = [v, self._cur, off, r]
        self._live[self._cur] += n + len(v)
        if cur is not None:
            self._live[cur[1]] -= n + len(cur[0])
        self._done()
        self._gc()

    def commit(self):
        self._known()
        self._sync()

    def close(self):
        if self._f is not None:
            self._sync()
            self._f.close()
            self._f = None
