"""MQTT 5 properties: their wire types, which packets may carry them, and the
rules about repeats and values.

Properties travel as a dict {identifier: value}. User Property (0x26) is always
a list of (name, value) pairs; Subscription Identifier (0x0B) is a list in
PUBLISH (the server may send several) and an int in SUBSCRIBE. The table is
kept as 3 bytes per property so it costs little RAM on a board.
"""

from .wire import (
    const,
    MQTTError,
    PROTOCOL_ERROR,
    fail,
    put_varint,
    put_u16,
    put_u32,
    put_data,
    varint_size,
    utf8,
    get_varint,
    check_utf8,
    PUBLISH,
)

PAYLOAD_FORMAT_INDICATOR = const(0x01)
MESSAGE_EXPIRY_INTERVAL = const(0x02)
CONTENT_TYPE = const(0x03)
RESPONSE_TOPIC = const(0x08)
CORRELATION_DATA = const(0x09)
SUBSCRIPTION_IDENTIFIER = const(0x0B)
SESSION_EXPIRY_INTERVAL = const(0x11)
ASSIGNED_CLIENT_IDENTIFIER = const(0x12)
SERVER_KEEP_ALIVE = const(0x13)
AUTHENTICATION_METHOD = const(0x15)
AUTHENTICATION_DATA = const(0x16)
REQUEST_PROBLEM_INFORMATION = const(0x17)
WILL_DELAY_INTERVAL = const(0x18)
REQUEST_RESPONSE_INFORMATION = const(0x19)
RESPONSE_INFORMATION = const(0x1A)
SERVER_REFERENCE = const(0x1C)
REASON_STRING = const(0x1F)
RECEIVE_MAXIMUM = const(0x21)
TOPIC_ALIAS_MAXIMUM = const(0x22)
TOPIC_ALIAS = const(0x23)
MAXIMUM_QOS = const(0x24)
RETAIN_AVAILABLE = const(0x25)
USER_PROPERTY = const(0x26)
MAXIMUM_PACKET_SIZE = const(0x27)
WILDCARD_SUBSCRIPTION_AVAILABLE = const(0x28)
SUBSCRIPTION_IDENTIFIER_AVAILABLE = const(0x29)
SHARED_SUBSCRIPTION_AVAILABLE = const(0x2A)

# Wire types, as prop_type() reports them.
TYPE_BYTE = const(1)
TYPE_U16 = const(2)
TYPE_U32 = const(3)
TYPE_VARINT = const(4)
TYPE_UTF8 = const(5)
TYPE_BINARY = const(6)
TYPE_PAIR = const(7)

# "Where" bits: bit 0 = will properties (pseudo packet 0), bit n = packet type n.
WILL = const(0)

# id, type, where-mask (high byte, low byte). Generated from the table in
# section 2.2.2.2 of the MQTT 5.0 specification; tests/lib/test_props.py
# restates that table independently and checks this one against it.
_TABLE = (
    b"\x01\x01\x00\x09"  # payload format indicator: will, PUBLISH
    b"\x02\x03\x00\x09"  # message expiry interval
    b"\x03\x05\x00\x09"  # content type
    b"\x08\x05\x00\x09"  # response topic
    b"\x09\x06\x00\x09"  # correlation data
    b"\x0b\x04\x01\x08"  # subscription identifier: PUBLISH, SUBSCRIBE
    b"\x11\x03\x40\x06"  # session expiry: CONNECT, CONNACK, DISCONNECT
    b"\x12\x05\x00\x04"  # assigned client identifier: CONNACK
    b"\x13\x02\x00\x04"  # server keep alive: CONNACK
    b"\x15\x05\x80\x06"  # authentication method: CONNECT, CONNACK, AUTH
    b"\x16\x06\x80\x06"  # authentication data
    b"\x17\x01\x00\x02"  # request problem information: CONNECT
    b"\x18\x03\x00\x01"  # will delay interval: will
    b"\x19\x01\x00\x02"  # request response information: CONNECT
    b"\x1a\x05\x00\x04"  # response information: CONNACK
    b"\x1c\x05\x40\x04"  # server reference: CONNACK, DISCONNECT
    b"\x1f\x05\xca\xf4"  # reason string: CONNACK, PUBACK..PUBCOMP, SUBACK, UNSUBACK, DISCONNECT, AUTH
    b"\x21\x02\x00\x06"  # receive maximum: CONNECT, CONNACK
    b"\x22\x02\x00\x06"  # topic alias maximum
    b"\x23\x02\x00\x08"  # topic alias: PUBLISH
    b"\x24\x01\x00\x04"  # maximum qos: CONNACK
    b"\x25\x01\x00\x04"  # retain available: CONNACK
    b"\x26\x07\xcf\xff"  # user property: everywhere but PINGREQ/PINGRESP
    b"\x27\x03\x00\x06"  # maximum packet size: CONNECT, CONNACK
    b"\x28\x01\x00\x04"  # wildcard subscription available: CONNACK
    b"\x29\x01\x00\x04"  # subscription identifier available
    b"\x2a\x01\x00\x04"  # shared subscription available
)


