"""MQTT 5 client features, byte-exact against the scripted broker and end to
end against Mosquitto: outbound topic aliases, enhanced authentication (AUTH)
with re-authentication and refusals, and the server capabilities a CONNACK
announces (enforced before anything is sent). Runs on CPython and MicroPython."""

from check import raises, MICROPYTHON
from pump import client, until, collect
from tern.codec import Packet, encode
from tern.client import Client, ConnectError, ticks_ms
from tern.wire import MQTTError, CONNECT, CONNACK, PUBLISH, PUBACK, SUBSCRIBE, SUBACK, DISCONNECT, AUTH

MP_TIMEOUT = 240


def E(t, **kw):
    return encode(Packet(t, **kw), 5)


def pub(topic, payload, alias=0, qos=0, pid=0, props=None):
    pr = dict(props) if props else {}
    if alias:
        pr[0x23] = alias
    return E(PUBLISH, topic=topic, payload=payload, qos=qos, pid=pid, props=pr or None)


def hello(caps=None):
    """CONNECT (any content) answered by a CONNACK with these properties."""
    return [("recv_type", CONNECT), ("send", E(CONNACK, props=caps))]


# The CONNECT of an enhanced-authentication client (rx_size pinned so the
# Maximum Packet Size property is the same on both runtimes).
AUTH_CONNECT = E(CONNECT, version=5, client_id="auth", props={0x15: "TEST", 0x16: b"c1", 0x27: 4096 - 8, 0x21: 32})
M = {0x15: "TEST"}
KA_CONNECT = E(CONNECT, version=5, client_id="scripted", keepalive=30, props={0x27: 4096 - 8, 0x21: 32})

SCRIPTS = {
    "test_outbound_aliases_bytes": ([
        hello({0x22: 2}) + [
            ("recv", pub("a/1", b"1", alias=1)),
            ("recv", pub("", b"2", alias=1)),  # the alias alone
            ("recv", pub("a/2", b"3", alias=2, props={0x26: [("k", "v")]})),
            ("recv", pub("", b"4", alias=2, props={0x26: [("k", "v")]})),
            ("recv", pub("a/3", b"5")),  # beyond the server's maximum of 2: no alias
            ("recv", pub("", b"6", alias=1)),
            ("recv", pub("a/1", b"7", qos=1, pid=1)),  # QoS 1 never uses an alias
            ("send", E(PUBACK, pid=1)),
            ("close",)],
        hello({0x22: 2}) + [
            ("recv", pub("a/1", b"8", alias=1)),  # a new connection: aliases start again
            ("close",)],
        hello() + [("recv", pub("a/1", b"9"))],  # no Topic Alias Maximum from the server: no aliases
    ], 5),
    "test_enhanced_auth_exchange_and_reauthentication": ([[
        ("recv", AUTH_CONNECT),
        ("send", E(AUTH, reason=0x18, props={0x15: "TEST", 0x16: b"s1"})),
        ("recv", E(AUTH, reason=0x18, props={0x15: "TEST", 0x16: b"c2"})),
        ("send", E(CONNACK, props={0x15: "TEST", 0x16: b"s2"})),
        # re-authentication, two rounds
        ("recv", E(AUTH, reason=0x19, props={0x15: "TEST", 0x16: b"r1"})),
        ("send", E(AUTH, reason=0x18, props={0x15: "TEST", 0x16: b"s3"})),
        ("recv", E(AUTH, reason=0x18, props={0x15: "TEST", 0x16: b"c3"})),
        ("send", E(AUTH, reason=0, props=M)),
        ("recv", pub("after", b"ok", qos=1, pid=1)),
        ("send", E(PUBACK, pid=1)),
        # a re-authentication the server refuses
        ("recv", E(AUTH, reason=0x19, props={0x15: "TEST", 0x16: b"stale"})),
        ("send", E(DISCONNECT, reason=0x87, props={0x1F: "token expired"})),
        ("close",),
    ]], 5),
    "test_auth_refused_in_connack_is_a_clear_permanent_error": ([[
        ("recv", AUTH_CONNECT),
        ("send", E(AUTH, reason=0x18, props={0x15: "TEST", 0x16: b"s1"})),
        ("recv", E(AUTH, reason=0x18, props={0x15: "TEST", 0x16: b"c2"})),
        ("send", E(CONNACK, reason=0x8C)),
        ("close",),
    ]], 5),
    "test_auth_hook_that_fails_ends_the_connection": ([[
        ("recv", AUTH_CONNECT),
        ("send", E(AUTH, reason=0x18, props={0x15: "TEST", 0x16: b"garbage"})),
        ("recv", E(DISCONNECT, reason=0x80)),
        ("close",),
    ]], 5),
    "test_server_capabilities_are_enforced_before_sending": ([
        hello({0x24: 1, 0x25: 0, 0x28: 0, 0x29: 0, 0x2A: 0}) + [
            # only what passed the checks reaches the wire, in this order
            ("recv", E(SUBSCRIBE, pid=1, topics=[("a/b", 1)])),  # handler, but no identifier
            ("send", E(SUBACK, pid=1, reasons=[1])),
            ("recv", pub("t", b"q1", qos=1, pid=2)),
            ("send", E(PUBACK, pid=2)),
            ("send", pub("a/b", b"to-handler")),  # no identifier: dispatch by topic
        ],
    ], 5),
    "test_server_keep_alive_holds_for_its_connection_only": ([
        [("recv", KA_CONNECT), ("send", E(CONNACK, props={0x13: 1})), ("recv", b"\xc0\x00"),
         ("send", b"\xd0\x00"), ("close",)],
        [("recv", KA_CONNECT), ("send", E(CONNACK))],  # our own keep alive again
    ], 5),
}
SCRIPTS["test_aio_enhanced_auth_and_reauthentication"] = SCRIPTS["test_enhanced_auth_exchange_and_reauthentication"]


