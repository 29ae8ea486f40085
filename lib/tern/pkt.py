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
# packet sections). Bytes so `code in X` costs nothing.
CONNACK_RC = b"\x00\x80\x81\x82\x83\x84\x85\x86\x87\x88\x89\x8a\x8c\x90\x95\x97\x99\x9a\x9b\x9c\x9d\x9f"
PUBACK_RC = b"\x00\x10\x80\x83\x87\x90\x91\x97\x99"
PUBREL_RC = b"\x00\x92"
SUBACK_RC = b"\x00\x01\x02\x80\x83\x87\x8f\x91\x97\x9e\xa1\xa2"
UNSUBACK_RC = b"\x00\x11\x80\x83\x87\x8f\x91"
DISCONNECT_RC = (
    b"\x00\x04\x80\x81\x82\x83\x87\x89\x8b\x8d\x8e\x8f\x90\x93\x94\x95\x96\x97\x98\x99\x9a\x9b\x9c\x9d\x9e\x9f\xa0\xa1\xa2"
)
AUTH_RC = b"\x00\x18\x19"
SUBACK_RC_V3 = b"\x00\x01\x02\x80"

PINGREQ_BYTES = b"\xc0\x00"
PINGRESP_BYTES = b"\xd0\x00"


class Packet:
    """One control packet; fields not given take the defaults below.

    CONNECT: version clean keepalive client_id props will_* username password
    CONNACK: session_present reason props    PUBLISH: topic payload qos retain dup pid props
    PUBACK/PUBREC/PUBREL/PUBCOMP: pid reason props
    SUBSCRIBE: pid topics=[(filter, options)] props   SUBACK: pid reasons=[...] props
    UNSUBSCRIBE: pid topics=[filter] props   UNSUBACK: pid reasons props
    DISCONNECT, AUTH: reason props           PINGREQ, PINGRESP: nothing
    (tern.codec.Packet adds equality and a readable repr.)
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
    topic = ""
    payload = b""
    qos = 0
    retain = False
    dup = False
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
    Returns the header length. Allocates nothing."""
    tl = len(topic)
    if tl > 65535:
        raise ValueError("topic over 65535 bytes")
    if qos > 2 or qos < 0:
        raise ValueError("QoS must be 0, 1 or 2")
    if dup and not qos:
        raise ValueError("DUP on QoS 0")
    n = 2 + tl + payload_len
    if qos:
        if pid < 1 or pid > 65535:
            raise ValueError("packet id not in 1..65535")
        n += 2
    if version == _V5:
        n += len(props) if props else 1
    elif not tl:
        raise ValueError("empty topic before MQTT 5")
    if n > _VARINT_MAX:
        raise ValueError("packet too large for MQTT")
    buf[0] = 0x30 | (8 if dup else 0) | qos << 1 | (1 if retain else 0)
    p = put_varint(buf, 1, n)
    p = put_data(buf, p, topic)
    if qos:
        p = put_u16(buf, p, pid)
    if version == _V5:
        if props:
            buf[p : p + len(props)] = props
            p += len(props)
        else:
            buf[p] = 0
            p += 1
    return p


def ack_into(buf, ptype, pid, reason, version):
    """PUBACK, PUBREC, PUBREL or PUBCOMP into buf; returns its length.
    The reason code is sent only in MQTT 5 and only when it is not 0."""
    if ptype < _PUBACK or ptype > _PUBCOMP:
        raise ValueError("not an ack type")
    if pid < 1 or pid > 65535:
        raise ValueError("packet id not in 1..65535")
    if reason < 0 or reason > 255:
        raise ValueError("reason code out of range")
    buf[0] = ptype << 4 | (2 if ptype == _PUBREL else 0)
    buf[2] = pid >> 8
    buf[3] = pid & 0xFF
    if version == _V5 and reason:
        buf[1] = 3
        buf[4] = reason
        return 5
    buf[1] = 2
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
    p += 1
    if p + 2 > end:
        fail("truncated")
    tl = buf[p] << 8 | buf[p + 1]
    p += 2
    if p + tl > end:
        fail("truncated")
    m.topic_start = p
    p += tl
    m.topic_end = p
    if qos:
        if p + 2 > end:
            fail("truncated")
        pid = buf[p] << 8 | buf[p + 1]
        if not pid:
            fail("packet id 0")
        p += 2
    else:
        pid = 0
    if version == _V5:
        n = get_varint(buf, p, end)
        if n < 0:
            fail("truncated")
        p += varint_size(n)
        if p + n > end:
            fail("truncated")
        m.props_start = p
        p += n
    else:
        m.props_start = p
    m.props_end = p
    m.payload_start = p
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
    if n < 0 or n > 65535:
        raise ValueError("two-byte integer out of range: %r" % n)
    return bytes((n >> 8, n & 0xFF))


