"""The codec against hand-worked byte vectors, round trips of every packet
type in every protocol version, the malformed-input rules with their reason
codes, and the steady (zero-allocation) path agreeing with the general one.

Runs under CPython and the MicroPython unix port (tests/lib/conftest.py).
"""

from check import raises
from tern import codec, props, wire
from tern.codec import Packet, encode, decode, frame_size, parse_publish, scan_publish_props
from tern.wire import (
    MQTTError,
    CONNECT,
    CONNACK,
    PUBLISH,
    PUBACK,
    PUBREC,
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
)

VERSIONS = (V31, V311, V5)
MALFORMED = 0x81
PROTOCOL_ERROR = 0x82
TOPIC_NAME_INVALID = 0x90
TOO_LARGE = 0x95


def h(s):
    """Bytes from hex written with spaces, as the vectors below are."""
    return bytes(int(x, 16) for x in s.split())


def hexs(b):
    return " ".join("%02X" % x for x in b)


def code_of(buf, version=V311, max_size=1 << 28):
    e = raises(MQTTError, decode, buf, version, max_size)
    return e.code


def expect(buf, version, code):
    got = code_of(buf, version)
    assert got == code, "%s (v%d): reason 0x%02X, expected 0x%02X" % (hexs(buf), version, got, code)


def vector(pkt, version, want_hex):
    want = h(want_hex)
    got = encode(pkt, version)
    assert got == want, "encode %r v%d:\n got  %s\n want %s" % (pkt, version, hexs(got), hexs(want))
    back = decode(want, version)
    assert back == pkt, "decode v%d: %r != %r" % (version, back, pkt)


# ------------------------------------------------------------------ vectors


def test_pingreq_pingresp_bytes():
    for v in VERSIONS:
        vector(Packet(PINGREQ), v, "C0 00")
        vector(Packet(PINGRESP), v, "D0 00")
    assert codec.PINGREQ_BYTES == h("C0 00") and codec.PINGRESP_BYTES == h("D0 00")


def test_subscribe_payload_of_the_spec_example():
    pkt = Packet(SUBSCRIBE, pid=10, topics=[("a/b", 1), ("c/d", 2)])
    for v in (V31, V311):
        b = encode(pkt, v)
        # fixed header 1000 0010, remaining length 2 + 12, packet id, payload
        assert b[:4] == h("82 0E 00 0A"), hexs(b)
        assert b[4:] == h("00 03 61 2F 62 01 00 03 63 2F 64 02"), hexs(b[4:])
        assert decode(b, v) == pkt
    b = encode(pkt, V5)  # an empty property block before the same payload
    assert b == h("82 0F 00 0A 00 00 03 61 2F 62 01 00 03 63 2F 64 02"), hexs(b)


def test_connect_31_uses_mqisdp_level_3():
    pkt = Packet(CONNECT, version=V31, client_id="c", keepalive=60, clean=True)
    vector(pkt, V31, "10 0F 00 06 4D 51 49 73 64 70 03 02 00 3C 00 01 63")


def test_connect_311_with_will_username_password():
    pkt = Packet(
        CONNECT, version=V311, client_id="id", keepalive=10, clean=True,
        will_topic="w", will_payload=b"x", will_qos=1, will_retain=True,
        username="u", password=b"p",
    )
    # flags: user 80 | password 40 | will retain 20 | will QoS 1 08 | will 04 | clean 02 = EE
    vector(pkt, V311, "10 1A 00 04 4D 51 54 54 04 EE 00 0A 00 02 69 64 00 01 77 00 01 78 00 01 75 00 01 70")


def test_connect_5_with_properties():
    pkt = Packet(CONNECT, version=V5, client_id="", keepalive=0, clean=True,
                 props={0x21: 20, 0x11: 3600})
    # properties go out in identifier order: session expiry 3600, receive maximum 20
    vector(pkt, V5, "10 15 00 04 4D 51 54 54 05 02 00 00 08 11 00 00 0E 10 21 00 14 00 00")
    will = Packet(CONNECT, version=V5, client_id="d", clean=False, keepalive=5,
                  will_topic="t", will_payload=b"", will_props={0x18: 1})
    vector(will, V5, "10 19 00 04 4D 51 54 54 05 04 00 05 00 00 01 64 05 18 00 00 00 01 00 01 74 00 00")


def test_connect_decoded_version_is_the_packets_own():
    b = encode(Packet(CONNECT, version=V5, client_id="x"))
    for v in VERSIONS:  # the level inside CONNECT wins over the connection's
        assert decode(b, v).version == V5