def _entry(pid):
    t = _TABLE
    i = 0
    n = len(t)
    while i < n:
        if t[i] == pid:
            return i
        i += 4
    return -1


def prop_type(pid):
    """The wire type of a property identifier, 0 when it is not one."""
    i = _entry(pid)
    return _TABLE[i + 1] if i >= 0 else 0


def allowed(pid, ptype):
    """May property pid appear in packet type ptype (WILL for will properties)?"""
    i = _entry(pid)
    if i < 0:
        return False
    return bool((_TABLE[i + 2] << 8 | _TABLE[i + 3]) & (1 << ptype))


def _repeatable(pid, ptype):
    return pid == USER_PROPERTY or (pid == SUBSCRIPTION_IDENTIFIER and ptype == PUBLISH)


def _check_value(pid, v):
    # Ranges the specification makes a Protocol Error.
    if pid in (
        PAYLOAD_FORMAT_INDICATOR,
        REQUEST_PROBLEM_INFORMATION,
        REQUEST_RESPONSE_INFORMATION,
        MAXIMUM_QOS,
        RETAIN_AVAILABLE,
        WILDCARD_SUBSCRIPTION_AVAILABLE,
        SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        SHARED_SUBSCRIPTION_AVAILABLE,
    ):
        if v > 1:
            raise MQTTError(PROTOCOL_ERROR, "protocol error: property 0x%02X must be 0 or 1" % pid)
    elif pid in (RECEIVE_MAXIMUM, MAXIMUM_PACKET_SIZE, TOPIC_ALIAS, SUBSCRIPTION_IDENTIFIER):
        if v == 0:
            raise MQTTError(PROTOCOL_ERROR, "protocol error: property 0x%02X must not be 0" % pid)


def decode(r, ptype):
    """Read a property block (length then properties) from Reader r.

    Returns a dict, or None when the block is empty (the common case costs
    nothing).
    """
    n = r.varint()
    r.need(n)
    if not n:
        return None
    end = r.pos + n
    saved = r.end
    r.end = end  # a property may not run past its block
    props = {}
    try:
        while r.pos < end:
            pid = r.varint()
            i = _entry(pid)
            if i < 0:
                fail("unknown property 0x%02X" % pid)
            if not (_TABLE[i + 2] << 8 | _TABLE[i + 3]) & (1 << ptype):
                fail("property 0x%02X not allowed in packet type %d" % (pid, ptype))
            t = _TABLE[i + 1]
            if t == TYPE_BYTE:
                v = r.u8()
            elif t == TYPE_U16:
                v = r.u16()
            elif t == TYPE_U32:
                v = r.u32()
            elif t == TYPE_VARINT:
                v = r.varint()
            elif t == TYPE_UTF8:
                v = r.string()
            elif t == TYPE_BINARY:
                v = r.binary()
            else:
                v = (r.string(), r.string())
            _check_value(pid, v)
            if _repeatable(pid, ptype):
                if pid in props:
                    props[pid].append(v)
                else:
                    props[pid] = [v]
            elif pid in props:
                raise MQTTError(PROTOCOL_ERROR, "protocol error: property 0x%02X appears twice" % pid)
            else:
                props[pid] = v
    finally:
        r.end = saved
    return props


def _items(props, ptype):
    # Yield (pid, type, value) with repeats flattened; check what the user gave.
    # In identifier order: MicroPython's dict order is not insertion order, and
    # the same packet must give the same bytes on both runtimes.
    for pid in sorted(props):
        i = _entry(pid)
        if i < 0:
            raise ValueError("unknown property 0x%02X" % pid)
        if not (_TABLE[i + 2] << 8 | _TABLE[i + 3]) & (1 << ptype):
            raise ValueError("property 0x%02X is not allowed in packet type %d" % (pid, ptype))
        v = props[pid]
        t = _TABLE[i + 1]
        if isinstance(v, list):
            if not _repeatable(pid, ptype) and not (pid == SUBSCRIPTION_IDENTIFIER and len(v) == 1):
                raise ValueError("property 0x%02X may appear only once" % pid)
            for x in v:
                yield pid, t, x
        else:
            yield pid, t, v


_LIMITS = (0, 0xFF, 0xFFFF, 0xFFFFFFFF, 268435455)  # by wire type TYPE_BYTE..TYPE_VARINT


def _check_out(pid, t, v):
    # What the user asks to send: right type, in range, and not a value the
    # peer would have to treat as a Protocol Error. ValueError, not MQTTError:
    # this is the caller's mistake, not the network's. (MicroPython stores
    # 300 into a bytearray as 44 without complaint, so the range is checked
    # here rather than left to the buffer.)
    if t <= TYPE_VARINT:
        if not isinstance(v, int) or v < 0 or v > _LIMITS[t]:
            raise ValueError("property 0x%02X: %r out of range" % (pid, v))
        try:
            _check_value(pid, v)
        except MQTTError as e:
            raise ValueError(e.args[0])
    elif t == TYPE_PAIR:
        if not isinstance(v, (tuple, list)) or len(v) != 2 or not isinstance(v[0], str) or not isinstance(v[1], str):
            raise ValueError("property 0x%02X: a user property is a (name, value) pair of strings" % pid)
    elif t == TYPE_UTF8:
        if not isinstance(v, str):
            raise ValueError("property 0x%02X: a string is needed" % pid)
    elif not isinstance(v, (bytes, bytearray, memoryview)):
        raise ValueError("property 0x%02X: bytes are needed" % pid)