def pidb(pid):
    if pid < 1 or pid > 65535:
        raise ValueError("packet id not in 1..65535: %r" % pid)
    return u16b(pid)


def strb(s):
    b = utf8(s)
    return u16b(len(b)) + b


def binb(b):
    b = b.encode() if isinstance(b, str) else bytes(b)
    return u16b(len(b)) + b


def check_qos(q):
    if q not in (0, 1, 2):
        raise ValueError("QoS must be 0, 1 or 2, got %r" % q)


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
    if n > _VARINT_MAX:
        raise ValueError("packet too large for MQTT")
    out = bytearray(1 + varint_size(n) + n)
    out[0] = t << 4 | flags
    pos = put_varint(out, 1, n)
    for x in parts:
        out[pos : pos + len(x)] = x
        pos += len(x)
    return bytes(out)


def encode(p, version=_V311):
    """A packet a client sends, as bytes (CONNECT uses its own version)."""
    t = p.type
    flags = 0
    parts = []
    add = parts.append
    v5 = version == _V5
    if t == _CONNECT:
        version = p.version
        v5 = version == _V5
        if version == _V31:
            add(b"\x00\x06MQIsdp\x03")
        elif version == _V311 or v5:
            add(b"\x00\x04MQTT" + bytes((version,)))
        else:
            raise ValueError("protocol version must be 3, 4 or 5")
        cf = 2 if p.clean else 0
        if p.will_topic is not None:
            check_qos(p.will_qos)
            cf |= 4 | p.will_qos << 3 | (0x20 if p.will_retain else 0)
        if p.username is not None:
            cf |= 0x80
        if p.password is not None:
            if not v5 and p.username is None:
                raise ValueError("MQTT 3 needs a username with a password")
            cf |= 0x40
        add(bytes((cf,)))
        add(u16b(p.keepalive))
        if v5:
            add(props_block(p.props, _CONNECT))
        add(strb(p.client_id))
        if p.will_topic is not None:
            if v5:
                add(props_block(p.will_props, 0))
            add(strb(p.will_topic))
            add(binb(p.will_payload))
        if p.username is not None:
            add(strb(p.username))
        if p.password is not None:
            add(binb(p.password))
    elif _PUBACK <= t <= _PUBCOMP:
        if t == _PUBREL:
            flags = 2
        add(pidb(p.pid))
        if v5 and (p.reason or p.props):
            add(bytes((p.reason,)))
            if p.props:
                add(props_block(p.props, t))
    elif t == _SUBSCRIBE or t == _UNSUBSCRIBE:
        flags = 2
        add(pidb(p.pid))
        if v5:
            add(props_block(p.props, t))
        if not p.topics:
            raise ValueError("no topic filter")
        for f in p.topics:
            if t == _SUBSCRIBE:
                o = f[1]
                if o & 3 == 3 or o & (0xC0 if v5 else 0xFC) or (v5 and o & 0x30 == 0x30) or o < 0:
                    raise ValueError("invalid subscription options 0x%02X" % o)
                add(strb(f[0]))
                add(bytes((o,)))
            else:
                add(strb(f))
    elif t == _DISCONNECT or t == _AUTH:
        if t == _AUTH and not v5:
            raise ValueError("AUTH exists only in MQTT 5")
        if v5 and (p.reason or p.props):
            add(bytes((p.reason,)))
            if p.props:
                add(props_block(p.props, t))
    elif t != _PINGREQ:
        raise ValueError("not a packet a client sends: type %r" % t)
    return frame(t, flags, parts)