def test_pubrel_flags_0010_and_acks():
    vector(Packet(PUBREL, pid=1), V311, "62 02 00 01")
    vector(Packet(PUBACK, pid=0x1234), V311, "40 02 12 34")
    vector(Packet(PUBREC, pid=65535), V31, "50 02 FF FF")
    vector(Packet(PUBCOMP, pid=7), V5, "70 02 00 07")
    vector(Packet(PUBACK, pid=7, reason=0x10), V5, "40 03 00 07 10")
    vector(Packet(PUBREL, pid=7, reason=0x92, props={0x1F: "x"}), V5, "62 08 00 07 92 04 1F 00 01 78")


def test_publish_5_with_expiry_user_property_and_subscription_ids():
    pkt = Packet(PUBLISH, topic="t", qos=1, pid=10, payload=b"hi",
                 props={0x26: [("k", "v")], 0x0B: [1, 200], 0x02: 60})
    vector(pkt, V5, "32 19 00 01 74 00 0A 11 02 00 00 00 3C 0B 01 0B C8 01 26 00 01 6B 00 01 76 68 69")


def test_publish_qos0_retain_and_dup_qos2():
    vector(Packet(PUBLISH, topic="a/b", payload=b"\x01", retain=True), V311, "31 06 00 03 61 2F 62 01")
    vector(Packet(PUBLISH, topic="a", qos=2, dup=True, pid=2), V31, "3C 05 00 01 61 00 02")
    vector(Packet(PUBLISH, topic="", qos=0, props={0x23: 3}), V5, "30 06 00 00 03 23 00 03")


def test_connack_5_with_limits():
    pkt = Packet(CONNACK, session_present=False, reason=0, props={0x27: 1024, 0x21: 10, 0x22: 5})
    vector(pkt, V5, "20 0E 00 00 0B 21 00 0A 22 00 05 27 00 00 04 00")
    vector(Packet(CONNACK, session_present=True), V311, "20 02 01 00")
    vector(Packet(CONNACK, reason=5), V31, "20 02 00 05")


def test_suback_unsuback_disconnect_auth_vectors():
    vector(Packet(SUBACK, pid=10, reasons=[1, 2, 0x80]), V311, "90 05 00 0A 01 02 80")
    vector(Packet(SUBACK, pid=10, reasons=[0x87]), V5, "90 04 00 0A 00 87")
    vector(Packet(UNSUBSCRIBE, pid=3, topics=["a/b"]), V311, "A2 07 00 03 00 03 61 2F 62")
    vector(Packet(UNSUBACK, pid=3), V311, "B0 02 00 03")
    vector(Packet(UNSUBACK, pid=3, reasons=[0x11]), V5, "B0 04 00 03 00 11")
    vector(Packet(DISCONNECT), V311, "E0 00")
    vector(Packet(DISCONNECT, reason=0x04), V5, "E0 01 04")
    vector(Packet(AUTH, reason=0x18, props={0x15: "m"}), V5, "F0 06 18 04 15 00 01 6D")


VARINTS = (
    (0, "00"),
    (127, "7F"),
    (128, "80 01"),
    (16383, "FF 7F"),
    (16384, "80 80 01"),
    (2097151, "FF FF 7F"),
    (2097152, "80 80 80 01"),
    (268435455, "FF FF FF 7F"),
)


def test_variable_byte_integer_boundaries():
    for n, enc in VARINTS:
        want = h(enc)
        buf = bytearray(6)
        end = wire.put_varint(buf, 1, n)
        assert bytes(buf[1:end]) == want, "%d -> %s" % (n, hexs(buf[1:end]))
        assert wire.varint_size(n) == len(want)
        assert wire.get_varint(want, 0, len(want)) == n
        # the same integer as a remaining length, seen by frame_size
        hdr = b"\x30" + want
        assert frame_size(hdr, 0, len(hdr), 1 << 29) == 1 + len(want) + n
        # and one byte short it is "not complete yet", not an error
        assert frame_size(hdr, 0, len(hdr) - 1, 1 << 29) == -1
    raises(ValueError, wire.put_varint, bytearray(8), 0, 268435456)
    raises(ValueError, wire.put_varint, bytearray(8), 0, -1)


