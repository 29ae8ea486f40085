"""The packets a client exchanges: what a device loads, and no more.

- Steady path (`frame_size`, `publish_header_into`, `ack_into`,
  `parse_publish`): PUBLISH and its acknowledgements written into and parsed
  from caller-owned buffers, allocating nothing on MicroPython.
- Rare packets: `encode` for what a client sends (CONNECT, PUBACK..PUBCOMP,
  SUBSCRIBE, UNSUBSCRIBE, PINGREQ, DISCONNECT, AUTH) and `decode` for what it
  receives besides PUBLISH (CONNACK, PUBACK..PUBCOMP, SUBACK, UNSUBACK,
  PINGRESP, DISCONNECT, AUTH).

The server's side (decoding CONNECT/SUBSCRIBE/UNSUBSCRIBE, encoding CONNACK,
SUBACK, ...) and the general PUBLISH codec live in `tern.codec`, which host
code and tests import and which builds on this module: bytecode loaded from
.mpy sits on a board's heap, so what only a broker or a test needs stays out
of the device's import path. MQTT 5 properties (`tern.props`) are imported
only when a packet has some.
"""

from .wire import (
    const,
    MQTTError,
    Reader,
    fail,
    get_varint,
    varint_size,
    put_varint,
    put_u16,
    put_data,
    check_utf8,
    utf8,
    check,
)

_CONNECT = const(1)
_CONNACK = const(2)
_PUBLISH = const(3)
_PUBACK = const(4)
_PUBREL = const(6)
_PUBCOMP = const(7)
_SUBSCRIBE = const(8)
_SUBACK = const(9)
_UNSUBSCRIBE = const(10)
_UNSUBACK = const(11)
_PINGREQ = const(12)
_PINGRESP = const(13)
_DISCONNECT = const(14)
_AUTH = const(15)
_V31 = const(3)
_V311 = const(4)
_V5 = const(5)
_PROTOCOL_ERROR = const(0x82)
_VARINT_MAX = const(268435455)

# Reason codes each packet type may carry (MQTT 5.0 section 2.4 and the
# packet sections). Bytes so `code in X` costs nothing; the session checks
# acknowledgements against the two public ones itself.
PUBACK_RC = b"\x00\x10\x80\x83\x87\x90\x91\x97\x99"
PUBREL_RC = b"\x00\x92"
_CONNACK_RC = const(b"\x00\x80\x81\x82\x83\x84\x85\x86\x87\x88\x89\x8a\x8c\x90\x95\x97\x99\x9a\x9b\x9c\x9d\x9f")
_SUBACK_RC = const(b"\x00\x01\x02\x80\x83\x87\x8f\x91\x97\x9e\xa1\xa2")
_UNSUBACK_RC = const(b"\x00\x11\x80\x83\x87\x8f\x91")
_DISCONNECT_RC = const(
    b"\x00\x04\x80\x81\x82\x83\x87\x89\x8b\x8d\x8e\x8f\x90\x93\x94\x95\x96\x97\x98\x99\x9a\x9b\x9c\x9d\x9e\x9f\xa0\xa1\xa2"
)
_AUTH_RC = const(b"\x00\x18\x19")
_SUBACK_RC_V3 = const(b"\x00\x01\x02\x80")

PINGREQ_BYTES = b"\xc0\x00"


class Packet:
    """One control packet; fields not given take the defaults below.

    CONNECT: version clean keepalive client_id props will_* username password
    CONNACK: session_present reason props
    PUBACK/PUBREC/PUBREL/PUBCOMP: pid reason props
    SUBSCRIBE: pid topics=[(filter, options)] props   SUBACK: pid reasons=[...] props
    UNSUBSCRIBE: pid topics=[filter] props   UNSUBACK: pid reasons props
    DISCONNECT, AUTH: reason props           PINGREQ, PINGRESP: nothing
    (tern.codec.Packet adds PUBLISH's fields, equality and a readable repr.)
    """

    version = _V311
    clean = True
    keepalive = 60
    client_id = ""
    will_topic = None
    will_payload = b""
    will_qos = 0
    will_retain = False
    will_props = None
    username = None
    password = None
    session_present = False
    pid = 0
    reason = 0
    props = None
    topics = ()
    reasons = ()

    def __init__(self, ptype, **fields):
        self.type = ptype
        for k in fields:
            setattr(self, k, fields[k])


