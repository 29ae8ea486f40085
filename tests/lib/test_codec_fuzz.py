"""Seeded fuzzing of both decoders on both runtimes.

Random bytes and mutated valid packets (bit flips, truncation, changed length
bytes, spliced bytes) go to decode() and to frame_size + parse_publish +
scan_publish_props in every protocol version. Only MQTTError may come out;
anything else fails with the input in hex. The two PUBLISH decoders must agree
(both accept with the same fields, or both reject with the same reason code),
and no decode of a small input may allocate more than a small bound: a lying
length field must never turn into a large allocation.
"""

from check import MICROPYTHON, Rng
from tern.codec import Packet, encode, decode, frame_size, parse_publish, scan_publish_props
from tern.wire import (
    MQTTError, CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, SUBACK,
    UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH, V31, V311, V5,
)

MP_HEAPSIZE = "512k"
VERSIONS = (V31, V311, V5)
MAX_SIZE = 4096
ALLOC_BOUND = 4096  # bytes one decode of a <= 64-byte input may take at its peak


def hexs(b):
    return " ".join("%02X" % x for x in b)


from tern.message import Message as Msg  # what the session preallocates for parse_publish


def seeds(v):
    P = Packet
    u = [("k", "v")]
    out = [
        P(CONNECT, version=v, client_id="c1", will_topic="w", will_payload=b"x", will_qos=1,
          username="u", password=b"p"),
        P(CONNACK, reason=0),
        P(PUBLISH, topic="a/b", payload=b"hello", qos=0),
        P(PUBLISH, topic="t/\u00e9", payload=b"\x00\x01", qos=1, pid=7, retain=True),
        P(PUBLISH, topic="q", payload=b"", qos=2, pid=65535, dup=True),
        P(PUBACK, pid=1), P(PUBREC, pid=2), P(PUBREL, pid=3), P(PUBCOMP, pid=4),
        P(SUBSCRIBE, pid=5, topics=[("a/+", 1), ("#", 2)]),
        P(SUBACK, pid=5, reasons=[1, 0x80]),
        P(UNSUBSCRIBE, pid=6, topics=["a/+"]),
        P(UNSUBACK, pid=6, reasons=[0] if v == V5 else ()),
        P(PINGREQ), P(PINGRESP), P(DISCONNECT),
    ]
    if v == V5:
        out += [
            P(CONNECT, version=v, client_id="", props={0x11: 60, 0x21: 5, 0x27: 4096, 0x26: u},
              will_topic="w", will_props={0x18: 1, 0x01: 1}),
            P(CONNACK, props={0x21: 10, 0x22: 5, 0x27: 1024, 0x12: "id", 0x1F: "ok"}),
            P(PUBLISH, topic="t", qos=1, pid=9, payload=b"pp",
              props={0x02: 60, 0x0B: [1, 300], 0x23: 4, 0x26: u, 0x01: 1, 0x03: "c", 0x09: b"\x00"}),
            P(PUBLISH, topic="", payload=b"z", props={0x23: 2}),
            P(PUBACK, pid=1, reason=0x10, props={0x1F: "r"}),
            P(PUBREL, pid=1, reason=0x92),
            P(SUBSCRIBE, pid=5, topics=[("a", 0x2D)], props={0x0B: 12}),
            P(SUBACK, pid=5, reasons=[0x87], props={0x26: u}),
            P(DISCONNECT, reason=0x8E, props={0x1F: "bye"}),
            P(AUTH, reason=0x18, props={0x15: "m", 0x16: b"d"}),
        ]
    return [encode(p, v) for p in out]


def mutate(rng, b):
    b = bytearray(b)
    if len(b) < 2:
        return bytes(b) + bytes(rng.bytes(rng.below(3)))
    k = rng.below(6)
    if k == 0:  # bit flips
        for _ in range(1 + rng.below(3)):
            i = rng.below(len(b))
            b[i] ^= 1 << rng.below(8)
    elif k == 1:  # truncation
        b = b[:rng.below(len(b))]
    elif k == 2:  # remaining length byte(s) changed
        b[1] = rng.below(256)
        if b[1] & 0x80 and len(b) > 2:
            b[2] = rng.below(256)
    elif k == 3:  # a byte replaced anywhere
        b[rng.below(len(b))] = rng.below(256)
    elif k == 4:  # bytes inserted, remaining length kept consistent when it is one byte
        i = 2 + rng.below(max(1, len(b) - 2))
        extra = rng.bytes(1 + rng.below(4))
        b = b[:i] + extra + b[i:]
        if b[1] + len(extra) < 128:
            b[1] += len(extra)
    else:  # a byte removed, length adjusted
        if len(b) > 2:
            i = 2 + rng.below(len(b) - 2)
            b = b[:i] + b[i + 1:]
            if 0 < b[1] < 128:
                b[1] -= 1
    return bytes(b)


def outcome_general(buf, v):
    try:
        p = decode(buf, v, MAX_SIZE)
    except MQTTError as e:
        return ("error", e.code)
    except Exception as e:
        raise AssertionError("decode v%d raised %r on %s" % (v, e, hexs(buf)))
    return ("ok", p)