def test_five_byte_and_non_minimal_varints():
    e = raises(MQTTError, frame_size, h("30 FF FF FF FF 7F"), 0, 6, 1 << 29)
    assert e.code == MALFORMED
    e = raises(MQTTError, frame_size, h("30 80 80 80 80"), 0, 5, 1 << 29)
    assert e.code == MALFORMED  # the fourth byte still continues: no need to wait for a fifth
    expect(h("30 FF FF FF FF 7F"), V311, MALFORMED)
    for nm in ("30 80 00", "30 82 00 00 01 61", "30 80 80 00", "30 FF 80 00"):
        expect(h(nm), V311, MALFORMED)
    # non-minimal property length and property identifier inside MQTT 5 packets
    expect(h("40 05 00 01 00 80 00"), V5, MALFORMED)
    expect(h("40 08 00 01 00 84 00 1F 00 00"), V5, MALFORMED)
    expect(h("40 07 00 01 00 03 9F 00 00"), V5, MALFORMED)


def test_remaining_length_beyond_the_limit_from_the_header_alone():
    big = h("30 FF FF FF 7F")  # claims 256 MiB; only the 5 header bytes exist
    e = raises(MQTTError, frame_size, big, 0, len(big), 1024)
    assert e.code == TOO_LARGE
    e = raises(MQTTError, frame_size, h("30 FE 07"), 0, 3, 1024)  # 1 + 2 + 1022 = 1025
    assert e.code == TOO_LARGE
    assert frame_size(h("30 FD 07"), 0, 3, 1024) == 1024
    assert code_of(big, V311, 1024) == TOO_LARGE
    assert code_of(big, V5, 1 << 29) == MALFORMED  # under the limit: merely truncated


# ----------------------------------------------------------- round trips


def corpus(v):
    """One or more packets of every type valid in version v."""
    v5 = v == V5
    P = Packet
    out = [
        P(CONNECT, version=v, client_id="dev-1", keepalive=30),
        P(CONNECT, version=v, client_id="x", clean=False, will_topic="w/t", will_payload=b"\x00bye",
          will_qos=2, will_retain=True, username="user", password=b"\x00\xffpw"),
        P(CONNACK, reason=0),
        P(PUBLISH, topic="a/b", payload=b"", qos=0),
        P(PUBLISH, topic="caf\u00e9/\u20ac", payload=b"x" * 300, qos=1, pid=1, retain=True),
        P(PUBLISH, topic="q2", payload=bytes(range(256)), qos=2, pid=65535, dup=True),
        P(PUBACK, pid=1),
        P(PUBREC, pid=2),
        P(PUBREL, pid=3),
        P(PUBCOMP, pid=65535),
        P(SUBSCRIBE, pid=9, topics=[("a/+", 0), ("#", 1), ("$SYS/x", 2)]),
        P(SUBACK, pid=9, reasons=[0, 1, 2, 0x80]),
        P(UNSUBSCRIBE, pid=11, topics=["a/+", "#"]),
        P(PINGREQ),
        P(PINGRESP),
        P(DISCONNECT),
    ]
    out.append(P(UNSUBACK, pid=11, reasons=[0, 0x11] if v5 else ()))
    if v != V31:
        out.append(P(CONNACK, session_present=True, reason=0))
    if not v5:
        out.append(P(CONNACK, reason=4))
    else:
        user = [("k", "v"), ("k", "v2"), ("\u00fc", "")]
        out += [
            P(CONNECT, version=v, client_id="", props={0x11: 0xFFFFFFFF, 0x21: 1, 0x22: 0, 0x27: 128,
                                                        0x17: 0, 0x19: 1, 0x15: "SCRAM", 0x16: b"\x01", 0x26: user},
              will_topic="w", will_props={0x01: 1, 0x02: 9, 0x03: "text/plain", 0x08: "r/t", 0x09: b"c",
                                          0x18: 5, 0x26: user}, password=b"no user is fine in 5"),
            P(CONNACK, reason=0x86, props={0x1F: "bad", 0x1C: "other:1883"}),
            P(CONNACK, session_present=True, props={0x11: 0, 0x12: "auto-1", 0x13: 5, 0x15: "m", 0x16: b"",
                                                    0x1A: "ri", 0x21: 65535, 0x22: 10, 0x24: 1, 0x25: 0,
                                                    0x27: 268435455, 0x28: 1, 0x29: 0, 0x2A: 1, 0x26: user}),
            P(PUBLISH, topic="t", qos=1, pid=5, payload=b"p",
              props={0x01: 1, 0x02: 0, 0x03: "ct", 0x08: "resp", 0x09: b"\x00", 0x0B: [1, 268435455], 0x23: 1,
                     0x26: user}),
            P(PUBLISH, topic="", props={0x23: 65535}),
            P(PUBACK, pid=1, reason=0x10),
            P(PUBACK, pid=1, reason=0x99, props={0x1F: "quota", 0x26: user}),
            P(PUBREC, pid=2, reason=0x80, props={0x1F: ""}),
            P(PUBREL, pid=3, reason=0x92),
            P(PUBCOMP, pid=4, reason=0, props={0x26: user}),
            P(SUBSCRIBE, pid=2, topics=[("a", 0x2E), ("b", 0x19), ("$share/g/x", 0x02)],
              props={0x0B: 268435455, 0x26: user}),
            P(SUBACK, pid=2, reasons=[0, 1, 2, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2],
              props={0x1F: "r", 0x26: user}),
            P(UNSUBSCRIBE, pid=3, topics=["a"], props={0x26: user}),
            P(UNSUBACK, pid=3, reasons=[0x80, 0x83, 0x87, 0x8F, 0x91], props={0x1F: "r"}),
            P(DISCONNECT, reason=0x8E, props={0x11: 10, 0x1F: "taken over", 0x1C: "srv", 0x26: user}),
            P(DISCONNECT, reason=0x04),
            P(AUTH),
            P(AUTH, reason=0x19, props={0x15: "SCRAM", 0x16: b"data", 0x1F: "re", 0x26: user}),
        ]
    return out