# ---------------------------------------------------------------- steady path


def frame_size(buf, pos, end, max_size):
    """Size of the whole packet starting at buf[pos], or -1 while its fixed
    header is incomplete. Raises PACKET_TOO_LARGE from the header alone."""
    if pos >= end:
        return -1
    if buf[pos] < 0x10:
        fail("packet type 0")
    rl = get_varint(buf, pos + 1, end)
    if rl < 0:
        return -1
    n = 1 + varint_size(rl) + rl
    if n > max_size:
        raise MQTTError(0x95, "packet of %d bytes over the maximum %d" % (n, max_size))
    return n


def publish_header_into(buf, topic, qos, retain, dup, pid, payload_len, version, props=None):
    """Write a PUBLISH's fixed and variable header; the payload follows it on
    the wire. `topic` is bytes, `props` an encoded property block or None.
    Returns the header length. Allocates nothing. Checks its input, then
    writes through pub_head (which the session calls itself, with input it
    has checked)."""
    tl = len(topic)
    if tl > 65535 or not tl and version != _V5:
        check("topic length", tl, 0 if version == _V5 else 1, 65535)  # raises
    if qos and not 0 < pid < 65536 or qos < 0 or qos > 2:
        check("QoS", qos, 0, 2)
        check("packet id", pid, 1, 65535)
    if dup and not qos:
        raise ValueError("DUP on QoS 0")
    return pub_head(buf, topic, 0x30 | (8 if dup else 0) | qos << 1 | (1 if retain else 0),
                    pid if qos else 0, payload_len, (props or b"\x00") if version == _V5 else None)


def pub_head(buf, topic, b0, pid, n, props=None):
    """publish_header_into for checked input, the steady path's: b0 the first
    byte, pid 0 for QoS 0, n the payload's length, props the encoded property
    block (MQTT 5: b"\x00" when empty) or None (before MQTT 5). Kept within a
    MicroPython frame of 11 words (a larger one comes from the heap at every
    call, some 2,000 instructions on a Cortex-M3): few locals, short expressions."""
    tl = len(topic)
    n += 2 + tl
    if pid:
        n += 2
    if props is not None:
        n += len(props)
    buf[0] = b0
    if n < 128:
        buf[1] = n
        n = 2
    else:
        n = put_varint(buf, 1, n)  # checks the packet size
    buf[n] = tl >> 8
    buf[n + 1] = tl & 0xFF
    n += 2
    tl += n
    buf[n:tl] = topic
    n = tl
    if pid:
        buf[n] = pid >> 8
        buf[n + 1] = pid & 0xFF
        n += 2
    if props is not None:
        tl = n + len(props)
        buf[n:tl] = props
        n = tl
    return n


def ack_into(buf, ptype, pid, reason, version, at=0):
    """PUBACK, PUBREC, PUBREL or PUBCOMP into buf at `at`; returns its length.
    The reason code is sent only in MQTT 5 and only when it is not 0."""
    check("packet type", ptype, _PUBACK, _PUBCOMP)
    check("packet id", pid, 1, 65535)
    check("reason code", reason, 0, 255)
    buf[at] = ptype << 4 | (2 if ptype == _PUBREL else 0)
    put_u16(buf, at + 2, pid)
    if version == _V5 and reason:
        buf[at + 1] = 3
        buf[at + 4] = reason
        return 5
    buf[at + 1] = 2
    return 4