def _value_size(t, v):
    if t == TYPE_BYTE:
        return 1
    if t == TYPE_U16:
        return 2
    if t == TYPE_U32:
        return 4
    if t == TYPE_VARINT:
        return varint_size(v)
    if t == TYPE_PAIR:
        return 4 + len(utf8(v[0])) + len(utf8(v[1]))
    if t == TYPE_UTF8:
        return 2 + len(utf8(v))
    return 2 + len(v)


def encode(props, ptype):
    """The property block (length prefix included) as bytes."""
    if not props:
        return b"\x00"
    n = 0
    for pid, t, v in _items(props, ptype):
        _check_out(pid, t, v)
        n += varint_size(pid) + _value_size(t, v)
    buf = bytearray(varint_size(n) + n)
    p = put_varint(buf, 0, n)
    for pid, t, v in _items(props, ptype):
        p = put_varint(buf, p, pid)
        if t == TYPE_BYTE:
            buf[p] = v
            p += 1
        elif t == TYPE_U16:
            p = put_u16(buf, p, v)
        elif t == TYPE_U32:
            p = put_u32(buf, p, v)
        elif t == TYPE_VARINT:
            p = put_varint(buf, p, v)
        elif t == TYPE_UTF8:
            p = put_data(buf, p, utf8(v))
        elif t == TYPE_BINARY:
            if len(v) > 65535:
                raise ValueError("binary property longer than 65535 bytes")
            p = put_data(buf, p, v)
        else:
            p = put_data(buf, p, utf8(v[0]))
            p = put_data(buf, p, utf8(v[1]))
    return bytes(buf)


def scan_publish(m, buf, sub_ids):
    """Check a PUBLISH's properties in place and pick out what the session
    needs: m.alias (0 = none), m.n_sub_ids with the identifiers stored into the
    preallocated sequence sub_ids (extra ones beyond its length are counted
    but not stored), m.pfi (payload format indicator). Allocates nothing."""
    p = m.props_start
    end = m.props_end
    seen = 0  # one bit per property seen; bit numbers kept below 30 so it stays a small int on 32-bit boards
    m.alias = 0
    m.n_sub_ids = 0
    m.pfi = 0
    while p < end:
        pid = get_varint(buf, p, end)
        if pid < 0:
            fail("truncated property")
        p += varint_size(pid)
        i = _entry(pid)
        if i < 0 or not (_TABLE[i + 2] << 8 | _TABLE[i + 3]) & (1 << PUBLISH):
            fail("property 0x%02X not allowed in PUBLISH" % pid)
        t = _TABLE[i + 1]
        if t == 1:  # byte
            if p >= end:
                fail("truncated property")
            v = buf[p]
            if v > 1:
                raise MQTTError(PROTOCOL_ERROR, "protocol error: payload format indicator must be 0 or 1")
            m.pfi = v
            p += 1
        elif t == 2:  # two-byte integer: topic alias
            if p + 2 > end:
                fail("truncated property")
            v = buf[p] << 8 | buf[p + 1]
            if not v:
                raise MQTTError(PROTOCOL_ERROR, "protocol error: topic alias 0")
            m.alias = v
            p += 2
        elif t == 3:  # four-byte integer: message expiry
            p += 4
            if p > end:
                fail("truncated property")
        elif t == 4:  # variable byte integer: subscription identifier
            v = get_varint(buf, p, end)
            if v < 0:
                fail("truncated property")
            if not v:
                raise MQTTError(PROTOCOL_ERROR, "protocol error: subscription identifier 0")
            p += varint_size(v)
            k = m.n_sub_ids
            if k < len(sub_ids):
                sub_ids[k] = v
            m.n_sub_ids = k + 1
        else:  # string, binary or string pair
            k = 2 if t == 7 else 1
            while k:
                if p + 2 > end:
                    fail("truncated property")
                n = buf[p] << 8 | buf[p + 1]
                p += 2
                if p + n > end:
                    fail("truncated property")
                if t != 6:
                    check_utf8(buf, p, p + n)
                p += n
                k -= 1
        # Repeats are checked once the value is read, as the general decoder does.
        if pid != 0x26 and pid != 0x0B:
            k = 1 << (pid if pid < 0x20 else pid - 0x10)  # PUBLISH ids: 0x01..0x09 as is, 0x23 -> bit 19
            if seen & k:
                raise MQTTError(PROTOCOL_ERROR, "protocol error: property 0x%02X appears twice" % pid)
            seen |= k
    if m.topic_start == m.topic_end and not m.alias:
        raise MQTTError(PROTOCOL_ERROR, "protocol error: empty topic without a topic alias")
