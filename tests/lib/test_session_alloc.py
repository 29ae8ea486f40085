"""The session's steady path allocates nothing on MicroPython: publishing at
QoS 0, receiving at QoS 0/1/2 with dispatch and acknowledgement, handling the
acknowledgement of our own QoS 1 message, a QoS 1 publish with its PUBACK
(MemoryStore: the record reuses a released buffer), and the keepalive timer.

Frames are fed the way the blocking client feeds them: written into the
session's receive buffer, then feed_n()."""

from check import allocated, MICROPYTHON
from tern.codec import Packet, encode
from tern.session import Session
from tern.wire import CONNACK, PUBLISH, PUBACK, PUBREL, SUBACK
from tern import props as P

sent = [0]


def sink(buf, off, n):
    sent[0] += n


def _session(v):
    s = Session("alloc", v, window=64)
    s.send = sink
    got = [0]

    def handler(m):
        got[0] += m.payload_end - m.payload_start

    s.subscribe("a/#", 2, 0, handler=handler)
    s.connect_packet(0)
    _feed(s, encode(Packet(CONNACK), v))
    _feed(s, encode(Packet(SUBACK, pid=1, reasons=[2]), v))  # the subscription went out on connect
    assert s.pending() == [], s.pending()
    return s, got


def _feed(s, frame):
    n = len(frame)
    s.rx[s.rx_len : s.rx_len + n] = frame
    s.feed_n(n, 1000)


def _check(what, nbytes):
    if MICROPYTHON:
        assert nbytes == 0, "%s allocated %d bytes" % (what, nbytes)
    else:
        assert nbytes < 2048, "%s: %d bytes traced on CPython" % (what, nbytes)


def test_publish_qos0_allocates_nothing():
    for v in (3, 4, 5):
        s, _ = _session(v)
        payload = bytes(200)
        _check("QoS 0 publish, bytes topic, v%d" % v, allocated(lambda: s.publish(b"a/b", payload, 0, False, 1000)))
        _check("QoS 0 publish, str topic, v%d" % v, allocated(lambda: s.publish("a/b", payload, 0, False, 1000)))
        mv = memoryview(payload)  # (v5: the general route, whose payload guard looks at a memoryview's items)
        _check("QoS 0 publish, a memoryview, v%d" % v, allocated(lambda: s.publish(b"a/b", mv, 0, False, 1000)))


def test_receive_and_acknowledge_allocates_nothing():
    for v in (3, 4, 5):
        s, got = _session(v)
        props = {P.SUBSCRIPTION_IDENTIFIER: [1]} if v == 5 else None
        q0 = encode(Packet(PUBLISH, topic="a/b", payload=b"x" * 100, props=props), v)
        q1 = encode(Packet(PUBLISH, topic="a/b", payload=b"y" * 100, qos=1, pid=7, props=props), v)
        q2 = encode(Packet(PUBLISH, topic="a/c", payload=b"z" * 100, qos=2, pid=9, props=props), v)
        rel = encode(Packet(PUBREL, pid=9), v)
        _check("receive QoS 0, v%d" % v, allocated(lambda: _feed(s, q0)))
        _check("receive QoS 1 + PUBACK, v%d" % v, allocated(lambda: _feed(s, q1)))
        # QoS 2: the id lives in the store until PUBREL; a repeat is answered only
        _feed(s, q2)
        _check("repeated QoS 2 + PUBREC, v%d" % v, allocated(lambda: _feed(s, q2)))
        _feed(s, rel)
        assert got[0] == 2 * 100 + 2 * 100 + 100, got  # q0, q1 twice each (warm-up + measured), q2 once
        # and the handler really saw each message
        assert not s.store.in_has(9)


def test_ack_of_our_publish_allocates_nothing():
    s, _ = _session(4)
    pids = [s.publish(b"a/b", b"m", 1, False, 1000) for _ in range(3)]
    acks = [encode(Packet(PUBACK, pid=p), 4) for p in pids]
    _feed(s, acks[0])  # warm-up
    _check("PUBACK handling", allocated(lambda: _feed(s, acks[1])))
    assert s.pending() == [pids[2]], s.pending()


def test_keepalive_timer_allocates_nothing():
    s, _ = _session(4)
    _check("poll", allocated(lambda: s.poll(2000)))
    # an idle interval later it really sends PINGREQ (and that too allocates nothing)
    before = sent[0]
    _check("poll + PINGREQ", allocated(lambda: s.poll(200000)))
    assert sent[0] > before


def test_a_raising_handler_does_not_replay_the_stream():
    s = Session("raise", 4)
    s.send = sink
    seen = []

    def handler(m):
        seen.append(m.pid)
        if m.pid == 2:
            raise ValueError("handler failed")

    s.on_message = handler
    s.connect_packet(0)
    _feed(s, encode(Packet(CONNACK), 4))
    frames = b"".join(encode(Packet(PUBLISH, topic="a", payload=b"x", qos=1, pid=p), 4) for p in (1, 2, 3))
    try:
        _feed(s, frames)
    except ValueError:
        pass
    else:
        raise AssertionError("the handler's error should reach the caller")
    assert s.rx_len == len(frames) - 2 * len(frames) // 3, s.rx_len  # message 3 still waits
    _feed(s, b"")
    assert seen == [1, 2, 3], seen  # 1 and 2 not handled again


def test_qos1_publish_and_its_puback_allocate_nothing():
    # With the default MemoryStore the record of a QoS 1 message takes the
    # buffer a released record of its size left (the store keeps a few), so a
    # steady stream of same-size messages allocates nothing once warmed up.
    for v in (4, 5):
        s, _ = _session(v)
        payload = b"x" * 64
        ack = [encode(Packet(PUBACK, pid=p), v) for p in range(1, 40)]

        def one():
            _feed(s, ack[s.publish(b"a/q1", payload, 1, False, 1000) - 1])

        for _ in range(4):
            one()
        _check("QoS 1 publish + PUBACK, MemoryStore, v%d" % v, allocated(one))
        assert s.pending() == [] and s.store.count() == 0 and s._last_pid == 7, (s.pending(), s._last_pid)


def test_receive_by_inbound_topic_alias_allocates_nothing():
    # MQTT 5: the first message names the topic and its alias; the next ones carry the alias
    # alone. Resolving it (tern.v5, loaded on the first alias) allocates nothing per message.
    s = Session("alloc", 5, window=64, topic_alias_max=4)
    s.send = sink
    got = [0, 0]  # messages handled, topic length of the last

    def handler(m):
        got[0] += 1
        got[1] = m.topic_end - m.topic_start

    s.subscribe("a/#", 1, 0, handler=handler)
    s.connect_packet(0)
    _feed(s, encode(Packet(CONNACK), 5))
    _feed(s, encode(Packet(SUBACK, pid=1, reasons=[1]), 5))
    props = {P.SUBSCRIPTION_IDENTIFIER: [1], P.TOPIC_ALIAS: 2}
    _feed(s, encode(Packet(PUBLISH, topic="a/b", payload=b"x", props=props), 5))
    q0 = encode(Packet(PUBLISH, topic="", payload=b"y" * 50, props=props), 5)
    q1 = encode(Packet(PUBLISH, topic="", payload=b"z" * 50, qos=1, pid=3, props=props), 5)
    _check("receive QoS 0 by topic alias", allocated(lambda: _feed(s, q0)))
    _check("receive QoS 1 by topic alias + PUBACK", allocated(lambda: _feed(s, q1)))
    assert got == [5, 3], got  # each one (warm-up calls too) dispatched, with the topic its alias stands for
