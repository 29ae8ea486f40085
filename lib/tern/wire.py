"""Wire primitives every packet is made of, and the one error the codec raises.

Kept separate from the packet layouts so the session's zero-allocation paths can
use them without pulling in the general codec. Every read is bound-checked
against the end of the packet before it touches the buffer, so a lying length
can only ever produce an MQTTError, never an IndexError or a large allocation.
"""

try:
    from micropython import const
except ImportError:  # CPython

    def const(x):
        return x


# Control packet types (fixed header bits 7-4).
CONNECT = const(1)
CONNACK = const(2)
PUBLISH = const(3)
PUBACK = const(4)
PUBREC = const(5)
PUBREL = const(6)
PUBCOMP = const(7)
SUBSCRIBE = const(8)
SUBACK = const(9)
UNSUBSCRIBE = const(10)
UNSUBACK = const(11)
PINGREQ = const(12)
PINGRESP = const(13)
DISCONNECT = const(14)
AUTH = const(15)

# Protocol levels.
V31 = const(3)
V311 = const(4)
V5 = const(5)

# The reason codes the codec itself raises with.
MALFORMED = const(0x81)
PROTOCOL_ERROR = const(0x82)
TOPIC_NAME_INVALID = const(0x90)
PACKET_TOO_LARGE = const(0x95)

VARINT_MAX = const(268435455)


class MQTTError(Exception):
    """Bad input from the peer; `code` is the MQTT 5 reason code to disconnect with."""

    def __init__(self, code, msg):
        # super(), not Exception.__init__: MicroPython's Exception has no
        # __init__ attribute to call, so the explicit form raised
        # AttributeError there instead of this error.
        super().__init__(msg)
        self.code = code

    def __str__(self):
        return "%s (reason 0x%02X)" % (self.args[0], self.code)


def fail(msg, code=MALFORMED):
    """Raise the codec's error: a malformed packet, or (code=PROTOCOL_ERROR) a
    protocol error; one place for the prefix, so each site names only the problem."""
    raise MQTTError(code, ("malformed packet: " if code == MALFORMED else "protocol error: ") + msg)


def check(what, n, lo, hi):
    """n when lo <= n <= hi; else a ValueError naming what was out of range."""
    if n < lo or n > hi:
        raise ValueError("%s not in %d..%d: %r" % (what, lo, hi, n))
    return n


def varint_size(n):
    if n < 128:
        return 1
    if n < 16384:
        return 2
    if n < 2097152:
        return 3
    return 4


def put_varint(buf, pos, n):
    """Write n as a variable byte integer at pos; return the position after it."""
    check("variable byte integer", n, 0, VARINT_MAX)
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            buf[pos] = b | 0x80
            pos += 1
        else:
            buf[pos] = b
            return pos + 1


def get_varint(buf, pos, end):
    """Decode a variable byte integer; -1 when buf ends before it does.

    Only the value is returned (no tuple, so no allocation); its length is
    `varint_size(value)` because non-minimal encodings are rejected, as MQTT
    requires. A fifth byte is malformed.
    """
    n = 0
    shift = 0
    while True:
        if pos >= end:
            return -1
        b = buf[pos]
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            if b == 0 and shift:
                fail("invalid variable byte integer")
            return n
        shift += 7
        pos += 1
        if shift == 28:
            fail("invalid variable byte integer")


def put_u16(buf, pos, n):
    buf[pos] = n >> 8
    buf[pos + 1] = n & 0xFF
    return pos + 2


def put_data(buf, pos, data):
    """Two-byte length then the bytes (UTF-8 string or binary data)."""
    n = len(data)
    pos = put_u16(buf, pos, n)
    buf[pos : pos + n] = data
    return pos + n


def check_utf8(b, i, end):
    """Raise unless b[i:end] is well-formed UTF-8 as MQTT allows it.

    Rejects overlong forms, surrogates (U+D800..U+DFFF), code points above
    U+10FFFF and U+0000. Works on both runtimes the same way and allocates
    nothing, so it can run on every received topic.
    """
    while i < end:
        c = b[i]
        i += 1
        if c < 0x80:
            if not c:
                fail("U+0000 in a UTF-8 string")
            continue
        # n continuation bytes follow; the first must be in lo..hi, which
        # rules out overlong forms (E0, F0), surrogates (ED) and > U+10FFFF (F4).
        n = 1 if c < 0xE0 else 2 if c < 0xF0 else 3
        lo = 0xA0 if c == 0xE0 else 0x90 if c == 0xF0 else 0x80
        hi = 0x9F if c == 0xED else 0x8F if c == 0xF4 else 0xBF
        if c < 0xC2 or c > 0xF4 or i + n > end or b[i] < lo or b[i] > hi:
            fail("invalid UTF-8")
        k = 1
        while k < n:
            if b[i + k] & 0xC0 != 0x80:
                fail("invalid UTF-8")
            k += 1
        i += n


def utf8(s):
    """Encode a user-supplied string for the wire, with MQTT's rules checked."""
    if isinstance(s, str):
        b = s.encode()
    else:
        b = bytes(s)
    check("string length", len(b), 0, 65535)
    try:
        check_utf8(b, 0, len(b))
    except MQTTError as e:
        raise ValueError("invalid string for MQTT: " + e.args[0])
    return b


class Reader:
    """Cursor over one received packet body; every read checks the bound first."""

    def __init__(self, buf, pos, end):
        self.buf = buf
        self.pos = pos
        self.end = end

    def need(self, n):
        """Raise unless n more bytes are there; return where they start."""
        p = self.pos
        if p + n > self.end:
            fail("truncated")
        return p

    def u8(self):
        p = self.need(1)
        self.pos = p + 1
        return self.buf[p]

    def u16(self):
        p = self.need(2)
        self.pos = p + 2
        return self.buf[p] << 8 | self.buf[p + 1]
