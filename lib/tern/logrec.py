"""The record format FlashStore and FileStore share, so a board that uses only
one of them loads only its own code plus this.

A record: 16-byte header (type, flags, body length, record sequence, packet id,
header check, four status bytes), the body, CRC-32 over header (status bytes
read as 0xFF) and body. The header check is a CRC of the header seeded
with where the record lives, so a copy of a header inside a payload never passes
for a real one. Integers are little-endian.
"""

from binascii import crc32

from .wire import const

RH = const(16)  # record header bytes

T_INID = const(0x30)
T_META = const(0x31)
T_OP = const(0x32)
T_INCLEAR = const(0x33)
T_FLOOR = const(0x34)

F_RELOC = const(1)
F_MARKED = const(2)

OP_MARK = const(1)
OP_UNMARK = const(2)
OP_RELEASE = const(3)
OP_INREL = const(4)


def u16(b, i):
    return b[i] | (b[i + 1] << 8)


def u32(b, i):
    return b[i] | (b[i + 1] << 8) | (b[i + 2] << 16) | (b[i + 3] << 24)


def put16(b, i, v):
    b[i] = v & 0xFF
    b[i + 1] = (v >> 8) & 0xFF


def put32(b, i, v):
    b[i] = v & 0xFF
    b[i + 1] = (v >> 8) & 0xFF
    b[i + 2] = (v >> 16) & 0xFF
    b[i + 3] = (v >> 24) & 0xFF


def header_check(h, seed):
    """CRC-16 of header h with its check and status bytes (10..15) read as 0xFF."""
    # (one statement per byte: a tuple swap would allocate on MicroPython)
    a = h[10]
    b = h[11]
    c = h[12]
    d = h[13]
    e = h[14]
    f = h[15]
    h[10] = h[11] = h[12] = h[13] = h[14] = h[15] = 0xFF
    v = crc32(h, seed) & 0xFFFF
    h[10] = a
    h[11] = b
    h[12] = c
    h[13] = d
    h[14] = e
    h[15] = f
    return v


def make_header(h, t, flags, ln, rseq, pid, seed):
    """Fill the preallocated 16-byte header h (status bytes left erased)."""
    h[0] = t
    h[1] = flags
    put16(h, 2, ln)
    put32(h, 4, rseq)
    put16(h, 8, pid)
    h[12] = h[13] = h[14] = h[15] = 0xFF
    put16(h, 10, header_check(h, seed))


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
