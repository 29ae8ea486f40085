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


def fail(msg):
    raise MQTTError(MALFORMED, "malformed packet: " + msg)


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
    if n < 0 or n > VARINT_MAX:
        raise ValueError("variable byte integer out of range: %d" % n)
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
                fail("variable byte integer not minimally encoded")
            return n
        shift += 7
        pos += 1
        if shift == 28:
            fail("variable byte integer longer than 4 bytes")


def put_u16(buf, pos, n):
    buf[pos] = n >> 8
    buf[pos + 1] = n & 0xFF
    return pos + 2


def put_u32(buf, pos, n):
    buf[pos] = (n >> 24) & 0xFF
    buf[pos + 1] = (n >> 16) & 0xFF
    buf[pos + 2] = (n >> 8) & 0xFF
    buf[pos + 3] = n & 0xFF
    return pos + 4


def put_data(buf, pos, data):
    """Two-byte length then the bytes (UTF-8 string or binary data)."""
    n = len(data)
    buf[pos] = n >> 8
    buf[pos + 1] = n & 0xFF
    pos += 2
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
        if c < 0x80:
            if c == 0:
                fail("U+0000 in a UTF-8 string")
            i += 1
            continue
        lo = 0x80
        hi = 0xBF
        if c < 0xC2:
            fail("invalid UTF-8 lead byte")
        elif c < 0xE0:
            n = 1
        elif c < 0xF0:
            n = 2
            if c == 0xE0:
                lo = 0xA0
            elif c == 0xED:
                hi = 0x9F  # surrogates
        elif c < 0xF5:
            n = 3
            if c == 0xF0:
                lo = 0x90
            elif c == 0xF4:
                hi = 0x8F
        else:
            fail("invalid UTF-8 lead byte")
        if i + n >= end:
            fail("truncated UTF-8 sequence")
        c = b[i + 1]
        if c < lo or c > hi:
            fail("invalid UTF-8 sequence")
        k = 2
        while k <= n:
            if b[i + k] & 0xC0 != 0x80:
                fail("invalid UTF-8 continuation")
            k += 1
        i += n + 1


def utf8(s):
    """Encode a user-supplied string for the wire, with MQTT's rules checked."""
    if isinstance(s, str):
        b = s.encode()
    else:
        b = bytes(s)
    if len(b) > 65535:
        raise ValueError("string longer than 65535 bytes")
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

    def left(self):
        return self.end - self.pos

    def need(self, n):
        if self.pos + n > self.end:
            fail("truncated")

    def u8(self):
        self.need(1)
        self.pos += 1
        return self.buf[self.pos - 1]

    def u16(self):
        self.need(2)
        b = self.buf
        p = self.pos
        self.pos = p + 2
        return b[p] << 8 | b[p + 1]

    def u32(self):
        self.need(4)
        b = self.buf
        p = self.pos
        self.pos = p + 4
        return b[p] << 24 | b[p + 1] << 16 | b[p + 2] << 8 | b[p + 3]

    def varint(self):
        n = get_varint(self.buf, self.pos, self.end)
        if n < 0:
            fail("truncated variable byte integer")
        self.pos += varint_size(n)
        return n

    def binary(self):
        n = self.u16()
        self.need(n)
        p = self.pos
        self.pos = p + n
        return bytes(self.buf[p : p + n])

    def string(self):
        n = self.u16()
        self.need(n)
        p = self.pos
        check_utf8(self.buf, p, p + n)
        self.pos = p + n
        return str(self.buf[p : p + n], "utf-8")

    def rest(self):
        """The remaining bytes as a view into the buffer (no copy)."""
        p = self.pos
        self.pos = self.end
        return memoryview(self.buf)[p : self.end]
