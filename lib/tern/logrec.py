"""The record format FlashStore and FileStore share, and what they do the same
way (class Log: the index of pending messages, append's checks, meta values),
so a board that uses only one of them loads only its own code plus this.

A record: 16-byte header (type, flags, body length, record sequence, packet id,
header check, four status bytes), the body, CRC-32 over header (status bytes
read as 0xFF) and body. The header check is a CRC of the header seeded
with where the record lives, so a copy of a header inside a payload never passes
for a real one. Integers are little-endian.
"""

from binascii import crc32
from struct import pack_into

from .wire import const, PUBLISH, SUBSCRIBE, UNSUBSCRIBE

RH = const(16)  # record header bytes
EIO = const(5)

T_INID = const(0x30)
T_META = const(0x31)
T_OP = const(0x32)
T_INCLEAR = const(0x33)
T_FLOOR = const(0x34)

F_RELOC = const(1)
F_MARKED = const(2)
F_RENUM = const(4)  # a relocated copy under a fresh sequence (see STALE)

OP_MARK = const(1)
OP_UNMARK = const(2)
OP_RELEASE = const(3)
OP_INREL = const(4)

KINDS = (PUBLISH, SUBSCRIBE, UNSUBSCRIBE)  # message records: the kind code is the index,
# which is kind // 3 - 1 for these three (3, 8, 10): _check returns it so (cheaper than KINDS.index)

# Record sequences are 32-bit and wrap: a boot scan orders records by their
# serial distance (RFC 1982) from the newest, exact while every record it reads
# is less than 2^30 behind (so the distances are small integers on a board).
# A relocation keeps a record's sequence, which keeps the outbox order, unless
# the record is STALE: 2^28 or more behind the next sequence; then the copy
# takes a fresh one and F_RENUM, and a scan that still finds the original (a
# power cut before it was voided) keeps only the copy. Every live record is
# relocated at least once per turn of the log (under 2^28 records: 65,535
# sectors of 64 KiB; FileStore's segment files, up to 6 GiB), and a dead one
# is gone a turn after it died, so nothing a scan reads is 3 * 2^28 behind.
# A refreshed message goes behind the others at the next boot: one the broker
# left unacknowledged while 268 million later records were written.
STALE = const(0x10000000)


class OutboxUnknown(OSError):
    """A storage operation failed, and so did reading the medium again: what the failed call
    wrote may or may not be there, and the store takes nothing until it has read its state
    (lib/tern/store.py, "When storage fails"). errno EIO."""


def unknown(e):
    return OutboxUnknown(EIO, "outbox state unknown: the message may still be sent (%s)" % (e,))


def sd(a, b):
    """Serial difference a - b of two 32-bit sequences, in -2^31..2^31-1."""
    d = (a - b) & 0xFFFFFFFF
    return d - 0x100000000 if d & 0x80000000 else d


def u16(b, i):
    return b[i] | (b[i + 1] << 8)


def u32(b, i):
    return b[i] | (b[i + 1] << 8) | (b[i + 2] << 16) | (b[i + 3] << 24)


def put32(b, i, v):
    b[i] = v & 0xFF
    b[i + 1] = (v >> 8) & 0xFF
    b[i + 2] = (v >> 16) & 0xFF
    b[i + 3] = (v >> 24) & 0xFF


def hcrc(h, i, seed):
    """CRC-32 of header h with bytes i to 15 read as 0xFF; h is left as it
    was and nothing is allocated (one statement per byte: a tuple swap would
    allocate on MicroPython, a loop is slower at boot). i = 10: the header
    check (its low 16 bits, seeded with where the record lives); i = 12,
    seed 0: where the record's CRC-32 starts (go on over the body)."""
    a = h[10]
    b = h[11]
    c = h[12]
    d = h[13]
    e = h[14]
    f = h[15]
    if i == 10:
        h[10] = h[11] = 0xFF
    h[12] = h[13] = h[14] = h[15] = 0xFF
    v = crc32(h, seed)
    h[10] = a
    h[11] = b
    h[12] = c
    h[13] = d
    h[14] = e
    h[15] = f
    return v


def make_header(h, t, flags, ln, rseq, pid, seed):
    """Fill the preallocated 16-byte header h (status bytes left erased)."""
    # one pack_into, not a Python call per field: a third of an append's header work on a board
    pack_into("<BBHIH", h, 0, t, flags, ln, rseq & 0xFFFFFFFF, pid)
    h[12] = h[13] = h[14] = h[15] = 0xFF
    pack_into("<H", h, 10, hcrc(h, 10, seed) & 0xFFFF)