def test_round_trip_every_type_every_version():
    for v in VERSIONS:
        types = set()
        for pkt in corpus(v):
            b = encode(pkt, v)
            back = decode(b, v)
            assert back == pkt, "v%d: %r -> %s -> %r" % (v, pkt, hexs(b), back)
            assert encode(back, v) == b
            assert decode(bytearray(b), v) == pkt and decode(memoryview(b), v) == pkt
            assert frame_size(b, 0, len(b), len(b)) == len(b)
            types.add(pkt.type)
        want = set(range(1, 16 if v == V5 else 15))
        assert types == want, "v%d misses %r" % (v, want - types)


def test_truncated_packets():
    for v in VERSIONS:
        for pkt in corpus(v):
            b = encode(pkt, v)
            for n in range(len(b)):
                e = raises(MQTTError, decode, b[:n], v)
                assert e.code == MALFORMED, "%s[:%d] v%d: 0x%02X" % (hexs(b), n, v, e.code)
            # a remaining length one short of the body: the packet ends early
            if len(b) > 2 and b[1] < 0x80 and b[1] > 0:
                short = bytearray(b[:-1])
                short[1] -= 1
                try:
                    decode(short, v)
                except MQTTError as e:
                    assert e.code in (MALFORMED, PROTOCOL_ERROR), "%s v%d: 0x%02X" % (hexs(short), v, e.code)
                else:
                    # only packets whose last field is open-ended may still parse
                    assert pkt.type in (PUBLISH, SUBSCRIBE, UNSUBSCRIBE, SUBACK, UNSUBACK) or v == V5, \
                        "%s v%d decoded" % (hexs(short), v)


def test_trailing_bytes():
    for v in VERSIONS:
        expect(h("C0 00 00"), v, MALFORMED)  # a byte after the packet
        expect(h("C0 01 00"), v, MALFORMED)  # PINGREQ with a body
        expect(h("E0 01 00"), V311, MALFORMED)
    expect(h("40 03 00 01 00"), V311, MALFORMED)  # PUBACK: reason codes are MQTT 5 only
    expect(h("20 03 00 00 00"), V311, MALFORMED)
    expect(h("B0 03 00 01 00"), V311, MALFORMED)  # UNSUBACK has no payload before 5
    expect(h("10 0D 00 04 4D 51 54 54 04 02 00 3C 00 01 63 00"), V311, MALFORMED)
    expect(h("40 06 00 01 00 00 00 00"), V5, MALFORMED)  # after an empty property block


# ------------------------------------------------------------- malformed