def _client(addr, **kw):
    kw.setdefault("backoff_min", 0.02)
    kw.setdefault("backoff_max", 0.1)
    c = Client(kw.pop("cid", "scripted"), server=addr[0], port=addr[1], version=5, **kw)
    c.connect()
    return c


def test_outbound_aliases_bytes(scripted_addr):
    ups = []
    c = Client("scripted", server=scripted_addr[0], port=scripted_addr[1], version=5, outbound_aliases=8,
               backoff_min=0.02, backoff_max=0.1)
    c.on_connect = lambda sp, rc: ups.append(rc)
    c.connect()
    up = {0x26: [("k", "v")]}
    for topic, payload, props in (("a/1", b"1", None), ("a/1", b"2", None), ("a/2", b"3", up), ("a/2", b"4", up),
                                  ("a/3", b"5", None), ("a/1", b"6", None)):
        c.publish(topic, payload, qos=0, props=props)
    c.wait_published(c.publish("a/1", b"7", qos=1), 5)
    for n, payload in ((2, b"8"), (3, b"9")):
        until([c], lambda: len(ups) == n and c.connected, what="connection %d" % n)
        c.publish("a/1", payload, qos=0)
    c.loop(100)
    c.disconnect()


def auth_hook():
    """An auth hook answering the scripted server's challenges s1 and s3, and the calls it got."""
    seen = []
    answers = {b"s1": b"c2", b"s3": b"c3"}

    def hook(reason, props):
        data = props.get(0x16) if props else None
        seen.append((reason, data))
        return {0x16: answers[data]} if reason == 0x18 else None

    return hook, seen


def test_enhanced_auth_exchange_and_reauthentication(scripted_addr):
    hook, seen = auth_hook()
    c = _client(scripted_addr, cid="auth", auth=hook, rx_size=4096, reconnect=False,
                connect_props={0x15: "TEST", 0x16: b"c1"})
    assert c.session.server[0x16] == b"s2"  # the server's last word is in CONNACK
    c.reauthenticate({0x16: b"r1"}, timeout=5)
    assert seen == [(0x18, b"s1"), (0x18, b"s3"), (0, None)], seen
    c.wait_published(c.publish("after", b"ok", qos=1), 5)  # the connection carries on
    e = raises(MQTTError, c.reauthenticate, {0x16: b"stale"}, 5)
    assert e.code == 0x87 and "token expired" in str(e), str(e)
    assert not c.connected