def apply_op(ents, ins, fl, r, i):
    """Replay an op record at boot: what it does to the scanned entries
    (rseq -> list whose item i holds the mark bit) and inbound ids."""
    if fl == OP_INREL:
        ins.pop(r, None)
        return
    e = ents.get(r)
    if e is None:
        return
    if fl == OP_RELEASE:
        del ents[r]
    elif fl == OP_MARK:
        e[i] |= 1
    elif fl == OP_UNMARK:
        e[i] &= ~1



class Log:
    """What FileStore and FlashStore keep the same way (see lib/tern/store.py
    for the contract). A store sets:
    - the index of pending messages, in record-sequence order: arrays _ipid
      (packet id, 0 = a hole) and _iaddr (where the record is, its low 3 bits
      kind code << 1 | marked), live from _lo to _n;
    - _meta: key bytes -> [value, where, where, record sequence];
    - _last: the newest appended packet id; and _setmark(pid, want);
    - verbose (True, False, or a function that takes each warning), and _tag:
      what its warnings start with."""

    durable = True
    epoch = seen = 0  # (store.py: the medium read again after a failure, and the session following)
    # What follows a failure (class attributes until one comes: an instance's map stays the size
    # every attribute lookup of the steady path pays for): the error that left the state unknown,
    # and True while the medium is being read again.
    _unk = None
    _busy = False

    def reserve(self, n):
        pass

    def _retry(self, lo=0, n=0):
        """Read the medium again (the state being unknown, or after a failed write: _again's
        work, which voids what the store says); OutboxUnknown while that fails, the state then
        unknown (see store.py, "When storage fails")."""
        self._busy = True
        try:
            self._again(lo, n)
        except OSError as e:
            self._set_unknown(e)
            raise unknown(e)
        finally:
            self._busy = False
        self._unk = None
        self.epoch += 1
        self.dirty = True

    def _say(self, msg):
        v = self.verbose  # True: printed; a function: called with each notice
        if v:
            (v if callable(v) else print)(self._tag + msg)

    def _find(self, pid):
        ip = self._ipid
        for i in range(self._lo, self._n):
            if ip[i] == pid:
                return i
        return -1

    def _get(self, pid):
        i = self._find(pid) if pid else -1
        if i < 0:
            raise KeyError(pid)
        return i

    def _check(self, kind, pid):
        """append's checks on its arguments; the kind's code."""
        if kind not in KINDS:
            raise ValueError("record kind %r" % (kind,))
        if not 0 < pid < 65536:
            raise ValueError("packet identifier %r" % (pid,))
        if self._find(pid) >= 0:
            raise ValueError("packet identifier %d already pending" % pid)
        return kind // 3 - 1

    def mark(self, pid):
        self._setmark(pid, 1)

    def unmark(self, pid):
        self._setmark(pid, 0)

    def pending(self):
        ip = self._ipid
        return [ip[i] for i in range(self._lo, self._n) if ip[i]]

    def has(self, pid):
        return bool(pid) and self._find(pid) >= 0

    def kind(self, pid):
        return KINDS[(self._iaddr[self._get(pid)] >> 1) & 3]

    def marked(self, pid):
        return bool(self._iaddr[self._get(pid)] & 1)

    def meta(self, key):
        m = self._meta.get(key.encode() if isinstance(key, str) else bytes(key))
        return None if m is None else m[0]

    def _meta_kv(self, key, value):
        """set_meta's checks: (key bytes, value bytes, current entry), or None
        when the value is already that."""
        k = key.encode() if isinstance(key, str) else bytes(key)
        v = bytes(value)
        if len(k) > 255:
            raise ValueError("meta key too long")
        cur = self._meta.get(k)
        if cur is not None and cur[0] == v:
            return None
        return k, v, cur

    def _meta_rec(self, body, r, a, b):
        """A META record (body: key length, key, value) read at boot, kept
        where it is the newest for its key; False if malformed."""
        ln = len(body)
        kl = body[0] if ln else 0
        if ln < 1 or kl > ln - 1:
            return False
        key = bytes(body[1 : 1 + kl])
        cur = self._meta.get(key)
        if cur is None or r >= cur[3]:
            self._meta[key] = [bytes(body[1 + kl :]), a, b, r]
        return True

    def last_pid(self):
        return self._last
