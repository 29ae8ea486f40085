"""Property-based round trips: every packet type in every protocol version,
with field values (MQTT 5 properties included) drawn from what the
specification allows for that packet. decode(encode(p)) == p, the encoding
is stable, frame_size measures it, and the steady-path PUBLISH parser agrees.
"""

from hypothesis import HealthCheck, given, settings, strategies as st

from tern import props
from tern.codec import Packet, decode, encode, frame_size, parse_publish, scan_publish_props, publish_header_into
from tern.wire import (
    AUTH, CONNACK, CONNECT, DISCONNECT, PINGREQ, PINGRESP, PUBACK, PUBCOMP, PUBLISH, PUBREC, PUBREL,
    SUBACK, SUBSCRIBE, UNSUBACK, UNSUBSCRIBE, V31, V311, V5,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text MQTT accepts: no U+0000, no surrogates (Python str can't hold encoded
# surrogates as UTF-8 anyway).
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
nonempty_text = text.filter(bool)
binary = st.binary(max_size=24)
u8bool = st.integers(0, 1)
u16 = st.integers(0, 65535)
u16nz = st.integers(1, 65535)
u32 = st.integers(0, 0xFFFFFFFF)
u32nz = st.integers(1, 0xFFFFFFFF)
varint_nz = st.integers(1, 268435455)
pid = st.integers(1, 65535)
topic_name = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00#+"),
                     min_size=1, max_size=16)
topic_filter = st.one_of(
    st.just("#"), st.just("+/+"), st.just("a/#"),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=16),
)
user_props = st.lists(st.tuples(text, text), min_size=1, max_size=3)

# Value strategy for each property identifier; the packets each may go in come
# from the spec table restated in tests/lib/test_props.py (checked there).
VALUE = {
    0x01: u8bool, 0x02: u32, 0x03: text, 0x08: topic_name, 0x09: binary,
    0x11: u32, 0x12: text, 0x13: u16, 0x15: text, 0x16: binary, 0x17: u8bool, 0x18: u32, 0x19: u8bool,
    0x1A: text, 0x1C: text, 0x1F: text, 0x21: u16nz, 0x22: u16, 0x23: u16nz, 0x24: u8bool,
    0x25: u8bool, 0x26: user_props, 0x27: u32nz, 0x28: u8bool, 0x29: u8bool, 0x2A: u8bool,
}


def props_for(ptype):
    ids = [i for i in range(0x2B) if props.allowed(i, ptype)]
    assert ids or ptype in (PINGREQ, PINGRESP)
    fields = {}
    for i in ids:
        if i == 0x0B:
            fields[i] = st.lists(varint_nz, min_size=1, max_size=3) if ptype == PUBLISH else varint_nz
        else:
            fields[i] = VALUE[i]

    @st.composite
    def build(draw):
        chosen = draw(st.lists(st.sampled_from(ids), unique=True, max_size=5)) if ids else []
        out = {i: draw(fields[i]) for i in chosen}
        return out or None

    return build()


versions = st.sampled_from([V31, V311, V5])


@st.composite
def connect(draw, v):
    v5 = v == V5
    p = Packet(CONNECT, version=v, clean=draw(st.booleans()), keepalive=draw(u16),
               client_id=draw(text), props=draw(props_for(CONNECT)) if v5 else None)
    if draw(st.booleans()):
        p.will_topic = draw(topic_name)
        p.will_payload = draw(binary)
        p.will_qos = draw(st.integers(0, 2))
        p.will_retain = draw(st.booleans())
        if v5:
            p.will_props = draw(props_for(0))
    if draw(st.booleans()):
        p.username = draw(text)
    if draw(st.booleans()) and (v5 or p.username is not None):
        p.password = draw(binary)
    return p


@st.composite
def connack(draw, v):
    if v == V5:
        reason = draw(st.sampled_from([0, 0x80, 0x81, 0x82, 0x84, 0x86, 0x87, 0x8C, 0x95, 0x9F]))
        return Packet(CONNACK, session_present=draw(st.booleans()) if not reason else False, reason=reason,
                      props=draw(props_for(CONNACK)))
    reason = draw(st.integers(0, 5))
    return Packet(CONNACK, session_present=draw(st.booleans()) if v == V311 and not reason else False,
                  reason=reason)


@st.composite
def publish(draw, v):
    q = draw(st.integers(0, 2))
    pr = draw(props_for(PUBLISH)) if v == V5 else None
    topic = draw(topic_name)
    if pr and 0x23 in pr and draw(st.booleans()):
        topic = ""
    return Packet(PUBLISH, topic=topic, qos=q, pid=draw(pid) if q else 0, retain=draw(st.booleans()),
                  dup=draw(st.booleans()) if q else False, payload=draw(st.binary(max_size=300)), props=pr)


@st.composite
def ack(draw, v, t):
    p = Packet(t, pid=draw(pid))
    if v == V5:
        codes = [0, 0x92] if t in (PUBREL, PUBCOMP) else [0, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99]
        p.reason = draw(st.sampled_from(codes))
        p.props = draw(props_for(t))
    return p


