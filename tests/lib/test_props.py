"""MQTT 5 properties: the library's table against the specification's table
(section 2.2.2.2, restated here independently), the value-range rules, and the
encoding of each wire type. Runs under CPython and MicroPython."""

from check import raises
from tern import props
from tern.codec import Packet, encode, decode
from tern.wire import MQTTError, Reader, V5, PUBLISH, CONNECT, CONNACK, SUBSCRIBE

# Packet names as the specification's table lists them; WILL is the will
# properties inside CONNECT.
NAMES = {
    "WILL": 0, "CONNECT": 1, "CONNACK": 2, "PUBLISH": 3, "PUBACK": 4, "PUBREC": 5, "PUBREL": 6,
    "PUBCOMP": 7, "SUBSCRIBE": 8, "SUBACK": 9, "UNSUBSCRIBE": 10, "UNSUBACK": 11, "PINGREQ": 12,
    "PINGRESP": 13, "DISCONNECT": 14, "AUTH": 15,
}

# identifier: (name, data type, where it may appear) -- written out from the
# specification's property table, not generated from the library.
SPEC = {
    0x01: ("Payload Format Indicator", "byte", "PUBLISH WILL"),
    0x02: ("Message Expiry Interval", "u32", "PUBLISH WILL"),
    0x03: ("Content Type", "utf8", "PUBLISH WILL"),
    0x08: ("Response Topic", "utf8", "PUBLISH WILL"),
    0x09: ("Correlation Data", "binary", "PUBLISH WILL"),
    0x0B: ("Subscription Identifier", "varint", "PUBLISH SUBSCRIBE"),
    0x11: ("Session Expiry Interval", "u32", "CONNECT CONNACK DISCONNECT"),
    0x12: ("Assigned Client Identifier", "utf8", "CONNACK"),
    0x13: ("Server Keep Alive", "u16", "CONNACK"),
    0x15: ("Authentication Method", "utf8", "CONNECT CONNACK AUTH"),
    0x16: ("Authentication Data", "binary", "CONNECT CONNACK AUTH"),
    0x17: ("Request Problem Information", "byte", "CONNECT"),
    0x18: ("Will Delay Interval", "u32", "WILL"),
    0x19: ("Request Response Information", "byte", "CONNECT"),
    0x1A: ("Response Information", "utf8", "CONNACK"),
    0x1C: ("Server Reference", "utf8", "CONNACK DISCONNECT"),
    0x1F: ("Reason String", "utf8",
           "CONNACK PUBACK PUBREC PUBREL PUBCOMP SUBACK UNSUBACK DISCONNECT AUTH"),
    0x21: ("Receive Maximum", "u16", "CONNECT CONNACK"),
    0x22: ("Topic Alias Maximum", "u16", "CONNECT CONNACK"),
    0x23: ("Topic Alias", "u16", "PUBLISH"),
    0x24: ("Maximum QoS", "byte", "CONNACK"),
    0x25: ("Retain Available", "byte", "CONNACK"),
    0x26: ("User Property", "pair",
           "CONNECT CONNACK PUBLISH WILL PUBACK PUBREC PUBREL PUBCOMP SUBSCRIBE SUBACK UNSUBSCRIBE "
           "UNSUBACK DISCONNECT AUTH"),
    0x27: ("Maximum Packet Size", "u32", "CONNECT CONNACK"),
    0x28: ("Wildcard Subscription Available", "byte", "CONNACK"),
    0x29: ("Subscription Identifier Available", "byte", "CONNACK"),
    0x2A: ("Shared Subscription Available", "byte", "CONNACK"),
}

# The library's type codes under the names used above.
TYPES = {"byte": props.TYPE_BYTE, "u16": props.TYPE_U16, "u32": props.TYPE_U32, "varint": props.TYPE_VARINT,
         "utf8": props.TYPE_UTF8, "binary": props.TYPE_BINARY, "pair": props.TYPE_PAIR}

# A value of each type and the size of its encoding (after the identifier).
SAMPLES = {"byte": (1, 1), "u16": (300, 2), "u32": (70000, 4), "varint": (200, 2),
           "utf8": ("ab", 4), "binary": (b"\x00\xff\x01", 5), "pair": (("k", "vv"), 7)}


def test_table_matches_the_specification():
    assert len(SPEC) == 27
    for pid in range(0, 0x2B):
        spec = SPEC.get(pid)
        want_type = TYPES[spec[1]] if spec else 0
        assert props.prop_type(pid) == want_type, "0x%02X type %r" % (pid, props.prop_type(pid))
        where = [NAMES[w] for w in spec[2].split()] if spec else []
        for ptype in range(16):
            got = props.allowed(pid, ptype)
            assert got == (ptype in where), "0x%02X in packet %d: %r" % (pid, ptype, got)
    for pid in (0x2B, 0x7F, 0x80, 0x100, 16384):
        assert props.prop_type(pid) == 0 and not props.allowed(pid, PUBLISH)


def test_each_type_encodes_to_its_size_and_back():
    for pid in SPEC:
        name, typ, where = SPEC[pid]
        value, size = SAMPLES[typ]
        ptype = NAMES[where.split()[0]]
        if pid == 0x0B and ptype == PUBLISH:
            value_in, value_out = [value], [value]
        elif typ == "pair":
            value_in, value_out = [value], [value]
        else:
            value_in = value_out = value
        b = props.encode({pid: value_in}, ptype)
        assert b[0] == 1 + size and b[1] == pid and len(b) == 2 + size, "%s: %r" % (name, b)
        back = props.decode(Reader(b, 0, len(b)), ptype)
        assert back == {pid: value_out}, "%s: %r" % (name, back)