def test_invalid_utf8_and_forbidden_code_points():
    bad = (
        "FF",  # never valid
        "80",  # lone continuation
        "61 00",  # U+0000
        "ED A0 80",  # encoded surrogate U+D800
        "ED BF BF",  # U+DFFF
        "C0 80",  # overlong U+0000
        "C1 BF",  # overlong
        "E0 80 AF",  # overlong '/'
        "F0 80 80 AF",  # overlong
        "F4 90 80 80",  # above U+10FFFF
        "F5 80 80 80",
        "E2 82",  # truncated
        "C3 41",  # bad continuation
        "E2 82 41",
    )
    for s in bad:
        t = h(s)
        raises(MQTTError, wire.check_utf8, t, 0, len(t))
        raises(ValueError, wire.utf8, t)
        # as a PUBLISH topic name and as a CONNECT client id
        pub = bytes((0x30, 2 + len(t), 0, len(t))) + t
        for v in VERSIONS:
            expect(pub, v, MALFORMED)
        body = h("00 04 4D 51 54 54 04 02 00 3C") + bytes((0, len(t))) + t
        expect(bytes((0x10, len(body))) + body, V311, MALFORMED)
    for s in ("caf\u00e9", "\u20ac", "\U0001d11e", "\ud7ff", "\ue000\uffff", "\U0010ffff"):
        b = s.encode()
        wire.check_utf8(b, 0, len(b))
        assert wire.utf8(s) == b


def test_property_twice():
    # PUBLISH with message expiry twice
    expect(h("30 0E 00 01 74 0A 02 00 00 00 01 02 00 00 00 02"), V5, PROTOCOL_ERROR)
    # CONNACK with receive maximum twice
    expect(h("20 09 00 00 06 21 00 01 21 00 02"), V5, PROTOCOL_ERROR)
    # topic alias twice
    expect(h("30 0A 00 01 74 06 23 00 01 23 00 01"), V5, PROTOCOL_ERROR)
    # subscription identifier twice in SUBSCRIBE (it may repeat only in PUBLISH)
    expect(h("82 0B 00 01 04 0B 01 0B 02 00 01 61 00"), V5, PROTOCOL_ERROR)
    # user property and subscription identifiers in PUBLISH may repeat
    p = decode(h("30 14 00 01 74 10 0B 01 0B 02 26 00 01 61 00 00 26 00 01 61 00 00"), V5)
    assert p.props == {0x0B: [1, 2], 0x26: [("a", ""), ("a", "")]}, p.props


def test_property_not_allowed_or_unknown():
    expect(h("30 09 00 01 74 05 11 00 00 00 01"), V5, MALFORMED)  # session expiry in PUBLISH
    expect(h("20 06 00 00 03 23 00 01"), V5, MALFORMED)  # topic alias in CONNACK
    expect(h("40 07 00 01 00 03 21 00 01"), V5, MALFORMED)  # receive maximum in PUBACK
    expect(h("30 06 00 01 74 02 00 00"), V5, MALFORMED)  # identifier 0
    expect(h("30 06 00 01 74 02 04 00"), V5, MALFORMED)  # identifier 4 does not exist
    expect(h("30 06 00 01 74 02 2B 00"), V5, MALFORMED)  # beyond the table


def test_reserved_flags():
    expect(h("60 02 00 01"), V311, MALFORMED)  # PUBREL must be 0010
    expect(h("63 02 00 01"), V5, MALFORMED)
    expect(h("80 08 00 01 00 03 61 2F 62 00"), V311, MALFORMED)  # SUBSCRIBE 0000
    expect(h("A0 07 00 01 00 03 61 2F 62"), V311, MALFORMED)
    expect(h("42 02 00 01"), V311, MALFORMED)  # PUBACK 0010
    expect(h("C1 00"), V311, MALFORMED)
    expect(h("E8 00"), V5, MALFORMED)
    # CONNECT reserved flag bit 0
    expect(h("10 0D 00 04 4D 51 54 54 04 03 00 3C 00 01 63"), V311, MALFORMED)
    # will QoS without the will flag
    expect(h("10 0D 00 04 4D 51 54 54 04 0A 00 3C 00 01 63"), V311, MALFORMED)
    # password without a username before MQTT 5
    expect(h("10 10 00 04 4D 51 54 54 04 42 00 3C 00 01 63 00 01 70"), V311, MALFORMED)
    # CONNACK acknowledge flags other than session present
    expect(h("20 02 02 00"), V311, MALFORMED)
    # packet type 0 is reserved
    expect(h("00 00"), V311, MALFORMED)


