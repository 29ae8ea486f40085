"""The connection's states (MQTT 3.1.1 section 3.2 / 5.0 section 3.2, client side): a CONNECT is
answered by one CONNACK and nothing else comes first [MQTT-3.2.0-1]; a refusal ends the
connection; a second CONNACK is a protocol error; every state ends on a lost connection. And what
a connected client keeps: the code that reads CONNACK and AUTH (tern.handshake) is released once
they are read, and loaded again for the next connect; so is the send ring's cold half (tern.replay:
the CONNACK's replay, subscribing). Runs on CPython and MicroPython."""

import sys

from check import raises
from tern.codec import Packet, encode
from tern.session import CONNECTED, DISCONNECTED, EV_CONNACK, Session
from tern.wire import CONNACK, PUBACK, PUBLISH, MQTTError


def session(v):
    s = Session("states", v, True)
    out, ev = [], []
    s.send = lambda b, o, n: out.append(bytes(b[o : o + n]))
    s.on_event = lambda k, a, b: ev.append((k, a, b))
    return s, out, ev


def feed(s, p):
    b = encode(p, s.version)
    s.rx[s.rx_len : s.rx_len + len(b)] = b
    s.feed_n(len(b), 0)


def test_connack_connects_and_the_handshake_code_is_not_kept():
    for v in (4, 5):
        s, out, ev = session(v)
        assert s.state == DISCONNECTED
        s.connect_packet(0)
        assert s.state != DISCONNECTED and s.state != CONNECTED  # CONNECTING
        assert out and out[0][0] == 0x10  # the CONNECT
        feed(s, Packet(CONNACK))
        assert s.state == CONNECTED and ev[-1][0] == EV_CONNACK, (s.state, ev)
        assert "tern.handshake" not in sys.modules, "a connected client keeps tern.handshake"
        s.connection_lost()
        assert s.state == DISCONNECTED
        s.connect_packet(0)  # loaded again for the next connect
        feed(s, Packet(CONNACK, session_present=False))
        assert s.state == CONNECTED and "tern.handshake" not in sys.modules


def test_the_rings_cold_half_is_not_kept():
    # tern.replay replays the ring at a CONNACK (here: a QoS 1 message stored offline, resent) and
    # queues a SUBSCRIBE; each time it is let go after.
    for v in (4, 5):
        s, out, ev = session(v)
        pid = s.publish("t", b"offline", 1, False, 0)
        s.subscribe("a/#", 1, 0)
        assert "tern.replay" not in sys.modules, "subscribe() keeps tern.replay"
        s.connect_packet(0)
        feed(s, Packet(CONNACK))
        assert "tern.replay" not in sys.modules, "a connected client keeps tern.replay"
        b = b"".join(out[1:])
        assert b[0] == 0x32, out  # the message, first sent (no DUP) ...
        k = b[1] + 2
        assert b[k] == 0x82 and len(b) == k + b[k + 1] + 2, out  # ... then the SUBSCRIBE
        feed(s, Packet(PUBACK, pid=pid))
        assert s.pending() == [b[k + 2] << 8 | b[k + 3]], s.pending()
        s.unsubscribe("a/#", 0)
        assert "tern.replay" not in sys.modules


def test_an_app_that_connects_again_from_on_connect():
    # on_connect (EV_CONNACK) runs while the CONNACK is still being read: the link lost there and
    # the app dialling again from its callback reads a second CONNACK with the same tern.handshake,
    # which that read releases; the outer read, ending after it, releases it again (on MicroPython
    # `del` of a module attribute already gone said KeyError, which reached the app).
    for v in (4, 5):
        s, out, ev = session(v)
        again = []

        def on_event(k, a, b):
            ev.append((k, a, b))
            if k == EV_CONNACK and not again:
                again.append(1)
                s.connection_lost()
                s.connect_packet(0)
                feed(s, Packet(CONNACK))

        s.on_event = on_event
        s.connect_packet(0)
        feed(s, Packet(CONNACK))
        assert s.state == CONNECTED and [e[0] for e in ev].count(EV_CONNACK) == 2, ev
        assert "tern.handshake" not in sys.modules and "tern.replay" not in sys.modules
        s.connection_lost()
        s.connect_packet(0)  # and the next connect loads it again
        feed(s, Packet(CONNACK))
        assert s.state == CONNECTED


def test_mqtt5_property_code_is_kept_only_while_property_blocks_come():
    # The CONNACK's properties are read with tern.props, released with the handshake; a message
    # without properties is read without it, one with properties loads it, and the rules that
    # need no property still hold (an empty topic needs a Topic Alias).
    s, out, ev = session(5)
    got = []
    s.on_message = lambda m: got.append((m.topic, m.payload, m.properties))
    s.connect_packet(0)
    feed(s, Packet(CONNACK, props={0x22: 10, 0x21: 20}))  # Topic Alias Maximum, Receive Maximum
    assert s.state == CONNECTED and s.server.get(0x21) == 20
    assert "tern.props" not in sys.modules, "a connected MQTT 5 client keeps tern.props"
    feed(s, Packet(PUBLISH, topic="a/b", payload=b"plain", qos=1, pid=7))
    assert got == [("a/b", b"plain", None)] and out[-1] == b"\x40\x02\x00\x07", (got, out)
    assert "tern.props" not in sys.modules
    feed(s, Packet(PUBLISH, topic="a/c", payload=b"x", qos=0, props={0x26: [("k", "v")], 0x03: "text/plain"}))
    assert got[-1] == ("a/c", b"x", {0x26: [("k", "v")], 0x03: "text/plain"}), got
    b = b"\x30\x04\x00\x00\x00x"  # an empty topic, no properties: no Topic Alias
    s.rx[s.rx_len : s.rx_len + len(b)] = b
    e = raises(MQTTError, s.feed_n, len(b), 0)
    assert e.code == 0x82 and "topic alias" in e.args[0], e
    assert len(got) == 2


def test_a_refusal_ends_the_attempt():
    for v, code in ((4, 5), (5, 0x87)):
        s, out, ev = session(v)
        s.connect_packet(0)
        feed(s, Packet(CONNACK, reason=code))
        assert s.state == DISCONNECTED and ev[-1][0] == EV_CONNACK and ev[-1][2].reason == code, ev


def test_nothing_but_connack_before_connack():
    for v in (4, 5):
        for p in (Packet(PUBLISH, topic="a", payload=b"x", qos=0), Packet(PUBACK, pid=1)):
            s, out, ev = session(v)
            s.connect_packet(0)
            e = raises(MQTTError, feed, s, p)
            assert e.code == 0x82 and "before CONNACK" in e.args[0], e
            assert s.state == DISCONNECTED and not ev


def test_a_second_connack_is_a_protocol_error():
    for v in (4, 5):
        s, out, ev = session(v)
        s.connect_packet(0)
        feed(s, Packet(CONNACK))
        e = raises(MQTTError, feed, s, Packet(CONNACK))
        assert e.code == 0x82 and "unexpected CONNACK" in e.args[0], e
        assert s.state == DISCONNECTED