def test_aio_enhanced_auth_and_reauthentication(scripted_addr):
    import asyncio
    from tern import aio

    hook, seen = auth_hook()

    async def main():
        c = aio.Client("auth", server=scripted_addr[0], port=scripted_addr[1], version=5, auth=hook, rx_size=4096,
                       reconnect=False, connect_props={0x15: "TEST", 0x16: b"c1"})
        await c.connect(5)
        assert c.session.server[0x16] == b"s2"
        await c.reauthenticate({0x16: b"r1"}, timeout=5)
        assert seen == [(0x18, b"s1"), (0x18, b"s3"), (0, None)], seen
        await c.publish("after", b"ok", qos=1, wait_ack=True, timeout=5)  # the connection carries on
        try:
            await c.reauthenticate({0x16: b"stale"}, 5)
        except MQTTError as e:
            assert e.code == 0x87 and "token expired" in str(e), str(e)
        else:
            raise AssertionError("a refused re-authentication returned")
        assert not c.connected
        c.close()

    asyncio.run(main())


def test_auth_refused_in_connack_is_a_clear_permanent_error(scripted_addr):
    c = Client("auth", server=scripted_addr[0], port=scripted_addr[1], version=5, rx_size=4096,
               auth=lambda r, p: {0x16: b"c2"}, connect_props={0x15: "TEST", 0x16: b"c1"})
    e = raises(ConnectError, c.connect)
    assert e.reason == 0x8C and e.permanent, e
    assert "bad authentication method" in str(e), str(e)


def test_auth_hook_that_fails_ends_the_connection(scripted_addr):
    def hook(reason, props):
        raise ValueError("challenge %r not understood" % props[0x16])

    c = Client("auth", server=scripted_addr[0], port=scripted_addr[1], version=5, rx_size=4096, auth=hook,
               connect_props={0x15: "TEST", 0x16: b"c1"}, reconnect=False)
    e = raises(MQTTError, c.connect)
    assert e.code == 0x80 and "authentication hook failed" in str(e) and "not understood" in str(e), str(e)
    assert not c.connected


def test_server_capabilities_are_enforced_before_sending(scripted_addr):
    got = []
    c = _client(scripted_addr)
    s = c.session
    assert (s.max_qos, s.retain_ok, s.wildcard_ok, s.sid_ok, s.shared_ok) == (1, False, False, False, False)
    for flt, kw, what in (("a/+", {}, "wildcard"), ("a/#", {}, "wildcard"), ("$share/g/a", {}, "shared"),
                          ("a/b", {"sub_id": 5}, "subscription identifiers")):
        e = raises(ValueError, c.subscribe, flt, 1, None, None, **kw)
        assert what in str(e), str(e)
    assert s.subs == []  # nothing registered either
    assert c.subscribe("a/b", 1, handler=collect(got)) == [1]
    assert s.subs[0].sid is None
    e = raises(ValueError, c.publish, "t", b"r", qos=1, retain=True)
    assert "retained" in str(e), str(e)
    e = raises(ValueError, c.publish, "t", b"q2", qos=2)
    assert "QoS up to 1" in str(e), str(e)
    assert s.pending() == []  # refused messages were not stored
    c.wait_published(c.publish("t", b"q1", qos=1), 5)
    until([c], lambda: got, what="the message, dispatched by topic")
    assert got == [("a/b", b"to-handler", 0, False)], got
    c.disconnect()


def test_outbound_aliases_against_mosquitto(broker_addr):
    got = []
    sub = client(broker_addr, "sub", version=5)
    sub.subscribe("al/#", 0, handler=collect(got))
    pub = client(broker_addr, "pub", version=5, outbound_aliases=4)
    assert pub.session._oalias_cap >= 1  # Mosquitto announces a Topic Alias Maximum
    topics = ["al/x", "al/y", "al/x", "al/x", "al/y"]
    for i, t in enumerate(topics):
        pub.publish(t, b"%d" % i, qos=0)
    assert len(pub.session._oalias) == 2
    until([sub, pub], lambda: len(got) == len(topics), what="every aliased message")
    assert [g[0] for g in got] == topics, got  # the subscriber sees the full topic each time
    assert [g[1] for g in got] == [b"%d" % i for i in range(len(topics))], got
    pub.disconnect()
    sub.disconnect()