def test_qos_3_dup_on_qos_0_and_packet_id_0():
    for v in VERSIONS:
        expect(h("36 05 00 01 74 00 01"), v, MALFORMED)  # QoS 3
        expect(h("38 03 00 01 74"), v, MALFORMED)  # DUP on QoS 0
        expect(h("32 05 00 01 74 00 00"), v, MALFORMED)  # QoS 1 with packet id 0
        expect(h("40 02 00 00"), v, MALFORMED)
        expect(h("62 02 00 00"), v, MALFORMED)
        expect(h("82 06 00 00 00 01 61 00"), v if v != V5 else V311, MALFORMED)
        expect(h("90 03 00 00 00"), v if v != V5 else V311, MALFORMED)
    expect(h("82 06 00 01 00 01 61 03"), V311, MALFORMED)  # subscription QoS 3
    expect(h("82 07 00 01 00 00 01 61 03"), V5, MALFORMED)
    # will QoS 3
    expect(h("10 13 00 04 4D 51 54 54 04 1E 00 3C 00 01 63 00 01 77 00 00"), V311, MALFORMED)


def test_subscribe_rules():
    expect(h("82 02 00 01"), V311, PROTOCOL_ERROR)  # no topic filter
    expect(h("82 03 00 01 00"), V5, PROTOCOL_ERROR)
    expect(h("A2 02 00 01"), V311, PROTOCOL_ERROR)
    for o in (0x04, 0x08, 0x10, 0x20, 0x40, 0x80):  # v3/v4: only the QoS bits exist
        expect(h("82 06 00 01 00 01 61") + bytes((o,)), V311, MALFORMED)
        expect(h("82 06 00 01 00 01 61") + bytes((o,)), V31, MALFORMED)
    for o in (0x40, 0x80, 0xC0):  # v5 bits 6-7
        expect(h("82 07 00 01 00 00 01 61") + bytes((o,)), V5, MALFORMED)
    expect(h("82 07 00 01 00 00 01 61 30"), V5, PROTOCOL_ERROR)  # retain handling 3
    # No Local on a shared subscription
    sub = Packet(SUBSCRIBE, pid=1, topics=[("$share/g/a", 0x04)])
    b = bytearray(encode(Packet(SUBSCRIBE, pid=1, topics=[("$share/g/a", 0)]), V5))
    b[-1] = 0x04
    expect(bytes(b), V5, PROTOCOL_ERROR)
    raises(ValueError, encode, sub, V311)  # 3.1.1 has no No Local bit


def test_auth_only_in_mqtt_5():
    expect(h("F0 00"), V311, MALFORMED)
    expect(h("F0 00"), V31, MALFORMED)
    assert decode(h("F0 00"), V5) == Packet(AUTH)
    raises(ValueError, encode, Packet(AUTH), V311)


def test_wildcard_and_empty_topic_names():
    for v in VERSIONS:
        empty_props = b"\x00" if v == V5 else b""
        for t in (b"a/+", b"#", b"a/#", b"+"):
            body = bytes((0, len(t))) + t + empty_props
            expect(bytes((0x30, len(body))) + body, v, TOPIC_NAME_INVALID)
            raises(ValueError, encode, Packet(PUBLISH, topic=t.decode()), v)
    # lengths 0x23 ('#') and 0x2B ('+') are just lengths
    for n in (0x23, 0x2B, 0x2300 + 0x2B):
        p = Packet(PUBLISH, topic="t" * n)
        assert decode(encode(p, V311), V311) == p
    expect(h("30 02 00 00"), V311, TOPIC_NAME_INVALID)
    expect(h("30 03 00 00 00"), V5, PROTOCOL_ERROR)  # empty topic needs a topic alias
    raises(ValueError, encode, Packet(PUBLISH, topic=""), V311)
    raises(ValueError, encode, Packet(PUBLISH, topic=""), V5)


def test_reason_codes_checked():
    expect(h("20 02 00 06"), V311, PROTOCOL_ERROR)  # CONNACK return code 6 does not exist
    expect(h("20 02 01 05"), V311, PROTOCOL_ERROR)  # session present with a refusal
    expect(h("20 03 01 80 00"), V5, PROTOCOL_ERROR)
    expect(h("20 03 00 05 00"), V5, PROTOCOL_ERROR)  # a 3.1.1 code is not an MQTT 5 reason
    expect(h("40 03 00 01 92"), V5, PROTOCOL_ERROR)  # PUBACK cannot say "packet id not found"
    expect(h("62 03 00 01 10"), V5, PROTOCOL_ERROR)
    expect(h("90 04 00 01 00 03"), V5, PROTOCOL_ERROR)
    expect(h("90 03 00 01 83"), V311, PROTOCOL_ERROR)
    expect(h("90 02 00 01"), V311, PROTOCOL_ERROR)  # SUBACK without a return code
    expect(h("E0 01 05"), V5, PROTOCOL_ERROR)
    expect(h("F0 01 01"), V5, PROTOCOL_ERROR)