def reason(r, allowed):
    c = r.u8()
    if c not in allowed:
        raise MQTTError(_PROTOCOL_ERROR, "protocol error: reason code 0x%02X not allowed here" % c)
    return c


def props_in(r, ptype):
    """Decode a property block (props imported only when it is not empty)."""
    if r.pos < r.end and r.buf[r.pos] == 0:
        r.pos += 1
        return None
    from . import props as P

    return P.decode(r, ptype)


def open_frame(buf, version, max_size, cls):
    """Check the fixed header of the one packet in buf; return (packet, Reader
    over its body)."""
    end = len(buf)
    n = frame_size(buf, 0, end, max_size)
    if n < 0 or n > end:
        fail("truncated")
    if n < end:
        fail("%d bytes after the packet" % (end - n))
    b0 = buf[0]
    t = b0 >> 4
    flags = b0 & 15
    if t == _PUBLISH:
        pass
    elif t == _PUBREL or t == _SUBSCRIBE or t == _UNSUBSCRIBE:
        if flags != 2:
            fail("reserved flags of type %d must be 0010" % t)
    elif flags:
        fail("reserved flags of type %d must be 0" % t)
    return cls(t), Reader(buf, n - get_varint(buf, 1, end), n)  # body: after the fixed header


def done(r):
    if r.pos != r.end:
        fail("%d unexpected bytes at the end" % (r.end - r.pos))


def decode(buf, version=_V311, max_size=_VARINT_MAX + 5, cls=Packet):
    """Decode one packet a client receives (not PUBLISH: see parse_publish).
    Raises MQTTError, and only MQTTError, for anything malformed."""
    p, r = open_frame(buf, version, max_size, cls)
    decode_body(p, r, version)
    done(r)
    return p


def decode_body(p, r, version):
    t = p.type
    v5 = version == _V5
    if t == _CONNACK:
        af = r.u8()
        if version != _V31:
            if af & 0xFE:
                fail("reserved CONNACK flags set")
            p.session_present = bool(af & 1)
        if v5:
            p.reason = reason(r, CONNACK_RC)
        else:
            p.reason = r.u8()
            if p.reason > 5:
                raise MQTTError(_PROTOCOL_ERROR, "protocol error: CONNACK return code %d" % p.reason)
        if p.reason and p.session_present:
            raise MQTTError(_PROTOCOL_ERROR, "protocol error: session present with a refusal")
        if v5:
            p.props = props_in(r, _CONNACK)
    elif _PUBACK <= t <= _PUBCOMP:
        p.pid = r.u16()
        if not p.pid:
            fail("packet id 0")
        if v5 and r.left():
            p.reason = reason(r, PUBREL_RC if t >= _PUBREL else PUBACK_RC)
            if r.left():
                p.props = props_in(r, t)
    elif t == _SUBACK or t == _UNSUBACK:
        p.pid = r.u16()
        if not p.pid:
            fail("packet id 0")
        if v5:
            p.props = props_in(r, t)
        rs = []
        if t == _SUBACK or v5:
            ok = SUBACK_RC if t == _SUBACK else UNSUBACK_RC
            if not v5:
                ok = SUBACK_RC_V3
            while r.left():
                rs.append(reason(r, ok))
            if not rs:
                raise MQTTError(_PROTOCOL_ERROR, "protocol error: packet type %d with no reason code" % t)
        p.reasons = rs
    elif t == _DISCONNECT or t == _AUTH:
        if t == _AUTH and not v5:
            fail("packet type 15 is reserved before MQTT 5")
        if v5 and r.left():
            p.reason = reason(r, DISCONNECT_RC if t == _DISCONNECT else AUTH_RC)
            if r.left():
                p.props = props_in(r, t)
    elif t != _PINGRESP:
        raise MQTTError(_PROTOCOL_ERROR, "protocol error: a client does not receive packet type %d" % t)
