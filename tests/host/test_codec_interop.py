"""The codec against real peers.

(a) paho-mqtt 2.x talks to a tiny TCP server in this test; every packet paho
    sends is decoded by Tern's decoder and compared with what paho was asked
    to send, and the server answers with packets Tern encodes (so paho's
    acceptance of those is checked too).
(b) Tern's encoder talks on raw sockets to a real Mosquitto; the broker
    accepts, grants, routes and acknowledges, and what comes back decodes to
    what was sent.
Every socket read has a timeout.
"""

import socket
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tern.codec import Packet, decode, encode, frame_size
from tern.wire import (
    CONNACK, CONNECT, DISCONNECT, PINGREQ, PINGRESP, PUBACK, PUBCOMP, PUBLISH, PUBREC, PUBREL, SUBACK,
    SUBSCRIBE, UNSUBACK, UNSUBSCRIBE, V31, V311, V5,
)

TIMEOUT = 5.0
PAHO_PROTOCOL = {V31: mqtt.MQTTv31, V311: mqtt.MQTTv311, V5: mqtt.MQTTv5}


class Conn:
    """One MQTT connection on a blocking socket: whole packets in, Tern-decoded."""

    def __init__(self, sock, version):
        self.sock = sock
        self.version = version
        self.buf = bytearray()
        sock.settimeout(TIMEOUT)

    def send(self, pkt):
        self.sock.sendall(encode(pkt, self.version))

    def recv(self, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        while True:
            n = frame_size(self.buf, 0, len(self.buf), 1 << 20)
            if 0 < n <= len(self.buf):
                frame = bytes(self.buf[:n])
                del self.buf[:n]
                return decode(frame, self.version)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no complete packet within %.1f s (have %r)" % (timeout, bytes(self.buf)))
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk

    def close(self):
        self.sock.close()


# ------------------------------------------------------------- (a) paho -> Tern


class FakeBroker(threading.Thread):
    """Accepts one connection, records every decoded packet, answers so paho proceeds."""

    def __init__(self, version):
        super().__init__(daemon=True)
        self.version = version
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(1)
        self.lsock.settimeout(TIMEOUT)
        self.port = self.lsock.getsockname()[1]
        self.packets = []
        self.error = None

    def run(self):
        try:
            s, _ = self.lsock.accept()
            c = Conn(s, self.version)
            while True:
                p = c.recv()
                if p is None:
                    break
                self.packets.append(p)
                t = p.type
                if t == CONNECT:
                    assert p.version == self.version, p
                    c.send(Packet(CONNACK))
                elif t == SUBSCRIBE:
                    c.send(Packet(SUBACK, pid=p.pid, reasons=[o & 3 for _, o in p.topics]))
                elif t == UNSUBSCRIBE:
                    c.send(Packet(UNSUBACK, pid=p.pid, reasons=[0] * len(p.topics) if self.version == V5 else ()))
                elif t == PUBLISH and p.qos == 1:
                    c.send(Packet(PUBACK, pid=p.pid))
                elif t == PUBLISH and p.qos == 2:
                    c.send(Packet(PUBREC, pid=p.pid))
                elif t == PUBREL:
                    c.send(Packet(PUBCOMP, pid=p.pid))
                elif t == PINGREQ:
                    c.send(Packet(PINGRESP))
                elif t == DISCONNECT:
                    break
            c.close()
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            self.lsock.close()


def v5props(ptype, **kw):
    p = Properties(ptype)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


@pytest.mark.parametrize("version", [V31, V311, V5])
def test_paho_packets_decode(version):
    v5 = version == V5
    srv = FakeBroker(version)
    srv.start()
    events = {k: threading.Event() for k in ("connect", "subscribe", "unsubscribe")}
    cl = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho-%d" % version,
                     protocol=PAHO_PROTOCOL[version], **({} if v5 else {"clean_session": True}))
    cl.on_connect = lambda *a: events["connect"].set()
    cl.on_subscribe = lambda *a: events["subscribe"].set()
    cl.on_unsubscribe = lambda *a: events["unsubscribe"].set()
    will_props = v5props(PacketTypes.WILLMESSAGE, WillDelayInterval=5, ContentType="text/plain") if v5 else None
    cl.will_set("will/topic", b"gone\x00\xff", qos=1, retain=True, properties=will_props)
    cl.username_pw_set("user\u00e9", "s3cret")
    conn_props = v5props(PacketTypes.CONNECT, SessionExpiryInterval=120, ReceiveMaximum=10) if v5 else None
    if v5:
        cl.connect("127.0.0.1", srv.port, keepalive=45, clean_start=True, properties=conn_props)
    else:
        cl.connect("127.0.0.1", srv.port, keepalive=45)
    cl.loop_start()
    try:
        assert events["connect"].wait(TIMEOUT), "paho did not accept Tern's CONNACK"
        if v5:
            opts = SubscribeOptions(qos=1, noLocal=True, retainAsPublished=True,
                                    retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
            cl.subscribe([("a/b", opts), ("c/#", SubscribeOptions(qos=2))],
                         properties=v5props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=7))
        else:
            cl.subscribe([("a/b", 1), ("c/#", 2)])
        assert events["subscribe"].wait(TIMEOUT), "paho did not accept Tern's SUBACK"
        pub_props = None
        if v5:
            pub_props = v5props(PacketTypes.PUBLISH, MessageExpiryInterval=60, PayloadFormatIndicator=1,
                                ContentType="application/json", ResponseTopic="reply/here",
                                CorrelationData=b"\x01\x02", UserProperty=[("k", "v"), ("k", "w")])
        infos = []
        for q in (0, 1, 2):
            infos.append(cl.publish("t/q%d" % q, b"payload-%d" % q, qos=q, retain=(q == 1), properties=pub_props))
        for info in infos:
            info.wait_for_publish(TIMEOUT)
            assert info.is_published()
        cl.unsubscribe(["a/b", "c/#"])
        assert events["unsubscribe"].wait(TIMEOUT), "paho did not accept Tern's UNSUBACK"
        cl.disconnect()
    finally:
        cl.loop_stop()
    srv.join(TIMEOUT)
    assert not srv.is_alive()
    if srv.error:
        raise srv.error
    got = [p for p in srv.packets if p.type != PINGREQ]
    types = [p.type for p in got]
    assert types == [CONNECT, SUBSCRIBE, PUBLISH, PUBLISH, PUBLISH, PUBREL, UNSUBSCRIBE, DISCONNECT], got

    c = got[0]
    want = Packet(CONNECT, version=version, clean=True, keepalive=45, client_id="paho-%d" % version,
                  will_topic="will/topic", will_payload=b"gone\x00\xff", will_qos=1, will_retain=True,
                  username="user\u00e9", password=b"s3cret")
    if v5:
        want.props = {0x11: 120, 0x21: 10}
        want.will_props = {0x18: 5, 0x03: "text/plain"}
    assert c == want

    s = got[1]
    if v5:
        assert s.topics == [("a/b", 0x1D), ("c/#", 2)]  # QoS 1 | No Local 04 | RAP 08 | retain handling 1 << 4
        assert s.props == {0x0B: 7}
    else:
        assert s.topics == [("a/b", 1), ("c/#", 2)]

    pubs = got[2:5]
    pids = set()
    for q, p in enumerate(pubs):
        assert (p.topic, bytes(p.payload), p.qos, p.retain, p.dup) == ("t/q%d" % q, b"payload-%d" % q, q, q == 1,
                                                                       False)
        if q:
            assert p.pid > 0
            pids.add(p.pid)
        if v5:
            assert p.props == {0x02: 60, 0x01: 1, 0x03: "application/json", 0x08: "reply/here", 0x09: b"\x01\x02",
                               0x26: [("k", "v"), ("k", "w")]}
    assert len(pids) == 2
    assert got[5].pid == pubs[2].pid  # PUBREL for the QoS 2 message
    assert got[6].topics == ["a/b", "c/#"]
    assert got[7] == Packet(DISCONNECT)