def test_connect_protocol_name_and_level():
    ok = encode(Packet(CONNECT, version=V311, client_id="c"))
    b = bytearray(ok)
    b[8] = 6  # MQTT level 6
    assert code_of(bytes(b)) == 0x84
    b = bytearray(ok)
    b[8] = 3  # "MQTT" with level 3 is not 3.1
    assert code_of(bytes(b)) == 0x84
    b = bytearray(ok)
    b[4] = ord("X")  # protocol name "MXTT"
    assert code_of(bytes(b)) == MALFORMED


def test_encoder_refuses_what_the_decoder_would_reject():
    bad = (
        Packet(PUBLISH, topic="t", qos=3),
        Packet(PUBLISH, topic="t", qos=0, dup=True),
        Packet(PUBLISH, topic="t", qos=1, pid=0),
        Packet(PUBLISH, topic="t", qos=1, pid=65536),
        Packet(PUBACK, pid=0),
        Packet(SUBSCRIBE, pid=1, topics=[]),
        Packet(SUBSCRIBE, pid=1, topics=[("a", 3)]),
        Packet(UNSUBSCRIBE, pid=1, topics=[]),
        Packet(CONNECT, version=V311, client_id="c", password=b"p"),
        Packet(CONNECT, version=6, client_id="c"),
        Packet(CONNECT, version=V311, client_id="c", keepalive=65536),
        Packet(CONNECT, version=V311, client_id="a\x00"),
    )
    for p in bad:
        raises(ValueError, encode, p, V311)
    for p, v in (
        (Packet(SUBSCRIBE, pid=1, topics=[("a", 0x40)]), V5),
        (Packet(SUBSCRIBE, pid=1, topics=[("a", 0x30)]), V5),
        (Packet(SUBSCRIBE, pid=1, topics=[("a", 0x04)]), V311),
        (Packet(PUBLISH, topic="t", props={0x11: 1}), V5),
        (Packet(PUBLISH, topic="t", props={0x02: [1, 2]}), V5),
        (Packet(PUBLISH, topic="t", props={0x23: 0}), V5),
        (Packet(PUBLISH, topic="t", props={0x01: 2}), V5),
        (Packet(PUBLISH, topic="t", props={0x02: 1 << 32}), V5),
        (Packet(PUBLISH, topic="t", props={0x0B: [0]}), V5),
        (Packet(CONNECT, version=V5, props={0x21: 65536}), V5),
        (Packet(CONNECT, version=V5, props={0x21: 0}), V5),
        (Packet(CONNECT, version=V5, props={0x99: 1}), V5),
    ):
        raises(ValueError, encode, p, v)


# ------------------------------------------------------ steady path vs general


from tern.message import Message as Msg  # what the session preallocates for parse_publish


def publish_frames():
    out = []
    for v in VERSIONS:
        for q in (0, 1, 2):
            out.append((v, Packet(PUBLISH, topic="s/%d/%d" % (v, q), qos=q, pid=q * 1000, payload=b"v" * q * 70,
                                  retain=q == 1, dup=q == 2)))
        out.append((v, Packet(PUBLISH, topic="\u00e9t\u00e9", payload=b"")))
    for props_ in (
        {0x0B: [5]},
        {0x0B: [1, 2, 3, 268435455], 0x23: 7},
        {0x23: 65535},
        {0x01: 1, 0x02: 5, 0x03: "c", 0x08: "r", 0x09: b"\x01", 0x26: [("a", "b")], 0x0B: [128]},
        {0x01: 0},
    ):
        out.append((V5, Packet(PUBLISH, topic="x", qos=1, pid=2, payload=b"data", props=props_)))
    out.append((V5, Packet(PUBLISH, topic="", payload=b"z", props={0x23: 2})))
    return out


def fast(buf, v, sub_ids):
    m = Msg()
    n = frame_size(buf, 0, len(buf), 1 << 20)
    assert n == len(buf)
    parse_publish(m, buf, 0, n, v)
    if v == V5:
        scan_publish_props(m, buf, sub_ids)
    return m