def parse_publish(m, buf, pos, end, version):
    """Fill the preallocated object m from the PUBLISH frame buf[pos:end].

    Sets m.qos, m.retain, m.dup, m.pid and the offsets m.topic_start/_end,
    m.props_start/_end and m.payload_start/_end into buf. Properties are only
    located here; `tern.props.scan_publish` checks them. Allocates nothing.
    """
    b0 = buf[pos]
    qos = (b0 >> 1) & 3
    if qos == 3:
        fail("QoS 3")
    if b0 & 8 and not qos:
        fail("DUP on QoS 0")
    p = pos + 1
    while p < end and buf[p] & 0x80:
        p += 1
    p += 3
    if p > end:
        fail("truncated")
    m.topic_start = p
    p += buf[p - 2] << 8 | buf[p - 1]
    m.topic_end = p
    pid = 0
    if qos:
        p += 2
        if p > end:
            fail("truncated")
        pid = buf[p - 2] << 8 | buf[p - 1]
        if not pid:
            fail("packet id 0")
    m.props_start = p
    if version == _V5:
        n = get_varint(buf, p, end)
        if n < 0:
            fail("truncated")
        m.props_start = p = p + varint_size(n)
        p += n
    if p > end:
        fail("truncated")
    m.props_end = m.payload_start = p
    m.payload_end = end
    m.qos = qos
    m.retain = b0 & 1
    m.dup = (b0 >> 3) & 1
    m.pid = pid
    # Checked last so the offsets above are set for the error path too.
    p = m.topic_start
    end = m.topic_end
    check_utf8(buf, p, end)
    if p == end and version != _V5:
        raise MQTTError(0x90, "empty topic name")
    while p < end:
        c = buf[p]
        if c == 0x23 or c == 0x2B:  # '#' '+'
            raise MQTTError(0x90, "wildcard in a topic name")
        p += 1


# ------------------------------------------------------------- rare packets


def u16b(n):
    return bytes((n >> 8, n & 0xFF))


def datab(x, text=True):
    """Two-byte length then the bytes: x checked as an MQTT UTF-8 string, or
    with text=False sent as binary data (a str is encoded)."""
    if text:
        b = utf8(x)
    else:
        b = x.encode() if isinstance(x, str) else bytes(x)
    return u16b(check("data length", len(b), 0, 65535)) + b


def props_block(props, ptype):
    """An encoded property block; props is imported only when there are some."""
    if not props:
        return b"\x00"
    from . import props as P

    return P.encode(props, ptype)


def frame(t, flags, parts):
    """Fixed header + the parts, as bytes."""
    n = 0
    for x in parts:
        n += len(x)
    out = bytearray(1 + varint_size(check("packet size", n, 0, _VARINT_MAX)) + n)
    out[0] = t << 4 | flags
    pos = put_varint(out, 1, n)
    for x in parts:
        out[pos : pos + len(x)] = x
        pos += len(x)
    return bytes(out)


def encode(p, version=_V311):
    """A packet a client sends, as bytes (CONNECT uses its own version)."""
    t = p.type
    parts = []
    add = parts.append
    v5 = version == _V5
    if t == _CONNECT:
        version = p.version
        v5 = version == _V5
        if check("protocol version", version, _V31, _V5) == _V31:
            add(b"\x00\x06MQIsdp\x03")
        else:
            add(b"\x00\x04MQTT" + bytes((version,)))
        cf = 2 if p.clean else 0
        if p.will_topic is not None:
            cf |= 4 | check("QoS", p.will_qos, 0, 2) << 3 | (0x20 if p.will_retain else 0)
        if p.username is not None:
            cf |= 0x80
        if p.password is not None:
            if not v5 and p.username is None:
                raise ValueError("MQTT 3 needs a username with a password")
            cf |= 0x40
        add(bytes((cf,)))
        add(u16b(check("keepalive", p.keepalive, 0, 65535)))
        if v5:
            add(props_block(p.props, _CONNECT))
        add(datab(p.client_id))
        if p.will_topic is not None:
            if v5:
                add(props_block(p.will_props, 0))
            add(datab(p.will_topic))
            add(datab(p.will_payload, False))
        if p.username is not None:
            add(datab(p.username))
        if p.password is not None:
            add(datab(p.password, False))
    elif t == _SUBSCRIBE or t == _UNSUBSCRIBE:
        add(u16b(check("packet id", p.pid, 1, 65535)))
        if v5:
            add(props_block(p.props, t))
        if not p.topics:
            raise ValueError("no topic filter")
        for f in p.topics:
            if t == _SUBSCRIBE:
                o = f[1]
                if o & 3 == 3 or o & (0xC0 if v5 else 0xFC) or (v5 and o & 0x30 == 0x30) or o < 0:
                    raise ValueError("invalid subscription options 0x%02X" % o)
                add(datab(f[0]))
                add(bytes((o,)))
            else:
                add(datab(f))
    elif t != _PINGREQ:
        # PUBACK..PUBCOMP (a packet id first), DISCONNECT, AUTH: then, in MQTT 5,
        # a reason code and properties when either is not the default.
        if _PUBACK <= t <= _PUBCOMP:
            add(u16b(check("packet id", p.pid, 1, 65535)))
        elif t < _DISCONNECT or t > _AUTH or (t == _AUTH and not v5):
            raise ValueError("unexpected packet type %d in MQTT %d" % (t, version))
        if v5 and (p.reason or p.props):
            add(bytes((p.reason,)))
            if p.props:
                add(props_block(p.props, t))
    return frame(t, 2 if t == _PUBREL or t == _SUBSCRIBE or t == _UNSUBSCRIBE else 0, parts)