def test_where_is_enforced_both_ways():
    # every property in every packet type it may not appear in
    for pid in SPEC:
        name, typ, where = SPEC[pid]
        value, size = SAMPLES[typ]
        ok = [NAMES[w] for w in where.split()]
        for ptype in range(16):
            if ptype in ok:
                continue
            raises(ValueError, props.encode, {pid: value}, ptype)
            blk = props.encode({pid: [value] if typ == "pair" or pid == 0x0B else value}, ok[0])
            e = raises(MQTTError, props.decode, Reader(blk, 0, len(blk)), ptype)
            assert e.code == 0x81, "%s in %d: 0x%02X" % (name, ptype, e.code)


def test_value_ranges_are_protocol_errors():
    cases = (
        (CONNECT, 0x21, "00 00"),  # receive maximum 0
        (CONNACK, 0x21, "00 00"),
        (PUBLISH, 0x23, "00 00"),  # topic alias 0
        (PUBLISH, 0x01, "02"),  # payload format indicator 2
        (0, 0x01, "FF"),
        (CONNECT, 0x27, "00 00 00 00"),  # maximum packet size 0
        (PUBLISH, 0x0B, "00"),  # subscription identifier 0
        (SUBSCRIBE, 0x0B, "00"),
        (CONNACK, 0x24, "02"),  # maximum QoS 2
        (CONNACK, 0x25, "02"),
        (CONNACK, 0x28, "02"),
        (CONNACK, 0x29, "05"),
        (CONNACK, 0x2A, "02"),
        (CONNECT, 0x17, "02"),
        (CONNECT, 0x19, "02"),
    )
    for ptype, pid, val in cases:
        v = bytes(int(x, 16) for x in val.split())
        blk = bytes((1 + len(v), pid)) + v
        e = raises(MQTTError, props.decode, Reader(blk, 0, len(blk)), ptype)
        assert e.code == 0x82, "0x%02X=%s: 0x%02X" % (pid, val, e.code)
        # the encoder refuses the same value
        n = 0
        for x in v:
            n = n << 8 | x
        raises(ValueError, props.encode, {pid: [n] if (pid == 0x0B and ptype == PUBLISH) else n}, ptype)
    # the edges that are fine
    for ptype, pid, n in ((CONNECT, 0x21, 1), (CONNECT, 0x21, 65535), (CONNACK, 0x22, 0), (CONNACK, 0x13, 0),
                          (PUBLISH, 0x23, 65535), (CONNACK, 0x24, 1), (CONNACK, 0x24, 0),
                          (CONNECT, 0x27, 1), (CONNECT, 0x11, 0xFFFFFFFF), (SUBSCRIBE, 0x0B, 268435455)):
        blk = props.encode({pid: n}, ptype)
        assert props.decode(Reader(blk, 0, len(blk)), ptype) == {pid: n}


def test_encoder_range_checks():
    for pid, bad in ((0x01, 256), (0x21, 65536), (0x02, 1 << 32), (0x02, -1), (0x0B, 268435456),
                     (0x13, "5"), (0x03, 5), (0x03, b"bytes"), (0x09, "text"), (0x26, ("only-name",)),
                     (0x26, [("k", 1)])):
        ptype = CONNACK if pid == 0x13 else (PUBLISH if pid != 0x21 else CONNECT)
        e = raises(Exception, props.encode, {pid: bad}, ptype)
        assert isinstance(e, (ValueError, TypeError)), repr(e)
    raises(ValueError, props.encode, {0x03: "a\x00"}, PUBLISH)
    raises(ValueError, props.encode, {0x09: b"x" * 65536}, PUBLISH)
    raises(ValueError, props.encode, {0x02: [1, 2]}, PUBLISH)  # not repeatable
    raises(ValueError, props.encode, {0x0B: [1, 2]}, SUBSCRIBE)  # one per SUBSCRIBE


def test_encoding_is_ordered_and_keeps_user_property_order():
    a = props.encode({0x26: [("z", "1"), ("a", "2"), ("z", "3")], 0x02: 5, 0x01: 1}, PUBLISH)
    b = props.encode({0x01: 1, 0x02: 5, 0x26: [("z", "1"), ("a", "2"), ("z", "3")]}, PUBLISH)
    assert a == b
    assert a[1] == 0x01 and a[3] == 0x02 and a[8] == 0x26
    back = props.decode(Reader(a, 0, len(a)), PUBLISH)
    assert back[0x26] == [("z", "1"), ("a", "2"), ("z", "3")]


def test_block_bounds():
    # a property may not run past its block, even if the packet goes on
    blk = bytes((3, 0x21, 0, 5, 0x21))  # a 3-byte block, then a byte that is not in it
    r = Reader(blk, 0, len(blk))
    assert props.decode(r, CONNECT) == {0x21: 5} and r.pos == 4 and r.end == len(blk)
    blk = bytes((2, 0x21, 0, 5))  # the value runs past the block
    e = raises(MQTTError, props.decode, Reader(blk, 0, len(blk)), CONNECT)
    assert e.code == 0x81
    blk = bytes((9, 0x21, 0, 5))  # block longer than the packet
    e = raises(MQTTError, props.decode, Reader(blk, 0, len(blk)), CONNECT)
    assert e.code == 0x81
    assert props.decode(Reader(b"\x00", 0, 1), CONNECT) is None
    assert props.encode(None, CONNECT) == b"\x00" and props.encode({}, CONNECT) == b"\x00"


def test_in_packets():
    p = Packet(CONNACK, props={0x24: 0, 0x25: 1, 0x21: 3})
    assert decode(encode(p, V5), V5) == p