def test_fast_path_agrees_with_decode():
    for v, pkt in publish_frames():
        buf = encode(pkt, v)
        sub_ids = [0] * 3
        m = fast(buf, v, sub_ids)
        p = decode(buf, v)
        assert p == pkt
        assert str(buf[m.topic_start:m.topic_end], "utf-8") == p.topic
        assert bytes(buf[m.payload_start:m.payload_end]) == bytes(p.payload)
        assert (m.qos, m.pid, bool(m.retain), bool(m.dup)) == (p.qos, p.pid, p.retain, p.dup)
        pr = p.props or {}
        ids = pr.get(0x0B, [])
        assert m.n_sub_ids == len(ids)
        assert sub_ids[:min(3, len(ids))] == ids[:3], (sub_ids, ids)
        assert m.alias == pr.get(0x23, 0)
        assert m.pfi == pr.get(0x01, 0)
        if v != V5:
            assert m.props_start == m.props_end


def test_fast_path_rejects_what_decode_rejects():
    for v, hx in (
        (V5, "30 0E 00 01 74 0A 02 00 00 00 01 02 00 00 00 02"),  # property twice
        (V5, "30 0A 00 01 74 06 23 00 01 23 00 01"),
        (V5, "30 09 00 01 74 05 11 00 00 00 01"),  # not allowed in PUBLISH
        (V5, "30 07 00 01 74 03 23 00 00"),  # topic alias 0
        (V5, "30 06 00 01 74 02 01 02"),  # payload format 2
        (V5, "30 06 00 01 74 02 0B 00"),  # subscription identifier 0
        (V5, "30 03 00 00 00"),  # empty topic, no alias
        (V5, "30 07 00 01 74 03 03 00 01"),  # property runs past its block
        (V5, "30 08 00 01 74 04 03 00 01 FF"),  # bad UTF-8 in content type
        (V5, "30 06 00 01 74 05 02 00"),  # block longer than the packet
        (V311, "30 04 00 02 61 2B"),  # wildcard
        (V311, "36 05 00 01 74 00 01"),
        (V31, "32 05 00 01 74 00 00"),
        (V311, "30 04 00 03 61 2F"),  # topic longer than the packet
        (V311, "30 04 00 02 C0 80"),
    ):
        buf = h(hx)
        want = code_of(buf, v)

        def run():
            fast(buf, v, [0])

        got = raises(MQTTError, run).code
        assert got == want, "%s v%d: fast 0x%02X, decode 0x%02X" % (hx, v, got, want)


def test_sub_ids_beyond_the_preallocated_slots_are_counted():
    pkt = Packet(PUBLISH, topic="t", props={0x0B: [9, 8, 7, 6, 5]})
    buf = encode(pkt, V5)
    ids = [0, 0]
    m = fast(buf, V5, ids)
    assert m.n_sub_ids == 5 and ids == [9, 8]


def test_publish_header_into_matches_encode():
    buf = bytearray(600)
    for v, pkt in publish_frames():
        pb = props.encode(pkt.props, PUBLISH) if pkt.props else None
        payload = pkt.payload
        n = codec.publish_header_into(buf, pkt.topic.encode(), pkt.qos, pkt.retain, pkt.dup, pkt.pid,
                                      len(payload), v, pb)
        got = bytes(buf[:n]) + payload
        assert got == encode(pkt, v), "%r v%d" % (pkt, v)
    raises(ValueError, codec.publish_header_into, buf, b"t", 3, 0, 0, 1, 0, V311)
    raises(ValueError, codec.publish_header_into, buf, b"t", 0, 0, 1, 0, 0, V311)
    raises(ValueError, codec.publish_header_into, buf, b"t", 1, 0, 0, 0, 0, V311)
    raises(ValueError, codec.publish_header_into, buf, b"", 0, 0, 0, 0, 0, V311)


def test_ack_into_matches_encode():
    buf = bytearray(8)
    for v in VERSIONS:
        for t in (PUBACK, PUBREC, PUBREL, PUBCOMP):
            for pid in (1, 258, 65535):
                for rc in ((0, 0x92) if t in (PUBREL, PUBCOMP) else (0, 0x10, 0x80)):
                    n = codec.ack_into(buf, t, pid, rc, v)
                    want = encode(Packet(t, pid=pid, reason=rc if v == V5 else 0), v)
                    assert bytes(buf[:n]) == want, "%d %d %d v%d: %s" % (t, pid, rc, v, hexs(buf[:n]))
    raises(ValueError, codec.ack_into, buf, PUBACK, 0, 0, V311)
    raises(ValueError, codec.ack_into, buf, PUBACK, 65536, 0, V311)
    raises(ValueError, codec.ack_into, buf, SUBACK, 1, 0, V311)
    raises(ValueError, codec.ack_into, buf, PUBACK, 1, 256, V5)