# ------------------------------------------------------- (b) Tern -> Mosquitto


def connect_raw(broker, version, client_id, **kw):
    s = socket.create_connection((broker.host, broker.port), timeout=TIMEOUT)
    c = Conn(s, version)
    c.send(Packet(CONNECT, version=version, client_id=client_id, keepalive=30, clean=True, **kw))
    ack = c.recv()
    assert ack is not None and ack.type == CONNACK, (ack, broker.log_tail())
    assert ack.reason == 0 and not ack.session_present, ack
    return c, ack


def expect(c, ptype, pid=None):
    p = c.recv()
    assert p is not None and p.type == ptype, p
    if pid is not None:
        assert p.pid == pid, p
    return p


@pytest.mark.parametrize("version", [V31, V311, V5])
def test_mosquitto_accepts_tern_packets(broker, version):
    v5 = version == V5
    topic = "tern/interop/%d" % version
    sub, ack = connect_raw(broker, version, "tern-sub-%d" % version,
                           props={0x21: 20, 0x11: 0} if v5 else None)
    if v5:
        assert ack.props is None or isinstance(ack.props, dict)
    sub.send(Packet(SUBSCRIBE, pid=1, topics=[(topic, 2), ("tern/other/#", 1)],
                    props={0x0B: 5, 0x26: [("why", "test")]} if v5 else None))
    suback = expect(sub, SUBACK, 1)
    assert list(suback.reasons) == [2, 1], suback

    pub, _ = connect_raw(broker, version, "tern-pub-%d" % version,
                         will_topic="tern/will", will_payload=b"w", will_qos=1,
                         will_props={0x18: 0} if v5 else None,
                         username="someone", password=b"anything")
    sent = []
    for q in (0, 1, 2):
        p = Packet(PUBLISH, topic=topic, qos=q, pid=100 + q if q else 0, payload=b"\x00m%d\xff" % q)
        if v5:
            p.props = {0x02: 600, 0x03: "bin", 0x26: [("n", str(q))], 0x09: b"corr"}
        pub.send(p)
        if q == 1:
            expect(pub, PUBACK, 101)
        elif q == 2:
            rec = expect(pub, PUBREC, 102)
            assert rec.reason == 0
            pub.send(Packet(PUBREL, pid=102))
            expect(pub, PUBCOMP, 102)
        sent.append(p)

    received = []
    while len(received) < 3:
        p = sub.recv()
        assert p is not None, "broker closed the subscriber: %s" % broker.log_tail()
        if p.type == PUBLISH:
            received.append(p)
            if p.qos == 1:
                sub.send(Packet(PUBACK, pid=p.pid))
            elif p.qos == 2:
                sub.send(Packet(PUBREC, pid=p.pid))
                expect(sub, PUBREL, p.pid)
                sub.send(Packet(PUBCOMP, pid=p.pid))
        else:
            assert p.type == PINGRESP, p
    for s, r in zip(sent, received):
        assert (r.topic, bytes(r.payload), r.qos, r.retain, r.dup) == (s.topic, s.payload, s.qos, False, False)
        if s.qos:
            assert r.pid > 0
        if v5:
            pr = dict(r.props)
            assert 0 < pr.pop(0x02) <= 600  # the broker sends the remaining expiry
            assert pr == {0x03: "bin", 0x26: s.props[0x26], 0x09: b"corr", 0x0B: [5]}, r.props

    # a ping each way of the protocol, then a clean goodbye
    pub.send(Packet(PINGREQ))
    expect(pub, PINGRESP)
    for c in (pub, sub):
        c.send(Packet(UNSUBSCRIBE, pid=9, topics=[topic]))
        ua = expect(c, UNSUBACK, 9)
        if v5:
            assert len(ua.reasons) == 1
        c.send(Packet(DISCONNECT))
        assert c.recv() is None  # the broker closes after DISCONNECT
        c.close()
