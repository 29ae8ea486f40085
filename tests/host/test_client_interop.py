"""Tern and paho-mqtt talk through a real Mosquitto both ways, MQTT 5
properties intact."""

import threading

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tern import props as P
from tern.client import Client


def paho_client(broker, name, on_message=None):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=name, protocol=mqtt.MQTTv5)
    ready = threading.Event()
    c.on_connect = lambda *a: ready.set()
    if on_message:
        c.on_message = on_message
    c.connect(broker.host, broker.port)
    c.loop_start()
    assert ready.wait(5), "paho did not connect"
    return c


def test_paho_receives_what_tern_publishes_with_properties(broker):
    got, done = [], threading.Event()

    def on_message(client, userdata, msg):
        got.append(msg)
        done.set()

    subscribed = threading.Event()
    p = paho_client(broker, "paho-sub", on_message)
    p.on_subscribe = lambda *a: subscribed.set()
    p.subscribe("interop/#", qos=2)
    assert subscribed.wait(5)
    t = Client("tern-pub", server=broker.host, port=broker.port, version=5)
    t.connect()
    pid = t.publish("interop/t", b"\x00binary\xff", qos=2, props={
        P.CONTENT_TYPE: "application/octet-stream",
        P.RESPONSE_TOPIC: "interop/reply",
        P.CORRELATION_DATA: b"corr-1",
        P.USER_PROPERTY: [("k1", "v1"), ("k1", "v2"), ("name", "tern")],
        P.MESSAGE_EXPIRY_INTERVAL: 120,
        P.PAYLOAD_FORMAT_INDICATOR: 0,
    })
    t.wait_published(pid, 5)
    assert done.wait(5), "paho received nothing"
    m = got[0]
    pr = m.properties
    assert (m.topic, m.payload, m.qos) == ("interop/t", b"\x00binary\xff", 2)
    assert pr.ContentType == "application/octet-stream" and pr.ResponseTopic == "interop/reply"
    assert pr.CorrelationData == b"corr-1"
    assert pr.UserProperty == [("k1", "v1"), ("k1", "v2"), ("name", "tern")]
    assert 0 < pr.MessageExpiryInterval <= 120
    t.disconnect()
    p.loop_stop()
    p.disconnect()


def test_tern_receives_what_paho_publishes_with_properties(broker):
    got = []
    t = Client("tern-sub", server=broker.host, port=broker.port, version=5)
    t.connect()
    t.subscribe("interop/#", 2, handler=lambda m: got.append(
        (m.topic, bytes(m.payload), m.qos, m.properties)))
    p = paho_client(broker, "paho-pub")
    props = Properties(PacketTypes.PUBLISH)
    props.ContentType = "text/plain"
    props.ResponseTopic = "interop/answer"
    props.CorrelationData = b"\x01\x02\x03"
    props.UserProperty = [("a", "1"), ("b", "2")]
    props.PayloadFormatIndicator = 1
    info = p.publish("interop/p", "héllo".encode(), qos=1, properties=props)
    info.wait_for_publish(5)
    for _ in range(100):
        t.loop(20)
        if got:
            break
    assert got, "tern received nothing"
    topic, payload, qos, pr = got[0]
    assert (topic, payload, qos) == ("interop/p", "héllo".encode(), 1)
    assert pr[P.CONTENT_TYPE] == "text/plain" and pr[P.RESPONSE_TOPIC] == "interop/answer"
    assert pr[P.CORRELATION_DATA] == b"\x01\x02\x03" and pr[P.PAYLOAD_FORMAT_INDICATOR] == 1
    assert pr[P.USER_PROPERTY] == [("a", "1"), ("b", "2")]
    assert pr[P.SUBSCRIPTION_IDENTIFIER] == [1]  # Tern's handler subscription carried an identifier
    t.disconnect()
    p.loop_stop()
    p.disconnect()