def outcome_fast(buf, v, m, ids):
    try:
        n = frame_size(buf, 0, len(buf), MAX_SIZE)
        if n < 0 or n > len(buf):
            return ("incomplete",)
        if buf[0] >> 4 != PUBLISH:
            return ("other",)
        parse_publish(m, buf, 0, n, v)
        if v == V5:
            scan_publish_props(m, buf, ids)
        return ("ok", n)
    except MQTTError as e:
        return ("error", e.code)
    except Exception as e:
        raise AssertionError("fast path v%d raised %r on %s" % (v, e, hexs(buf)))


def agree(buf, v, m, ids):
    g = outcome_general(buf, v)
    f = outcome_fast(buf, v, m, ids)
    if f[0] in ("incomplete", "other"):
        return g
    if f[1:] and f[0] == "ok" and f[1] != len(buf):
        return g  # bytes after the frame: decode() rightly refuses, the stream reader would go on
    if g[0] == "error" or f[0] == "error":
        assert g[0] == f[0] == "error" and g[1] == f[1], "v%d %s: decode %r, fast path %r" % (
            v, hexs(buf), g, f)
        return g
    p = g[1]
    assert (m.qos, m.pid, bool(m.retain), bool(m.dup)) == (p.qos, p.pid, p.retain, p.dup), hexs(buf)
    assert bytes(buf[m.topic_start:m.topic_end]) == p.topic.encode(), hexs(buf)
    assert bytes(buf[m.payload_start:m.payload_end]) == bytes(p.payload), hexs(buf)
    if v == V5:
        pr = p.props or {}
        assert m.alias == pr.get(0x23, 0) and m.n_sub_ids == len(pr.get(0x0B, ())), hexs(buf)
    return g


def cases(seed, n):
    rng = Rng(seed)
    corpus = {v: seeds(v) for v in VERSIONS}
    for i in range(n):
        v = VERSIONS[i % 3]
        if rng.below(4) == 0:
            b = rng.bytes(rng.below(65))
            if b and rng.below(2):
                b[0] = (1 + rng.below(15)) << 4 | rng.below(16)  # a plausible first byte
            yield v, bytes(b)
        else:
            src = corpus[v][rng.below(len(corpus[v]))]
            b = mutate(rng, src)
            if rng.below(4) == 0:
                b = mutate(rng, b)
            yield v, b


def test_only_mqtt_error_escapes_and_both_paths_agree():
    m = Msg()
    ids = [0, 0, 0]
    stats = {"ok": 0, "error": 0}
    for v, b in cases(20240611, 20000):
        g = agree(b, v, m, ids)
        stats[g[0]] += 1
        # the other versions see the same bytes too
        outcome_general(b, V5 if v != V5 else V311)
    # a fuzzer that never gets past the checks (or never trips them) proves little
    assert stats["ok"] > 1000 and stats["error"] > 10000, stats


def test_unmutated_seeds_decode():
    for v in VERSIONS:
        for b in seeds(v):
            assert outcome_general(b, v)[0] == "ok", hexs(b)


def test_allocation_bounded_by_input():
    rng = Rng(77)
    inputs = []
    corpus = seeds(V5) + seeds(V311)
    for i in range(400):
        if i % 2:
            b = bytearray(rng.bytes(64))
            b[0] = (1 + rng.below(15)) << 4 | (2 if rng.below(2) else 0)
        else:
            b = bytearray(corpus[rng.below(len(corpus))][:64])
            b.extend(rng.bytes(64 - len(b)))
        # a length field that lies: up to the whole size limit, or far beyond it
        b[1] = 0xFF
        b[2] = 0xFF
        b[3] = rng.below(128)
        if rng.below(3) == 0:
            b[1] = rng.below(128)
        inputs.append(bytes(b))
    worst = 0
    if MICROPYTHON:
        import gc

        for i, b in enumerate(inputs):
            v = VERSIONS[i % 3]
            gc.collect()
            gc.disable()
            a = gc.mem_alloc()
            try:
                decode(b, v, 1 << 28)
            except MQTTError:
                pass
            used = gc.mem_alloc() - a
            gc.enable()
            worst = max(worst, used)
            assert used < ALLOC_BOUND, "decode v%d of %s allocated %d bytes" % (v, hexs(b), used)
    else:
        import tracemalloc

        tracemalloc.start()
        try:
            for i, b in enumerate(inputs):
                v = VERSIONS[i % 3]
                tracemalloc.reset_peak()
                base = tracemalloc.get_traced_memory()[0]
                try:
                    decode(b, v, 1 << 28)
                except MQTTError:
                    pass
                used = tracemalloc.get_traced_memory()[1] - base
                worst = max(worst, used)
                assert used < ALLOC_BOUND, "decode v%d of %s: peak %d bytes" % (v, hexs(b), used)
        finally:
            tracemalloc.stop()
    assert worst > 0  # the measurement is live
