"""Control packets <-> bytes for MQTT 3.1 (MQIsdp, level 3), 3.1.1 (level 4)
and 5.0 (level 5): every one of the 15 packet types, both directions.

`encode(packet, version)` / `decode(frame, version, max_size)` work on
`Packet` objects and allocate freely: for tests, the scripted broker, the
chaos proxy and any host code. What a client sends and receives is
implemented once, in `tern.pkt` (the module a device loads); this module adds
the server's side (decoding CONNECT, SUBSCRIBE, UNSUBSCRIBE and PUBLISH in
full, encoding CONNACK, PUBLISH, SUBACK, UNSUBACK, PINGRESP) and re-exports
the steady-path functions (`frame_size`, `publish_header_into`, `ack_into`,
`parse_publish`, and `scan_publish_props` from `tern.props`), so both paths
apply the same rules and the tests hold them to it.

Decoding is bounded: `frame_size` rejects a packet larger than the limit from
its fixed header alone, before a byte of the body is read or stored.
"""

from .wire import (
    MQTTError,
    PROTOCOL_ERROR,
    CONNECT,
    CONNACK,
    PUBLISH,
    SUBSCRIBE,
    SUBACK,
    UNSUBSCRIBE,
    UNSUBACK,
    PINGREQ,
    PINGRESP,
    V31,
    V311,
    V5,
    VARINT_MAX,
    fail,
    utf8,
    check_utf8,
)
from . import pkt as _pkt
from . import props as _props
from .pkt import (  # noqa: F401  (re-exported: the steady path)
    frame_size,
    publish_header_into,
    ack_into,
    parse_publish,
    PINGREQ_BYTES,
)

PINGRESP_BYTES = b"\xd0\x00"

scan_publish_props = _props.scan_publish

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


class Packet(_pkt.Packet):
    """One control packet (fields and defaults: see tern.pkt.Packet), with
    equality and a readable repr for tests and logs."""

    # PUBLISH: a client sends and parses it through the steady path instead.
    topic = ""
    payload = b""
    qos = 0
    retain = False
    dup = False

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


def encode(p, version=V311):
    """The packet as bytes, for the given protocol level (CONNECT uses its own)."""
    t = p.type
    if t not in (CONNACK, PUBLISH, SUBACK, UNSUBACK, PINGRESP):
        return _pkt.encode(p, version)
    flags = 0
    parts = []
    add = parts.append
    v5 = version == V5
    if t == CONNACK:
        if version == V31:
            add(b"\x00")
        else:
            add(b"\x01" if p.session_present else b"\x00")
        add(bytes((p.reason,)))
        if v5:
            add(_pkt.props_block(p.props, CONNACK))
    elif t == PUBLISH:
        if p.dup and not p.qos:
            raise ValueError("DUP on QoS 0")
        flags = (8 if p.dup else 0) | _pkt.check("QoS", p.qos, 0, 2) << 1 | (1 if p.retain else 0)
        tb = utf8(p.topic)
        if b"#" in tb or b"+" in tb:
            raise ValueError("wildcard in a topic name")
        if not tb and not (v5 and p.props and _props.TOPIC_ALIAS in p.props):
            raise ValueError("empty topic name (MQTT 5 allows it only with a topic alias)")
        add(_pkt.datab(tb))
        if p.qos:
            add(_pkt.u16b(_pkt.check("packet id", p.pid, 1, 65535)))
        if v5:
            add(_pkt.props_block(p.props, PUBLISH))
        pl = p.payload
        add(pl.encode() if isinstance(pl, str) else pl)
    elif t == SUBACK or t == UNSUBACK:
        add(_pkt.u16b(_pkt.check("packet id", p.pid, 1, 65535)))
        if v5:
            add(_pkt.props_block(p.props, t))
        if t == SUBACK or v5:
            add(bytes(p.reasons))
    return _pkt.frame(t, flags, parts)


def decode(buf, version=V311, max_size=VARINT_MAX + 5):
    """Decode exactly one packet from buf (bytes, bytearray or memoryview).

    PUBLISH payloads are memoryviews into buf. Raises MQTTError, and only
    MQTTError, for anything malformed.
    """
    return _pkt.decode(buf, version, max_size, Packet, _server_body)


def _binary(r):
    # Two-byte length then the bytes, from Reader r: the fields only a server reads.
    n = r.u16()
    p = r.need(n)
    r.pos = p + n
    return bytes(r.buf[p : p + n])


def _string(r):
    b = _binary(r)
    check_utf8(b, 0, len(b))
    return str(b, "utf-8")


def _server_body(p, r, version):
    """The bodies only a server receives (CONNECT, PUBLISH in full, SUBSCRIBE,
    UNSUBSCRIBE, PINGREQ): tern.pkt.decode calls this first and decodes the
    rest itself. True when p was one of these."""
    t = p.type
    v5 = version == V5
    buf = r.buf
    n = r.end
    if t == CONNECT:
        name = _string(r)
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
        p.client_id = _string(r)
        if cf & 4:
            q = (cf >> 3) & 3
            if q == 3:
                fail("will QoS 3")
            p.will_qos = q
            p.will_retain = bool(cf & 0x20)
            if v5:
                p.will_props = _props.decode(r, _props.WILL)
            p.will_topic = _string(r)
            p.will_payload = _binary(r)
        elif cf & 0x38:
            fail("will QoS or retain set without a will")
        if cf & 0x80:
            p.username = _string(r)
        if cf & 0x40:
            if not v5 and not cf & 0x80:
                fail("password without a username")
            p.password = _binary(r)
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
        p.payload = memoryview(buf)[r.pos : n]
        r.pos = n
        for a in ("topic_start", "topic_end", "props_start", "props_end", "payload_start", "payload_end"):
            delattr(p, a)
    elif t == SUBSCRIBE or t == UNSUBSCRIBE:
        p.pid = r.u16()
        if not p.pid:
            fail("packet identifier 0")
        if v5:
            p.props = _props.decode(r, t)
        topics = []
        while r.pos < n:
            f = _string(r)
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
    elif t != PINGREQ:
        return False
    return True
