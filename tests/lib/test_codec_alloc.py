"""The steady path allocates nothing.

MicroPython: every call below must leave gc.mem_alloc() where it was (the
collector is off while it runs, so any allocation, however small, shows).
CPython allocates for its own reasons (ints above 256, frames), so there the
tracemalloc peak must stay under a small bound that does not grow with the
payload: the same call on a 10-byte and a 10000-byte payload costs the same.
"""

from check import MICROPYTHON, allocated
from tern import props, wire
from tern.codec import Packet, encode, frame_size, parse_publish, scan_publish_props, publish_header_into, ack_into
from tern.wire import V31, V311, V5, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP

MP_HEAPSIZE = "256k"
CPY_BOUND = 600  # bytes: a handful of int objects at most, never a copy of the data


from tern.message import Message as Msg  # what the session preallocates for parse_publish


def check(what, f, *args):
    n = allocated(f, *args)
    if MICROPYTHON:
        assert n == 0, "%s allocated %d bytes" % (what, n)
    else:
        assert n < CPY_BOUND, "%s: tracemalloc peak %d bytes" % (what, n)
    return n


def frame(v, payload_len, qos=1, with_props=True):
    pr = None
    if v == V5 and with_props:
        pr = {0x0B: [300, 7], 0x23: 12, 0x01: 1, 0x02: 3600, 0x26: [("k", "v")], 0x03: "text/plain"}
    return encode(Packet(PUBLISH, topic="sensors/\u00e9/temp", qos=qos, pid=4097 if qos else 0,
                         payload=b"p" * payload_len, props=pr), v)


def test_publish_header_into():
    buf = bytearray(64)
    topic = b"sensors/board-7/temperature"
    pb = props.encode({0x02: 60, 0x23: 5}, PUBLISH)
    for v in (V31, V311, V5):
        for q in (0, 1, 2):
            for pl in (10, 10000):
                check("publish_header_into v%d q%d" % (v, q), publish_header_into,
                      buf, topic, q, 1, 0, 4097 if q else 0, pl, v)
        check("publish_header_into v5 props", publish_header_into, buf, topic, 1, 0, 1, 300, 10000, V5, pb)


def test_ack_into():
    buf = bytearray(8)
    for v in (V311, V5):
        for t in (PUBACK, PUBREC, PUBREL, PUBCOMP):
            check("ack_into %d v%d" % (t, v), ack_into, buf, t, 4097, 0, v)
            check("ack_into %d v%d reason" % (t, v), ack_into, buf, t, 65535, 0x92 if t >= PUBREL else 0x80, v)


def test_frame_size():
    for v in (V311, V5):
        for pl in (10, 10000):
            b = frame(v, pl)
            check("frame_size", frame_size, b, 0, len(b), 1 << 20)
    big = bytes((0x30, 0xFF, 0xFF, 0x7F))
    check("frame_size incomplete", frame_size, big[:3], 0, 3, 1 << 28)


def test_parse_publish_and_scan_props():
    m = Msg()
    ids = [0, 0, 0, 0]
    for v in (V31, V311, V5):
        for q in (0, 1, 2):
            peaks = []
            for pl in (10, 10000):
                b = bytearray(frame(v, pl, q))
                mv = memoryview(b)
                n = len(b)
                peaks.append(check("parse_publish v%d q%d %d" % (v, q, pl), parse_publish, m, mv, 0, n, v))
                assert m.payload_end - m.payload_start == pl
                if v == V5:
                    peaks.append(check("scan_publish_props", scan_publish_props, m, mv, ids))
                    assert m.alias == 12 and m.n_sub_ids == 2 and ids[0] == 300 and ids[1] == 7 and m.pfi == 1
            if not MICROPYTHON:
                half = len(peaks) // 2
                # the larger payload may not cost more than the small one (allow a few ints' noise)
                for a, b_ in zip(peaks[:half], peaks[half:]):
                    assert b_ <= a + 128, (v, q, peaks)


def test_check_utf8():
    for s in ("plain/ascii/topic", "caf\u00e9/\u20ac/\U0001d11e" * 20):
        b = s.encode()
        check("check_utf8", wire.check_utf8, b, 0, len(b))
        check("check_utf8 view", wire.check_utf8, memoryview(b), 0, len(b))


def test_the_measurement_sees_an_allocation():
    # The checks above are only as good as `allocated`: a path that copies
    # the payload must register, on both runtimes.
    b = frame(V311, 10000)

    def copies(buf):
        return bytes(buf[10:])

    n = allocated(copies, b)
    assert n >= 9000, n
    if MICROPYTHON:
        assert allocated(lambda: [0]) > 0
    m = Msg()

    def parse_and_slice_topic(buf):
        parse_publish(m, buf, 0, len(buf), V311)
        return buf[m.topic_start:m.topic_end]

    assert allocated(parse_and_slice_topic, b) > 0
