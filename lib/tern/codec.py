"""Control packets <-> bytes for MQTT 3.1 (MQIsdp, level 3), 3.1.1 (level 4)
and 5.0 (level 5).

Two ways in and out:
- `encode(packet, version)` / `decode(frame, version, max_size)`: every one of
  the 15 packet types as a `Packet`, for the rare packets (CONNECT, SUBSCRIBE,
  ...), for tests and for the scripted broker. These allocate freely.
- The steady path (`publish_header_into`, `ack_into`, `frame_size`,
  `parse_publish`, `scan_publish_props`): PUBLISH and its acknowledgements
  written into and parsed from caller-owned buffers, allocating nothing on
  MicroPython. Both paths apply the same rules, and the tests hold them to it.

Decoding is bounded: `frame_size` rejects a packet larger than the limit from
its fixed header alone, before a byte of the body is read or stored.
"""

from .wire import (
    MQTTError,
    PROTOCOL_ERROR,
    TOPIC_NAME_INVALID,
    PACKET_TOO_LARGE,
    VARINT_MAX,
    CONNECT,
    CONNACK,
    PUBLISH,
    PUBACK,
    PUBREL,
    PUBCOMP,
    SUBSCRIBE,
    SUBACK,
    UNSUBSCRIBE,
    UNSUBACK,
    PINGREQ,
    PINGRESP,
    DISCONNECT,
    AUTH,
    V31,
    V311,
    V5,
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
from . import props as _props

# Reason codes each packet type may carry (MQTT 5.0 section 2.4 and the
# packet sections). Bytes so `code in _X` costs nothing.
_CONNACK_RC = b"\x00\x80\x81\x82\x83\x84\x85\x86\x87\x88\x89\x8a\x8c\x90\x95\x97\x99\x9a\x9b\x9c\x9d\x9f"
_PUBACK_RC = b"\x00\x10\x80\x83\x87\x90\x91\x97\x99"
_PUBREL_RC = b"\x00\x92"
_SUBACK_RC = b"\x00\x01\x02\x80\x83\x87\x8f\x91\x97\x9e\xa1\xa2"
_UNSUBACK_RC = b"\x00\x11\x80\x83\x87\x8f\x91"
_DISCONNECT_RC = (
    b"\x00\x04\x80\x81\x82\x83\x87\x89\x8b\x8d\x8e\x8f\x90\x93\x94\x95\x96\x97\x98\x99\x9a\x9b\x9c\x9d\x9e\x9f\xa0\xa1\xa2"
)
_AUTH_RC = b"\x00\x18\x19"
_SUBACK_RC_V3 = b"\x00\x01\x02\x80"

_NAMES = (
    "RESERVED", "CONNECT", "CONNACK", "PUBLISH", "PUBACK", "PUBREC", "PUBREL", "PUBCOMP",
    "SUBSCRIBE", "SUBACK", "UNSUBSCRIBE", "UNSUBACK", "PINGREQ", "PINGRESP", "DISCONNECT", "AUTH",
)

# The fields that make up each packet type (equality and repr use them).
_FIELDS = (
    (),
    ("version", "clean", "keepalive", "client_id", "props", "will_topic", "will_payload",
     "will_qos", "will_retain", "will_props", "username", "password"),
    ("session_present", "reason", "props"),
    ("topic", "payload", "qos", "retain", "dup", "pid", "props"),
    ("pid", "reason", "props"),
    ("pid", "reason", "props"),
    ("pid", "reason", "props"),
    ("pid", "reason", "props"),
    ("pid", "topics", "props"),
    ("pid", "reasons", "props"),
    ("pid", "topics", "props"),
    ("pid", "reasons", "props"),
    (),
    (),
    ("reason", "props"),
    ("reason", "props"),
)


def packet_name(ptype):
    return _NAMES[ptype & 15]


class Packet:
    """One control packet; fields not given take the defaults below.

    CONNECT: version clean keepalive client_id props will_* username password
    CONNACK: session_present reason props    PUBLISH: topic payload qos retain dup pid props
    PUBACK/PUBREC/PUBREL/PUBCOMP: pid reason props
    SUBSCRIBE: pid topics=[(filter, options)] props   SUBACK: pid reasons=[...] props
    UNSUBSCRIBE: pid topics=[filter] props   UNSUBACK: pid reasons props
    DISCONNECT, AUTH: reason props           PINGREQ, PINGRESP: nothing
    """

    version = V311
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

    def _key(self):
        out = [self.type]
        for f in _FIELDS[self.type]:
            v = getattr(self, f)
            if isinstance(v, (memoryview, bytearray)):
                v = bytes(v)
            elif not v and (f == "props" or f == "will_props"):
                v = None  # no properties: {} and None encode the same
            elif isinstance(v, tuple) and f in ("topics", "reasons"):
                v = list(v)
            out.append(v)
        return out

    def __eq__(self, other):
        return isinstance(other, Packet) and self._key() == other._key()

    def __ne__(self, other):
        return not self.__eq__(other)

    def __repr__(self):
        k = self._key()
        return "%s(%s)" % (
            packet_name(self.type),
            ", ".join("%s=%r" % (f, v) for f, v in zip(_FIELDS[self.type], k[1:])),
        )


# ---------------------------------------------------------------- steady path


def frame_size(buf, pos, end, max_size):
    """Size of the whole packet starting at buf[pos], or -1 while its fixed
    header is incomplete. Raises PACKET_TOO_LARGE from the header alone."""
    if pos >= end:
        return -1
    if buf[pos] < 0x10:
        fail("reserved packet type 0")
    rl = get_varint(buf, pos + 1, end)
    if rl < 0:
        return -1
    n = 1 + varint_size(rl) + rl
    if n > max_size:
        raise MQTTError(PACKET_TOO_LARGE, "packet of %d bytes exceeds the maximum of %d" % (n, max_size))
    return n


def publish_header_into(buf, topic, qos, retain, dup, pid, payload_len, version, props=None):
    """Write a PUBLISH's fixed and variable header; the payload follows it on
    the wire. `topic` is bytes, `props` an encoded property block or None.
    Returns the header length. Allocates nothing."""
    tl = len(topic)
    if tl > 65535:
        raise ValueError("topic longer than 65535 bytes")
    if qos > 2 or qos < 0:
        raise ValueError("QoS must be 0, 1 or 2")
    if dup and not qos:
        raise ValueError("DUP may only be set on QoS 1 and 2")
    n = 2 + tl + payload_len
    if qos:
        if pid < 1 or pid > 65535:
            raise ValueError("packet identifier must be 1..65535")
        n += 2
    if version == V5:
        n += len(props) if props else 1
    elif not tl:
        raise ValueError("empty topic name before MQTT 5")
    if n > VARINT_MAX:
        raise ValueError("packet too large for MQTT")
    buf[0] = 0x30 | (8 if dup else 0) | qos << 1 | (1 if retain else 0)
    p = put_varint(buf, 1, n)
    p = put_data(buf, p, topic)
    if qos:
        p = put_u16(buf, p, pid)
    if version == V5:
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
    if ptype < PUBACK or ptype > PUBCOMP:
        raise ValueError("not an acknowledgement type")
    if pid < 1 or pid > 65535:
        raise ValueError("packet identifier must be 1..65535")
    if reason < 0 or reason > 255:
        raise ValueError("reason code out of range")
    buf[0] = ptype << 4 | (2 if ptype == PUBREL else 0)
    buf[2] = pid >> 8
    buf[3] = pid & 0xFF
    if version == V5 and reason:
        buf[1] = 3
        buf[4] = reason
        return 5
    buf[1] = 2
    return 4


PINGREQ_BYTES = b"\xc0\x00"
PINGRESP_BYTES = b"\xd0\x00"


def _check_topic_name(buf, p, end, version, may_be_empty):
    check_utf8(buf, p, end)
    if p == end and not may_be_empty:
        raise MQTTError(TOPIC_NAME_INVALID, "empty topic name")
    while p < end:
        c = buf[p]
        if c == 0x23 or c == 0x2B:  # '#' '+'
            raise MQTTError(TOPIC_NAME_INVALID, "wildcard in a topic name")
        p += 1


def parse_publish(m, buf, pos, end, version):
    """Fill the preallocated object m from the PUBLISH frame buf[pos:end].

    Sets m.qos, m.retain, m.dup, m.pid and the offsets m.topic_start/_end,
    m.props_start/_end and m.payload_start/_end into buf. Properties are only
    located here; `scan_publish_props` checks them. Allocates nothing.
    """
    b0 = buf[pos]
    qos = (b0 >> 1) & 3
    if qos == 3:
        fail("QoS 3")
    if b0 & 8 and not qos:
        fail("DUP set on a QoS 0 PUBLISH")
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
            fail("packet identifier 0")
        p += 2
    else:
        pid = 0
    if version == V5:
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
    _check_topic_name(buf, m.topic_start, m.topic_end, version, version == V5)


def scan_publish_props(m, buf, sub_ids):
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
        i = _props._entry(pid)
        if i < 0 or not (_props._TABLE[i + 2] << 8 | _props._TABLE[i + 3]) & (1 << PUBLISH):
            fail("property 0x%02X not allowed in PUBLISH" % pid)
        t = _props._TABLE[i + 1]
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


# ------------------------------------------------------------- general path


def _u16b(n):
    if n < 0 or n > 65535:
        raise ValueError("two-byte integer out of range: %r" % n)
    return bytes((n >> 8, n & 0xFF))


def _pidb(pid):
    if pid < 1 or pid > 65535:
        raise ValueError("packet identifier must be 1..65535, got %r" % pid)
    return _u16b(pid)


def _strb(s):
    b = utf8(s)
    return _u16b(len(b)) + b


def _binb(b):
    b = b.encode() if isinstance(b, str) else bytes(b)
    return _u16b(len(b)) + b


def _check_qos(q):
    if q not in (0, 1, 2):
        raise ValueError("QoS must be 0, 1 or 2, got %r" % q)


def encode(p, version=V311):
    """The packet as bytes, for the given protocol level (CONNECT uses its own)."""
    t = p.type
    flags = 0
    parts = []
    add = parts.append
    v5 = version == V5
    if t == CONNECT:
        version = p.version
        v5 = version == V5
        if version == V31:
            add(b"\x00\x06MQIsdp\x03")
        elif version in (V311, V5):
            add(b"\x00\x04MQTT" + bytes((version,)))
        else:
            raise ValueError("protocol version must be 3, 4 or 5")
        cf = 2 if p.clean else 0
        if p.will_topic is not None:
            _check_qos(p.will_qos)
            cf |= 4 | p.will_qos << 3 | (0x20 if p.will_retain else 0)
        if p.username is not None:
            cf |= 0x80
        if p.password is not None:
            if not v5 and p.username is None:
                raise ValueError("MQTT 3 needs a username when a password is given")
            cf |= 0x40
        add(bytes((cf,)))
        add(_u16b(p.keepalive))
        if v5:
            add(_props.encode(p.props, CONNECT))
        add(_strb(p.client_id))
        if p.will_topic is not None:
            if v5:
                add(_props.encode(p.will_props, _props.WILL))
            add(_strb(p.will_topic))
            add(_binb(p.will_payload))
        if p.username is not None:
            add(_strb(p.username))
        if p.password is not None:
            add(_binb(p.password))
    elif t == CONNACK:
        if version == V31:
            add(b"\x00")
        else:
            add(b"\x01" if p.session_present else b"\x00")
        add(bytes((p.reason,)))
        if v5:
            add(_props.encode(p.props, CONNACK))
    elif t == PUBLISH:
        _check_qos(p.qos)
        if p.dup and not p.qos:
            raise ValueError("DUP may only be set on QoS 1 and 2")
        flags = (8 if p.dup else 0) | p.qos << 1 | (1 if p.retain else 0)
        tb = utf8(p.topic)
        if b"#" in tb or b"+" in tb:
            raise ValueError("wildcard in a topic name")
        if not tb and not (v5 and p.props and _props.TOPIC_ALIAS in p.props):
            raise ValueError("empty topic name (MQTT 5 allows it only with a topic alias)")
        add(_u16b(len(tb)) + tb)
        if p.qos:
            add(_pidb(p.pid))
        if v5:
            add(_props.encode(p.props, PUBLISH))
        pl = p.payload
        add(pl.encode() if isinstance(pl, str) else pl)
    elif PUBACK <= t <= PUBCOMP:
        if t == PUBREL:
            flags = 2
        add(_pidb(p.pid))
        if v5 and (p.reason or p.props):
            add(bytes((p.reason,)))
            if p.props:
                add(_props.encode(p.props, t))
    elif t == SUBSCRIBE or t == UNSUBSCRIBE:
        flags = 2
        add(_pidb(p.pid))
        if v5:
            add(_props.encode(p.props, t))
        if not p.topics:
            raise ValueError("%s needs at least one topic filter" % packet_name(t))
        for f in p.topics:
            if t == SUBSCRIBE:
                o = f[1]
                if o & 3 == 3 or o & (0xC0 if v5 else 0xFC) or (v5 and o & 0x30 == 0x30) or o < 0:
                    raise ValueError("invalid subscription options 0x%02X" % o)
                add(_strb(f[0]))
                add(bytes((o,)))
            else:
                add(_strb(f))
    elif t == SUBACK or t == UNSUBACK:
        add(_pidb(p.pid))
        if v5:
            add(_props.encode(p.props, t))
        if t == SUBACK or v5:
            add(bytes(p.reasons))
    elif t == PINGREQ or t == PINGRESP:
        pass
    elif t == DISCONNECT or t == AUTH:
        if t == AUTH and not v5:
            raise ValueError("AUTH exists only in MQTT 5")
        if v5 and (p.reason or p.props):
            add(bytes((p.reason,)))
            if p.props:
                add(_props.encode(p.props, t))
    else:
        raise ValueError("unknown packet type %r" % t)
    n = 0
    for x in parts:
        n += len(x)
    if n > VARINT_MAX:
        raise ValueError("packet too large for MQTT")
    out = bytearray(1 + varint_size(n) + n)
    out[0] = t << 4 | flags
    pos = put_varint(out, 1, n)
    for x in parts:
        out[pos : pos + len(x)] = x
        pos += len(x)
    return bytes(out)


def _reason(r, allowed):
    c = r.u8()
    if c not in allowed:
        raise MQTTError(PROTOCOL_ERROR, "protocol error: reason code 0x%02X not allowed here" % c)
    return c


def _done(r):
    if r.pos != r.end:
        fail("%d unexpected bytes at the end" % (r.end - r.pos))


def decode(buf, version=V311, max_size=VARINT_MAX + 5):
    """Decode exactly one packet from buf (bytes, bytearray or memoryview).

    PUBLISH payloads are memoryviews into buf. Raises MQTTError, and only
    MQTTError, for anything malformed.
    """
    end = len(buf)
    n = frame_size(buf, 0, end, max_size)
    if n < 0 or n > end:
        fail("truncated")
    if n < end:
        fail("%d bytes after the packet" % (end - n))
    b0 = buf[0]
    t = b0 >> 4
    flags = b0 & 15
    if t == PUBLISH:
        pass
    elif t in (PUBREL, SUBSCRIBE, UNSUBSCRIBE):
        if flags != 2:
            fail("reserved flags of %s must be 0010" % packet_name(t))
    elif flags:
        fail("reserved flags of %s must be 0" % packet_name(t))
    r = Reader(buf, n - get_varint(buf, 1, end), n)  # body: after the fixed header
    v5 = version == V5
    p = Packet(t)
    if t == CONNECT:
        name = r.string()
        level = r.u8()
        if not ((name == "MQIsdp" and level == V31) or (name == "MQTT" and level in (V311, V5))):
            if name in ("MQTT", "MQIsdp"):
                raise MQTTError(0x84, "unsupported protocol version %d" % level)
            fail("unknown protocol name %r" % name)
        v5 = level == V5
        p.version = level
        cf = r.u8()
        if cf & 1:
            fail("reserved CONNECT flag set")
        p.clean = bool(cf & 2)
        p.keepalive = r.u16()
        if v5:
            p.props = _props.decode(r, CONNECT)
        p.client_id = r.string()
        if cf & 4:
            q = (cf >> 3) & 3
            if q == 3:
                fail("will QoS 3")
            p.will_qos = q
            p.will_retain = bool(cf & 0x20)
            if v5:
                p.will_props = _props.decode(r, _props.WILL)
            p.will_topic = r.string()
            p.will_payload = r.binary()
        elif cf & 0x38:
            fail("will QoS or retain set without a will")
        if cf & 0x80:
            p.username = r.string()
        if cf & 0x40:
            if not v5 and not cf & 0x80:
                fail("password without a username")
            p.password = r.binary()
    elif t == CONNACK:
        af = r.u8()
        if version != V31:
            if af & 0xFE:
                fail("reserved CONNACK flags set")
            p.session_present = bool(af & 1)
        if v5:
            p.reason = _reason(r, _CONNACK_RC)
            if p.reason and p.session_present:
                raise MQTTError(PROTOCOL_ERROR, "protocol error: session present with a refusal")
            p.props = _props.decode(r, CONNACK)
        else:
            p.reason = r.u8()
            if p.reason > 5:
                raise MQTTError(PROTOCOL_ERROR, "protocol error: CONNACK return code %d" % p.reason)
            if p.reason and p.session_present:
                raise MQTTError(PROTOCOL_ERROR, "protocol error: session present with a refusal")
    elif t == PUBLISH:
        parse_publish(p, buf, 0, n, version)
        r.pos = p.topic_end
        p.topic = str(buf[p.topic_start : p.topic_end], "utf-8")
        if p.qos:
            r.pos += 2
        p.retain = bool(p.retain)
        p.dup = bool(p.dup)
        if v5:
            p.props = _props.decode(r, PUBLISH)
            if not p.topic and not (p.props and _props.TOPIC_ALIAS in p.props):
                raise MQTTError(PROTOCOL_ERROR, "protocol error: empty topic without a topic alias")
        p.payload = r.rest()
        for a in ("topic_start", "topic_end", "props_start", "props_end", "payload_start", "payload_end"):
            delattr(p, a)
    elif PUBACK <= t <= PUBCOMP:
        p.pid = r.u16()
        if not p.pid:
            fail("packet identifier 0")
        if v5 and r.left():
            p.reason = _reason(r, _PUBREL_RC if t in (PUBREL, PUBCOMP) else _PUBACK_RC)
            if r.left():
                p.props = _props.decode(r, t)
    elif t == SUBSCRIBE or t == UNSUBSCRIBE:
        p.pid = r.u16()
        if not p.pid:
            fail("packet identifier 0")
        if v5:
            p.props = _props.decode(r, t)
        topics = []
        while r.left():
            f = r.string()
            if t == UNSUBSCRIBE:
                topics.append(f)
                continue
            o = r.u8()
            if o & 3 == 3:
                fail("subscription QoS 3")
            if v5:
                if o & 0xC0:
                    fail("reserved subscription option bits set")
                if o & 0x30 == 0x30:
                    raise MQTTError(PROTOCOL_ERROR, "protocol error: retain handling 3")
                if o & 4 and f.startswith("$share/"):
                    raise MQTTError(PROTOCOL_ERROR, "protocol error: No Local on a shared subscription")
            elif o & 0xFC:
                fail("reserved subscription option bits set")
            topics.append((f, o))
        if not topics:
            raise MQTTError(PROTOCOL_ERROR, "protocol error: %s with no topic filter" % packet_name(t))
        p.topics = topics
    elif t == SUBACK or t == UNSUBACK:
        p.pid = r.u16()
        if not p.pid:
            fail("packet identifier 0")
        if v5:
            p.props = _props.decode(r, t)
        rs = []
        if t == SUBACK or v5:
            ok = _SUBACK_RC if t == SUBACK else _UNSUBACK_RC
            if not v5:
                ok = _SUBACK_RC_V3
            while r.left():
                rs.append(_reason(r, ok))
            if not rs:
                raise MQTTError(PROTOCOL_ERROR, "protocol error: %s with no reason code" % packet_name(t))
        p.reasons = rs
    elif t == PINGREQ or t == PINGRESP:
        pass
    elif t == DISCONNECT or t == AUTH:
        if t == AUTH and not v5:
            fail("packet type 15 is reserved before MQTT 5")
        if v5 and r.left():
            p.reason = _reason(r, _DISCONNECT_RC if t == DISCONNECT else _AUTH_RC)
            if r.left():
                p.props = _props.decode(r, t)
    _done(r)
    return p
