"""What a client must not send and what it must not accept (MQTT 3.1.1 and 5.0, client side),
checked on the session without a socket: topic names as bytes, the will topic, topic aliases against
the server's maximum, packets against its Maximum Packet Size, properties only a server sends, reason
codes, SUBACKs that do not answer their SUBSCRIBE, AUTH without the method. Each was once sent or
accepted (a review against the specifications); Mosquitto then dropped the connection, and a stored
QoS 1 message with a bad topic went again after every reconnect, holding back the ones behind it.
Runs on CPython and MicroPython."""

from check import raises
from tern.codec import Packet, decode, encode
from tern.session import Session
from tern.wire import AUTH, CONNACK, DISCONNECT, PUBLISH, SUBACK, SUBSCRIBE, MQTTError


def online(v=5, caps=None, **kw):
    """A session past its CONNACK (with these MQTT 5 properties); its output as a list of packets."""
    s = Session("rules", v, True, **kw)
    out = []
    s.send = lambda b, o, n: out.append(bytes(b[o : o + n]))
    s.connect_packet(0)
    feed(s, Packet(CONNACK, props=caps) if v == 5 else Packet(CONNACK))
    del out[:]
    return s, out


def feed(s, p):
    b = encode(p, s.version)
    s.rx[s.rx_len : s.rx_len + len(b)] = b
    s.feed_n(len(b), 0)


def violation(s, out, p, code):
    """The server's packet p breaks the protocol: MQTTError with code, and under MQTT 5 a DISCONNECT
    with that reason code went out first."""
    e = raises(MQTTError, feed, s, p)
    assert e.code == code, e
    if s.version == 5:
        d = decode(out[-1], 5)
        assert (d.type, d.reason) == (DISCONNECT, code), (d.type, d.reason)
    assert s.state == 0, s.state  # DISCONNECTED


def test_topic_names_given_as_bytes_are_checked_as_strings_are():
    # [MQTT-4.7.1-1] no wildcard in a topic name, [MQTT-3.3.2-1] UTF-8; MQTT 5: empty only with an alias
    for v in (4, 5):
        s, out = online(v)
        for topic in (b"a/#", b"a/+/b", bytearray(b"x/#"), b"\xff\xfe", b"a\x00b", "a/#", ""):
            for qos in (0, 1, 2):
                e = raises(ValueError, s.publish, topic, b"x", qos, False, 0)
                assert "topic name" in str(e), e
        assert out == [] and s.pending() == []
        assert s.publish(b"ok/t", b"x", 1, False, 0) == 1 and len(out) == 1


def test_will_topic_is_checked_when_the_session_is_made():
    for v in (3, 4, 5):
        for wt in ("dead/#", b"dead/+", "", b"\xc3"):
            e = raises(ValueError, Session, "w", v, True, will_topic=wt, will_payload=b"gone")
            assert "will topic" in str(e) or "topic name" in str(e), e
        Session("w", v, True, will_topic=b"dead/dev", will_payload=b"gone")


def test_a_topic_alias_must_be_within_the_servers_maximum():
    # [MQTT-3.3.2-9]: not above the server's Topic Alias Maximum (none announced: no alias at all)
    s, out = online(5, caps={0x22: 10})
    for a in (0, 11, 500):
        raises(ValueError, s.publish, "t/a", b"x", 0, False, 0, props={0x23: a})
    s.publish("t/a", b"x", 0, False, 0, props={0x23: 10})
    s.publish("", b"y", 0, False, 0, props={0x23: 10})  # the alias set above, on this connection
    assert len(out) == 2
    # a stored message may go again on another connection, where the alias means nothing
    raises(ValueError, s.publish, "", b"x", 1, False, 0, props={0x23: 10})
    s2, out2 = online(5)
    raises(ValueError, s2.publish, "t/a", b"x", 0, False, 0, props={0x23: 1})
    assert out2 == [] and s.pending() == [] and s2.pending() == []


def test_automatic_topic_aliases_never_take_a_packet_over_the_maximum_packet_size():
    # [MQTT-3.1.2-24]: the alias property (3 bytes) is counted before the packet goes
    s, out = online(5, caps={0x22: 10, 0x27: 100}, outbound_aliases=4)
    # fixed header 2 + topic 2+3 + property length 1 = 8; a payload of 92 makes exactly 100
    s.publish(b"t/a", b"p" * 92, 0, False, 0)
    s.publish(b"t/b", b"p" * 80, 0, False, 0)  # takes an alias: 3 bytes more, still under
    s.publish(b"t/b", b"p" * 92, 0, False, 0)  # by alias: the topic left out
    assert max(len(b) for b in out) <= 100, [len(b) for b in out]
    assert [decode(b, 5).topic for b in out] == ["t/a", "t/b", ""]
    raises(ValueError, s.publish, b"t/c", b"p" * 93, 0, False, 0)