@st.composite
def subscribe(draw, v):
    if v == V5:
        opts = st.integers(0, 0x3F).filter(lambda o: o & 3 != 3 and o & 0x30 != 0x30)
    else:
        opts = st.integers(0, 2)
    topics = draw(st.lists(st.tuples(topic_filter.filter(lambda f: not f.startswith("$share/")), opts),
                           min_size=1, max_size=4))
    return Packet(SUBSCRIBE, pid=draw(pid), topics=topics, props=draw(props_for(SUBSCRIBE)) if v == V5 else None)


@st.composite
def suback(draw, v):
    codes = [0, 1, 2, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2] if v == V5 else [0, 1, 2, 0x80]
    return Packet(SUBACK, pid=draw(pid), reasons=draw(st.lists(st.sampled_from(codes), min_size=1, max_size=5)),
                  props=draw(props_for(SUBACK)) if v == V5 else None)


@st.composite
def unsubscribe(draw, v):
    return Packet(UNSUBSCRIBE, pid=draw(pid), topics=draw(st.lists(topic_filter, min_size=1, max_size=4)),
                  props=draw(props_for(UNSUBSCRIBE)) if v == V5 else None)


@st.composite
def unsuback(draw, v):
    if v != V5:
        return Packet(UNSUBACK, pid=draw(pid))
    codes = [0, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91]
    return Packet(UNSUBACK, pid=draw(pid), reasons=draw(st.lists(st.sampled_from(codes), min_size=1, max_size=5)),
                  props=draw(props_for(UNSUBACK)))


@st.composite
def disconnect(draw, v):
    if v != V5:
        return Packet(DISCONNECT)
    return Packet(DISCONNECT, reason=draw(st.sampled_from([0, 4, 0x80, 0x81, 0x82, 0x8E, 0x93, 0x9C, 0xA2])),
                  props=draw(props_for(DISCONNECT)))


@st.composite
def auth(draw):
    return Packet(AUTH, reason=draw(st.sampled_from([0, 0x18, 0x19])), props=draw(props_for(AUTH)))


def check_round_trip(p, v):
    b = encode(p, v)
    assert frame_size(b, 0, len(b), len(b)) == len(b)
    back = decode(b, v)
    assert back == p, (p, b.hex(), back)
    assert encode(back, v) == b
    # split anywhere: the prefix is "not yet complete" or an error, never a wrong packet
    return b


@given(v=versions, data=st.data())
@SETTINGS
def test_connect(v, data):
    check_round_trip(data.draw(connect(v)), v)


@given(v=versions, data=st.data())
@SETTINGS
def test_connack(v, data):
    check_round_trip(data.draw(connack(v)), v)


@given(v=versions, data=st.data())
@settings(max_examples=150, deadline=None)
def test_publish_and_fast_path(v, data):
    p = data.draw(publish(v))
    b = check_round_trip(p, v)

    class M:
        pass

    m = M()
    ids = [0] * 4
    parse_publish(m, b, 0, len(b), v)
    if v == V5:
        scan_publish_props(m, b, ids)
        pr = p.props or {}
        assert m.alias == pr.get(0x23, 0)
        assert ids[:m.n_sub_ids] == pr.get(0x0B, [])[:4] and m.n_sub_ids == len(pr.get(0x0B, []))
    assert b[m.topic_start:m.topic_end] == p.topic.encode()
    assert b[m.payload_start:m.payload_end] == p.payload
    assert (m.qos, m.pid, bool(m.retain), bool(m.dup)) == (p.qos, p.pid, p.retain, p.dup)
    # the zero-allocation writer produces the same bytes
    buf = bytearray(len(b))
    pb = props.encode(p.props, PUBLISH) if p.props else None
    n = publish_header_into(buf, p.topic.encode(), p.qos, p.retain, p.dup, p.pid, len(p.payload), v, pb)
    buf[n:] = p.payload
    assert bytes(buf) == b


@given(v=versions, t=st.sampled_from([PUBACK, PUBREC, PUBREL, PUBCOMP]), data=st.data())
@SETTINGS
def test_acks(v, t, data):
    check_round_trip(data.draw(ack(v, t)), v)


@given(v=versions, data=st.data())
@SETTINGS
def test_subscribe_suback(v, data):
    check_round_trip(data.draw(subscribe(v)), v)
    check_round_trip(data.draw(suback(v)), v)


@given(v=versions, data=st.data())
@SETTINGS
def test_unsubscribe_unsuback(v, data):
    check_round_trip(data.draw(unsubscribe(v)), v)
    check_round_trip(data.draw(unsuback(v)), v)


@given(v=versions, data=st.data())
@SETTINGS
def test_ping_disconnect(v, data):
    check_round_trip(Packet(PINGREQ), v)
    check_round_trip(Packet(PINGRESP), v)
    check_round_trip(data.draw(disconnect(v)), v)


@given(data=st.data())
@SETTINGS
def test_auth(data):
    check_round_trip(data.draw(auth()), V5)


@given(v=versions, data=st.data(), cut=st.integers(0, 10_000))
@SETTINGS
def test_any_prefix_is_incomplete_or_an_error(v, data, cut):
    from tern.wire import MQTTError

    p = data.draw(st.one_of(publish(v), connect(v), subscribe(v), suback(v)))
    b = encode(p, v)
    k = cut % len(b)
    n = frame_size(b, 0, k, 1 << 20)
    assert n == -1 or n == len(b)
    try:
        decode(b[:k], v)
    except MQTTError as e:
        assert e.code == 0x81
    else:
        raise AssertionError("a prefix of %d bytes decoded" % k)