def reason(r, allowed):
    c = r.u8()
    if c not in allowed:
        fail("reason code 0x%02X not allowed here" % c, _PROTOCOL_ERROR)
    return c


def props_in(r, ptype):
    """Decode a property block (props imported only when it is not empty)."""
    if r.pos < r.end and r.buf[r.pos] == 0:
        r.pos += 1
        return None
    from . import props as P

    return P.decode(r, ptype)


def decode(buf, version=_V311, max_size=_VARINT_MAX + 5, cls=Packet, more=None):
    """Decode one packet a client receives (not PUBLISH: see parse_publish).
    Raises MQTTError, and only MQTTError, for anything malformed.

    tern.codec passes its Packet class as cls and, as more(p, reader, version),
    the decoder of the packets only a server receives (True when it took p)."""
    end = len(buf)
    n = frame_size(buf, 0, end, max_size)
    if n < 0 or n > end:
        fail("truncated")
    b0 = buf[0]
    t = b0 >> 4
    if t != _PUBLISH and b0 & 15 != (2 if t == _PUBREL or t == _SUBSCRIBE or t == _UNSUBSCRIBE else 0):
        fail("reserved flags of packet type %d" % t)
    p = cls(t)
    r = Reader(buf, n - get_varint(buf, 1, end), n)  # body: after the fixed header
    v5 = version == _V5
    if n < end:
        r.pos = n  # reported below
    elif more and more(p, r, version):
        pass
    elif t == _CONNACK:
        af = r.u8()
        if version != _V31:
            if af & 0xFE:
                fail("reserved flags of packet type %d" % t)
            p.session_present = bool(af & 1)
        if v5:
            p.reason = reason(r, _CONNACK_RC)
        else:
            p.reason = r.u8()
            if p.reason > 5:
                fail("reason code 0x%02X not allowed here" % p.reason, _PROTOCOL_ERROR)
        if p.reason and p.session_present:
            fail("session present with a refusal", _PROTOCOL_ERROR)
        if v5:
            p.props = props_in(r, _CONNACK)
    elif _PUBACK <= t <= _PUBCOMP or t == _SUBACK or t == _UNSUBACK:
        p.pid = r.u16()
        if not p.pid:
            fail("packet id 0")
        if t <= _PUBCOMP:
            if v5 and r.pos < r.end:
                p.reason = reason(r, PUBREL_RC if t >= _PUBREL else PUBACK_RC)
                if r.pos < r.end:
                    p.props = props_in(r, t)
        else:  # SUBACK, UNSUBACK: a reason code per filter (UNSUBACK before 5: none)
            if v5:
                p.props = props_in(r, t)
            rs = []
            if t == _SUBACK or v5:
                ok = _SUBACK_RC_V3 if not v5 else _SUBACK_RC if t == _SUBACK else _UNSUBACK_RC
                while r.pos < r.end:
                    rs.append(reason(r, ok))
                if not rs:
                    fail("packet type %d with no reason code" % t, _PROTOCOL_ERROR)
            p.reasons = rs
    elif t == _DISCONNECT or t == _AUTH:
        if not v5 and t == _AUTH:
            fail("unexpected packet type %d in MQTT %d" % (t, version))
        if v5 and r.pos < r.end:
            p.reason = reason(r, _DISCONNECT_RC if t == _DISCONNECT else _AUTH_RC)
            if r.pos < r.end:
                p.props = props_in(r, t)
    elif t != _PINGRESP:
        fail("unexpected packet type %d in MQTT %d" % (t, version), _PROTOCOL_ERROR)
    if r.pos != end:
        fail("%d bytes too many" % (end - r.pos))
    return p