if not MICROPYTHON:  # the fixture runs on CPython only; MicroPython gets its value
    import pytest

    @pytest.fixture(scope="module")
    def limited_addr(tmp_path_factory):
        """A Mosquitto whose CONNACK says Maximum QoS 1, Retain Available 0, Maximum Packet Size 200."""
        from ternlab.brokers.mosquitto import Broker

        b = Broker(tmp_path_factory.mktemp("limited"),
                   extra=["max_qos 1", "retain_available false", "max_packet_size 200"]).start()
        yield [b.host, b.port]
        b.stop()


def test_stored_messages_the_server_cannot_take_are_refused_not_resent_forever(limited_addr):
    # Messages stored offline (before any CONNACK said what the server takes) that break its Maximum QoS,
    # Retain Available or Maximum Packet Size (MQTT 5 3.2.2.3.4-6) were sent as they were: Mosquitto
    # disconnected, the client reconnected and sent them again, for ever, and nothing behind them left.
    # They are now given back refused (0x9B, 0x9A, 0x95), as a PUBACK refusal would, and the rest goes.
    got, done = [], []
    sub = client(limited_addr, "sub", version=5)
    sub.subscribe("lim/#", 1, handler=collect(got))
    c = Client("lim-%d" % ticks_ms(), server=limited_addr[0], port=limited_addr[1], version=5, clean=False,
               session_expiry=60, backoff_min=0.02, backoff_max=0.1)
    c.on_published = lambda pid, reason: done.append((pid, reason))
    ids = [c.publish("lim/q2", b"q2", qos=2), c.publish("lim/ret", b"ret", qos=1, retain=True),
           c.publish("lim/big", b"b" * 300, qos=1), c.publish("lim/ok", b"ok", qos=1)]
    until([c, sub], lambda: got, 5000, "the message the server can take")  # loop() connects
    c.loop(200)
    assert c.connected and not c.session.pending(), c.last_error
    assert sorted(done) == sorted(zip(ids, (0x9B, 0x9A, 0x95, 0))), done
    assert got == [("lim/ok", b"ok", 1, False)], got
    # Now that the limits are known they are checked before anything is stored; a packet of exactly
    # the maximum goes (the estimate used to refuse packets up to 5 bytes short of it)
    e = raises(ValueError, c.publish, "lim/big", b"b" * 186, qos=1)  # 201 bytes
    assert "201 bytes" in str(e) and "maximum packet size 200" in str(e), str(e)
    c.wait_published(c.publish("lim/big", b"b" * 185, qos=1), 5)  # 200 bytes
    c.publish("lim/big", b"b" * 187, qos=0)  # QoS 0, no packet id: 200 bytes too
    until([c, sub], lambda: len(got) == 3, 5000, "the two messages of 200 bytes")
    assert c.connected and [g[2] for g in got] == [1, 1, 0], got
    c.disconnect()
    sub.disconnect()


def test_a_will_the_server_cannot_take_is_a_permanent_refusal(limited_addr):
    # CONNACK 0x9A (will retain, Retain Available 0) and 0x9B (will QoS above Maximum QoS) cannot change
    # on a retry with the same settings: loop() used to retry them for ever with backoff
    for kw, code in (({"will_retain": True}, 0x9A), ({"will_qos": 2}, 0x9B)):
        c = Client("will-%d" % code, server=limited_addr[0], port=limited_addr[1], version=5,
                   will_topic="lim/will", will_payload=b"gone", **kw)
        e = raises(ConnectError, c.connect)
        assert e.reason == code and e.permanent, (e.reason, e.permanent)
        raises(ConnectError, c.loop, 100)  # loop() reports it once and stops retrying
        assert not c.reconnect and not c.loop(50)


def test_server_keep_alive_holds_for_its_connection_only(scripted_addr):
    # A CONNACK's Server Keep Alive replaces ours on that connection (MQTT 5 3.2.2.3.14, [MQTT-3.2.2-21]);
    # it used to overwrite the client's setting, so every later CONNECT, to any server, asked for it
    ups = []
    c = _client(scripted_addr, keepalive=30, rx_size=4096)
    c.on_connect = lambda sp, rc: ups.append(rc)
    assert c.session.keepalive == 1
    until([c], lambda: ups, 5000, "the reconnection")  # after a PINGREQ a second in
    assert c.connected and c.session.keepalive == 30
    c.disconnect()