def test_subscribe_and_unsubscribe_are_checked_against_the_maximum_packet_size():
    s, out = online(5, caps={0x27: 100})
    long = "f/" + "x" * 120
    raises(ValueError, s.subscribe, long, 1, 0)
    raises(ValueError, s.unsubscribe, long, 0)
    s.subscribe("f/short", 1, 0)
    assert [decode(b, 5).type for b in out] == [SUBSCRIBE] and max(len(b) for b in out) <= 100


def test_properties_only_a_server_sends_and_what_a_client_must_not_say():
    s, out = online(5)
    raises(ValueError, s.publish, "t", b"x", 0, False, 0, props={0x0B: 5})  # Subscription Identifier [MQTT-3.3.4-6]
    raises(ValueError, s.publish, "t", b"x", 0, False, 0, props={0x08: "r/#"})  # Response Topic is a topic name
    raises(ValueError, s.publish, "t", b"\xff", 0, False, 0, props={0x01: 1})  # Payload Format 1: UTF-8 payload
    s.publish("t", "hé".encode(), 0, False, 0, props={0x01: 1, 0x08: "r/x"})
    # a session that connected with Session Expiry 0 cannot set one at DISCONNECT (3.14.2.2.2)
    raises(ValueError, s.disconnect, 0, 0, {0x11: 3600})
    # DISCONNECT reason codes a client may send ([MQTT-3.14.2-1]); 0x8B is the server's
    for rc in (0x05, 0x8B, 0x01):
        raises(ValueError, s.disconnect, 0, rc)
    assert len(out) == 1
    s.disconnect(0, 0x04)
    assert decode(out[-1], 5).reason == 0x04
    s2, out2 = online(5, session_expiry=60)
    s2.disconnect(0, 0, {0x11: 3600})  # non-zero at CONNECT: may change
    assert decode(out2[-1], 5).props[0x11] == 3600


def test_a_suback_must_answer_its_subscribe():
    # one reason code per filter ([MQTT-3.8.4-6]); never more than the QoS asked for
    for v in (4, 5):
        for reasons in ([0, 0], [2], []):
            s, out = online(v)
            s.subscribe("a/b", 0, 0)
            pid = decode(out[-1], v).pid
            violation(s, out, Packet(SUBACK, pid=pid, reasons=reasons), 0x82)
        s, out = online(v)
        got = []
        s.on_event = lambda ev, a, b: got.append(b) if ev == 3 else None
        s.subscribe("a/b", 2, 0)
        feed(s, Packet(SUBACK, pid=decode(out[-1], v).pid, reasons=[1]))  # granted lower: fine
        assert got == [[1]]


def test_a_disconnect_from_the_server_is_checked():
    s, out = online(4)
    e = raises(MQTTError, feed, s, Packet(DISCONNECT))  # only a client sends DISCONNECT in 3.1.1
    assert "DISCONNECT" in str(e) or "14" in str(e), e
    s, out = online(5)
    violation(s, out, Packet(DISCONNECT, reason=0x04), 0x82)  # 0x04 is the client's


def scram_connecting():
    """A session that sent a CONNECT with Authentication Method SCRAM; its output as a list of packets."""
    s = Session("a", 5, True, connect_props={0x15: "SCRAM"}, auth=lambda r, p: {0x16: b"resp"})
    out = []
    s.send = lambda b, o, n: out.append(bytes(b[o : o + n]))
    s.connect_packet(0)
    return s, out


def test_auth_must_name_the_method_of_the_connect():
    for props in ({}, {0x15: "OTHER"}):
        s, out = scram_connecting()
        violation(s, out, Packet(AUTH, reason=0x18, props=props), 0x82)


def test_a_successful_connack_must_name_the_method_of_the_connect():
    # [MQTT-4.12.0-5]: after enhanced authentication the CONNACK carries the CONNECT's method
    for props in ({}, {0x15: "OTHER"}):
        s, out = scram_connecting()
        violation(s, out, Packet(CONNACK, props=props), 0x82)
    s, out = scram_connecting()
    feed(s, Packet(CONNACK, props={0x15: "SCRAM", 0x16: b"ok"}))
    assert s.state == 2 and s.server[0x16] == b"ok"  # CONNECTED
    s, out = online(5)  # no method asked for: none needed
    assert s.state == 2
    for v in (3, 4):  # before MQTT 5 CONNECT carries no properties: there is no method to echo
        s, out = online(v, connect_props={0x15: "SCRAM"})
        assert s.state == 2


def test_an_empty_client_id_needs_a_clean_session_before_mqtt_5():
    # [MQTT-3.1.3-7]; MQTT 3.1 takes 1 to 23 characters: a clean session gets a random one
    raises(ValueError, Session, "", 4, False)
    raises(ValueError, Session, "", 3, False)
    Session("", 4, True)
    Session("", 5, False)


def test_a_filter_given_as_bytes_is_taken():
    s, out = online(4)
    s.subscribe(b"a/b", 1, 0)
    s.subscribe(bytearray(b"c/+"), 1, 0)
    assert [decode(b, 4).topics for b in out] == [[("a/b", 1)], [("c/+", 1)]]