def test_tern_answers_a_paho_request_with_reply(broker):
    """Request/response: paho asks with a Response Topic and Correlation Data;
    Tern's reply() answers there, the correlation data carried back."""
    answers, answered = [], threading.Event()

    def on_answer(client, userdata, msg):
        answers.append(msg)
        answered.set()

    subscribed = threading.Event()
    p = paho_client(broker, "paho-req", on_answer)
    p.on_subscribe = lambda *a: subscribed.set()
    p.subscribe("rr/answers/paho", qos=1)
    assert subscribed.wait(5)
    t = Client("tern-rr", server=broker.host, port=broker.port, version=5)
    t.connect()
    requests = []

    def serve(m):
        requests.append(m.properties)
        t.reply(m, b"pong:" + bytes(m.payload), 1, props={P.CONTENT_TYPE: "text/plain"})

    t.subscribe("rr/requests", 1, handler=serve)
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = "rr/answers/paho"
    props.CorrelationData = b"req-42"
    props.MessageExpiryInterval = 30
    p.publish("rr/requests", b"ping", qos=1, properties=props).wait_for_publish(5)
    for _ in range(200):
        t.loop(20)
        if answered.is_set():
            break
    assert answered.wait(2), "paho got no answer"
    assert 0 < requests[0][P.MESSAGE_EXPIRY_INTERVAL] <= 30  # expiry reaches the receiver
    a = answers[0]
    assert (a.topic, a.payload) == ("rr/answers/paho", b"pong:ping")
    assert a.properties.CorrelationData == b"req-42" and a.properties.ContentType == "text/plain"
    # a message without a response topic cannot be answered
    try:
        t.reply(type("M", (), {"properties": {}})(), b"x")
    except ValueError as e:
        assert "response topic" in str(e)
    else:
        raise AssertionError("reply() without a response topic did not raise")
    t.disconnect()
    p.loop_stop()
    p.disconnect()


def _dispatch_through_mosquitto(broker, version):
    # The subscriptions of tests/lib/test_scripted.py's dispatch tests, against the real Mosquitto, which
    # sends one copy of a message per matching subscription; paho publishes. Returns the calls as
    # (handler, topic, identifiers the copy carried).
    got = []

    def h(name):
        return lambda m: got.append((name, m.topic, m.n_sub_ids))

    t = Client("tern-sids-%d" % version, server=broker.host, port=broker.port, version=version)
    t.on_message = h("D")
    t.connect()
    t.subscribe("a/#", 1, handler=h("X"), sub_id=1 if version == 5 else None)
    t.subscribe("a/b", 1, handler=h("Y"))
    t.subscribe("h/#", 1, handler=h("H"))
    t.subscribe("h/b", 1)
    t.subscribe("$share/g/s/#", 1, handler=h("S"))
    t.subscribe("s/x", 1, handler=h("T"))
    p = paho_client(broker, "paho-pub-%d" % version)
    for topic in ("a/b", "h/b", "s/x"):
        p.publish(topic, b"m", qos=1).wait_for_publish(5)
    t.loop(1000)
    p.loop_stop()
    p.disconnect()
    t.disconnect()
    return sorted(got)


def test_subscription_identifiers_with_mosquittos_copy_per_subscription(broker):
    # Each handler once (on_message for h/b's subscription without a handler), each copy carrying one
    # identifier: the automatic id of a/b used to be 1 again (X and Y twice each), and the copy for h/b
    # was matched to h/# by topic (H twice, D never)
    assert _dispatch_through_mosquitto(broker, 5) == sorted(
        [("X", "a/b", 1), ("Y", "a/b", 1), ("H", "h/b", 1), ("D", "h/b", 1), ("S", "s/x", 1), ("T", "s/x", 1)])


def test_topic_matching_with_mosquittos_single_copy_under_mqtt_311(broker):
    # MQTT 3.1.1 has no identifiers: a copy reaches every subscription whose filter matches, and
    # on_message once when one of them has no handler. Mosquitto 2.0 sends a 3.1.1 client one copy per
    # message however many of its subscriptions match, so each handler runs once (D used to be skipped
    # for h/b because H took the message)
    assert _dispatch_through_mosquitto(broker, 4) == sorted(
        [("X", "a/b", 0), ("Y", "a/b", 0), ("H", "h/b", 0), ("D", "h/b", 0), ("S", "s/x", 0), ("T", "s/x", 0)])
