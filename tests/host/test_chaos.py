"""The chaos proxy between real clients (paho-mqtt, a raw socket client built on
tern.codec) and a real Mosquitto: forwarding, cuts, stalls, latency, bandwidth."""

import json
import queue
import socket
import threading
import time

import paho.mqtt.client as mqtt
import pytest

from tern.codec import Packet, encode
from tern.wire import (CONNACK, CONNECT, DISCONNECT, PINGREQ, PINGRESP, PUBACK, PUBLISH,
                       SUBACK, SUBSCRIBE)
from ternlab.brokers.mosquitto import free_port
from ternlab.brokers.chaos import B2C, C2B, ChaosProxy, Rule, packet_id

from rawmqtt import Raw  # noqa: E402

TIMEOUT = 5.0


# ---------------------------------------------------------------- clients

def paho(client_id, **kw):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311, **kw)
    c.messages = queue.Queue()
    c.connacks = queue.Queue()
    c.subacks = queue.Queue()
    c.acked = []  # mids whose PUBACK arrived, in order
    c.disconnected = threading.Event()
    c.disconnected_at = None

    def on_disconnect(cl, ud, flags, rc, props):
        cl.disconnected_at = time.monotonic()
        cl.disconnect_rc = rc
        cl.disconnected.set()

    c.on_message = lambda cl, ud, m: cl.messages.put(m)
    c.on_connect = lambda cl, ud, flags, rc, props: cl.connacks.put(rc)
    c.on_subscribe = lambda cl, ud, mid, rcs, props: cl.subacks.put(rcs)
    c.on_publish = lambda cl, ud, mid, rc, props: cl.acked.append(mid)
    c.on_disconnect = on_disconnect
    return c


def paho_connect(c, addr, keepalive=30):
    c.connect(addr[0], addr[1], keepalive)
    c.loop_start()
    assert c.connacks.get(timeout=TIMEOUT) == 0


def types(records):
    return [r.type for r in records]


# ---------------------------------------------------------------- forwarding

def test_forwards_a_normal_session_intact_and_logs_every_packet(chaos, tmp_path):
    c = paho("intact")
    paho_connect(c, chaos.address)
    c.subscribe("chaos/intact", 1)
    assert [int(r.value) for r in c.subacks.get(timeout=TIMEOUT)] == [1]
    payload = bytes(range(256)) * 40  # 10 KB: several reads on the way
    info = c.publish("chaos/intact", payload, qos=1)
    info.wait_for_publish(TIMEOUT)
    m = c.messages.get(timeout=TIMEOUT)
    assert m.payload == payload and m.qos == 1
    c.disconnect()
    c.loop_stop()
    conn = chaos.connections[0]
    assert conn.wait_closed(TIMEOUT)
    # After DISCONNECT both sides hang up; whichever the proxy notices first.
    assert conn.close_reason in ("client closed", "broker closed")

    log = chaos.log
    assert {r.conn for r in log} == {1}
    c2b, b2c = chaos.packets(C2B), chaos.packets(B2C)
    assert types(c2b) == ["CONNECT", "SUBSCRIBE", "PUBLISH", "PUBACK", "DISCONNECT"]
    assert types(b2c)[:2] == ["CONNACK", "SUBACK"]
    assert sorted(types(b2c)[2:]) == ["PUBACK", "PUBLISH"]
    sent = c2b[2]
    assert sent.length == 1 + 2 + 2 + len("chaos/intact") + 2 + len(payload)  # 2-byte length
    assert chaos.packets(B2C, "PUBACK")[0].pid == sent.pid
    assert chaos.packets(C2B, "PUBACK")[0].pid == chaos.packets(B2C, "PUBLISH")[0].pid
    assert c2b[1].pid == b2c[1].pid  # SUBSCRIBE / SUBACK
    assert sum(r.length for r in c2b) == conn.bytes_out[C2B] == conn.bytes_in[C2B]
    assert sum(r.length for r in b2c) == conn.bytes_out[B2C] == conn.bytes_in[B2C]
    assert all(a.t <= b.t for a, b in zip(log, log[1:]))

    path = chaos.write_log(tmp_path / "log.jsonl")
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines == [r.as_dict() for r in log]
    assert set(lines[0]) == {"t", "conn", "direction", "type", "length", "pid"}
    path = chaos.write_log(tmp_path / "all.jsonl", events=True)
    kinds = [x.get("event") for x in map(json.loads, path.read_text().splitlines())]
    assert kinds[0] == "accepted" and kinds[-1] == "closed"


def test_copes_with_packets_split_across_reads_and_several_in_one_read(chaos):
    c = Raw(chaos.address)
    # Three packets in one write...
    c.send(Packet(CONNECT, client_id="framing"), Packet(SUBSCRIBE, pid=7, topics=[("f/t", 1)]),
           Packet(PINGREQ))
    assert [c.recv().type for _ in range(3)] == [CONNACK, SUBACK, PINGRESP]
    # ...then one packet in pieces: the type byte, half the length, the rest.
    frame = encode(Packet(PUBLISH, topic="f/t", payload=b"x" * 300, qos=1, pid=9))
    for piece in (frame[:1], frame[1:2], frame[2:150], frame[150:]):
        c.sock.sendall(piece)
        time.sleep(0.05)
    got = sorted([c.recv(), c.recv()], key=lambda p: p.type)
    assert got[0].type == PUBLISH and bytes(got[0].payload) == b"x" * 300
    assert (got[1].type, got[1].pid) == (PUBACK, 9)
    c.close()
    c2b = chaos.packets(C2B)
    assert types(c2b) == ["CONNECT", "SUBSCRIBE", "PINGREQ", "PUBLISH"]
    assert (c2b[3].length, c2b[3].pid) == (len(frame), 9)
    assert c2b[1].pid == 7


def test_packet_id_reads_the_identifier_of_each_packet_type():
    assert packet_id(encode(Packet(PUBLISH, topic="a/b", payload=b"p", qos=2, pid=513))) == 513
    assert packet_id(encode(Packet(PUBLISH, topic="a/b", payload=b"p"))) is None
    assert packet_id(encode(Packet(PUBACK, pid=65535))) == 65535
    assert packet_id(encode(Packet(SUBACK, pid=4, reasons=[1]))) == 4
    assert packet_id(encode(Packet(PINGREQ))) is None
    assert packet_id(encode(Packet(CONNECT, client_id="x"))) is None


# ---------------------------------------------------------------- cuts

def test_cut_before_the_brokers_third_puback_reaches_the_client(chaos):
    rule = chaos.cut_at_packet("PUBACK", 3, B2C, connections=1)
    assert rule.describe() == "cut at b2c PUBACK #3 (before forwarding it)"
    c = paho("cut3")
    paho_connect(c, chaos.address)
    for i in range(6):
        c.publish("chaos/cut", b"m%d" % i, qos=1)
    assert c.disconnected.wait(TIMEOUT)
    c.loop_stop()
    assert c.acked == [1, 2]  # exactly two PUBACKs reached paho
    assert [r.pid for r in chaos.packets(B2C, "PUBACK", conn=1)] == [1, 2]
    cut = [e for e in chaos.events if e.kind == "cut"]
    assert len(cut) == 1 and cut[0].detail["pid"] == 3 and cut[0].detail["forwarded"] is False
    assert chaos.connections[0].close_reason.startswith("cut:")
    assert chaos.rules == []  # it was for one connection only

    # The client reconnects: a fresh upstream, no rule left.
    r = Raw(chaos.address)
    r.connect("cut3-again")
    for pid in (1, 2, 3, 4):
        r.send(Packet(PUBLISH, topic="chaos/cut", payload=b"again", qos=1, pid=pid))
        assert r.recv().type == PUBACK
    r.close()
    assert len(chaos.connections) == 2
    assert len(chaos.packets(B2C, "PUBACK", conn=2)) == 4


@pytest.mark.parametrize("forward, seen", [(False, 2), (True, 3)])
def test_cut_at_the_third_puback_before_or_after_forwarding_it(chaos, forward, seen):
    chaos.cut_at_packet(PUBACK, 3, B2C, forward=forward)
    c = Raw(chaos.address)
    c.connect("cut-raw")
    c.send(*[Packet(PUBLISH, topic="chaos/raw", payload=b"p", qos=1, pid=i) for i in range(1, 6)])
    pids = []
    with pytest.raises(EOFError):
        while True:
            p = c.recv()
            assert p.type == PUBACK
            pids.append(p.pid)
    assert pids == list(range(1, seen + 1))
    c.close()


def test_cut_after_n_bytes_from_the_broker_cuts_exactly_there(chaos):
    chaos.cut_after_bytes(7, B2C)
    c = Raw(chaos.address)
    c.send(Packet(CONNECT, client_id="bytes"), Packet(SUBSCRIBE, pid=0x0102, topics=[("b/t", 0)]))
    data = c.recv_all()
    # CONNACK (4 bytes) and the first 3 of SUBACK's 5, then the end.
    assert data == b"\x20\x02\x00\x00" + b"\x90\x03\x01"
    c.close()
    conn = chaos.connections[0]
    assert conn.wait_closed(TIMEOUT)
    assert types(chaos.packets(B2C)) == ["CONNACK"]  # the SUBACK was never whole


def test_cut_after_n_bytes_to_the_broker_cuts_exactly_there(tmp_path):
    """Upstream here is a plain TCP sink that records what reaches it."""
    received = bytearray()
    closed = threading.Event()
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(TIMEOUT)

    def sink():
        s, _ = srv.accept()
        s.settimeout(TIMEOUT)
        while True:
            try:
                d = s.recv(65536)
            except OSError:
                break
            if not d:
                break
            received.extend(d)
        s.close()
        closed.set()

    t = threading.Thread(target=sink, daemon=True)
    t.start()
    with ChaosProxy(srv.getsockname()) as proxy:
        proxy.cut_after_bytes(20, C2B)
        c = Raw(proxy.address)
        wire = encode(Packet(CONNECT, client_id="twenty-bytes-and-more")) + encode(Packet(PINGREQ))
        assert len(wire) > 20
        c.sock.sendall(wire)
        assert closed.wait(TIMEOUT)
        assert bytes(received) == wire[:20]
        assert c.recv_all() == b""
        c.close()
    t.join(TIMEOUT)
    srv.close()


def test_random_cuts_are_seeded_and_cut_where_they_say(chaos):
    a = chaos.cut_at_random_packet(11, max_nth=5)
    chaos.clear_rules()
    b = chaos.cut_at_random_packet(11, max_nth=5)
    chaos.clear_rules()
    assert a == b
    chosen = set()
    for n, seed in enumerate(range(8), start=1):
        rule = chaos.cut_at_random_packet(seed, max_nth=5)
        chosen.add((rule.direction, rule.forward))
        # A lock-step session: five packets each way, one round trip at a time.
        c = Raw(chaos.address)
        steps = [Packet(CONNECT, client_id="rnd"), Packet(SUBSCRIBE, pid=1, topics=[("r/t", 0)])]
        steps += [Packet(PINGREQ)] * 3
        try:
            for p in steps:
                c.send(p)
                c.recv()
        except (EOFError, ConnectionError):
            pass
        c.close()
        assert chaos.connections[-1].wait_closed(TIMEOUT)
        forwarded = chaos.packets(rule.direction, conn=n)
        assert len(forwarded) == rule.nth - 1 + rule.forward, (seed, rule.describe())
        assert any(e.kind == "cut" and e.conn == n for e in chaos.events)
    assert len(chosen) > 1  # the seeds do not all make the same choice


def test_rules_apply_to_the_next_connection_not_an_open_one(chaos):
    old = Raw(chaos.address)
    old.connect("old")
    chaos.cut_at_packet("PINGRESP", 1, B2C)
    assert old.ping() < 1.0  # the open connection is unaffected
    new = Raw(chaos.address)
    new.connect("new")
    new.send(Packet(PINGREQ))
    with pytest.raises(EOFError):
        new.recv()
    assert old.ping() < 1.0
    old.close()
    new.close()
    chaos.clear_rules()
    third = Raw(chaos.address)
    third.connect("third")
    assert third.ping() < 1.0
    third.close()


def test_broker_down_or_refused_closes_the_client_at_once(broker):
    with ChaosProxy(("127.0.0.1", free_port())) as proxy:  # nothing listens there
        c = Raw(proxy.address)
        assert c.recv_all(timeout=TIMEOUT) == b""
        c.close()
        assert [e.kind for e in proxy.events][:2] == ["accepted", "upstream_failed"]
    with ChaosProxy(broker.address) as proxy:
        proxy.refuse_connections(1)
        c = Raw(proxy.address)
        assert c.recv_all(timeout=TIMEOUT) == b""
        c.close()
        c = Raw(proxy.address)
        c.connect("second-try")
        c.close()


def test_non_mqtt_bytes_are_reported_and_passed_through(chaos):
    c = Raw(chaos.address)
    c.sock.sendall(b"\x00\x01garbage")
    assert c.recv_all() == b""  # mosquitto hangs up on it
    c.close()
    errs = [e for e in chaos.events if e.kind == "framing_error"]
    assert len(errs) == 1 and errs[0].detail["direction"] == C2B and errs[0].detail["offset"] == 0


# ---------------------------------------------------------------- stalls, latency, bandwidth

def test_stall_delays_delivery_by_the_stall_duration(chaos):
    c = Raw(chaos.address)
    c.connect("stall")
    assert c.ping() < 0.5
    assert chaos.stall(1.0) == 1
    took = c.ping()
    assert 0.9 <= took < 3.0
    assert not chaos.connections[0].closed.is_set()  # held, not cut
    assert c.ping() < 0.5
    c.close()


def test_stall_at_a_packet_holds_it(chaos):
    chaos.stall_at_packet("SUBACK", 1, B2C, 0.6)
    c = Raw(chaos.address)
    c.connect("stall-rule")
    t0 = time.monotonic()
    c.send(Packet(SUBSCRIBE, pid=1, topics=[("s/t", 0)]))
    assert c.recv().type == SUBACK
    assert 0.55 <= time.monotonic() - t0 < 2.5
    assert c.ping() < 0.5
    c.close()


def test_stall_after_bytes_holds_what_follows(chaos):
    chaos.stall_after_bytes(4, B2C, 0.6)  # CONNACK is 4 bytes
    c = Raw(chaos.address)
    t0 = time.monotonic()
    c.connect("stall-bytes")
    assert time.monotonic() - t0 < 0.4
    c.send(Packet(SUBSCRIBE, pid=1, topics=[("s/t", 0)]))
    assert c.recv().type == SUBACK
    assert 0.5 <= time.monotonic() - t0 < 2.5
    c.close()


def test_latency_jitter_is_seeded(broker):
    def session(seed):
        with ChaosProxy(broker.address, seed=seed) as proxy:
            proxy.latency(0.01, C2B, jitter=0.05)
            c = Raw(proxy.address)
            c.connect("jitter")
            times = [c.ping() for _ in range(3)]
            state = proxy.connections[0].rng[C2B].getstate()  # after 4 draws
            c.close()
            return times, state

    times, a = session(5)
    assert all(0.01 <= t < 1.0 for t in times)
    assert session(5)[1] == a
    assert session(6)[1] != a


def test_cut_with_reset_sends_rst(chaos):
    chaos.cut_at_packet("CONNACK", 1, B2C, reset=True)
    s = socket.create_connection(chaos.address, timeout=TIMEOUT)
    s.sendall(encode(Packet(CONNECT, client_id="rst")))
    with pytest.raises(ConnectionResetError):
        s.recv(100)
    s.close()


def test_stall_makes_a_clients_keepalive_time_out(chaos):
    c = paho("keepalive")
    paho_connect(c, chaos.address, keepalive=1)
    t0 = time.monotonic()
    chaos.stall(4.0)
    assert c.disconnected.wait(4.0)
    took = c.disconnected_at - t0
    c.loop_stop()
    assert 0.9 <= took < 3.5, took
    assert c.disconnect_rc.is_failure
    # paho gave up on its own: the proxy kept both sockets open throughout.
    conn = chaos.connections[0]
    assert not any(e.kind == "cut" for e in chaos.events)
    assert not conn.closed.is_set() or conn.close_reason == "client closed"


def test_latency_adds_the_delay_to_each_round_trip_and_pipelines(chaos):
    c = Raw(chaos.address)
    c.connect("latency")
    assert c.ping() < 0.3
    chaos.latency(0.15)
    assert 0.3 <= c.ping() < 1.0
    t0 = time.monotonic()
    c.send(*[Packet(PINGREQ)] * 5)
    assert [c.recv().type for _ in range(5)] == [PINGRESP] * 5
    assert 0.3 <= time.monotonic() - t0 < 1.0  # pipelined, not 5 x 0.3
    chaos.latency(0.15, C2B)
    chaos.latency(0, B2C)
    assert 0.15 <= c.ping() < 0.6
    chaos.latency(0)
    assert c.ping() < 0.3
    c.close()


def test_packets_read_after_the_latency_is_lifted_never_overtake_those_it_still_holds(chaos):
    # With nothing to hold them back packets leave from the reading thread at once; while the writer
    # still holds earlier ones they queue behind them.
    c = Raw(chaos.address)
    c.connect("order")
    chaos.latency(0.3, C2B)
    c.send(*[Packet(PUBLISH, topic="o/t", payload=b"x", qos=1, pid=i) for i in range(1, 6)])
    assert chaos.wait_for(lambda: chaos.connections[0].bytes_in[C2B] > 0 and
                          len(chaos.connections[0].queues[C2B]) == 5, TIMEOUT)
    chaos.latency(0)
    c.send(*[Packet(PUBLISH, topic="o/t", payload=b"x", qos=1, pid=i) for i in range(6, 11)])
    assert [c.recv().pid for _ in range(10)] == list(range(1, 11))
    assert [r.pid for r in chaos.packets(C2B, type="PUBLISH")] == list(range(1, 11))
    c.close()


def test_bandwidth_limit_slows_a_100kb_transfer_to_the_rate(chaos):
    c = Raw(chaos.address)
    c.connect("bandwidth")
    payload = b"z" * 100_000

    def publish(pid):
        t0 = time.monotonic()
        c.send(Packet(PUBLISH, topic="bw/t", payload=payload, qos=1, pid=pid))
        assert c.recv(timeout=10).pid == pid
        return time.monotonic() - t0

    assert publish(1) < 0.5
    chaos.bandwidth(100_000, C2B)
    took = publish(2)
    assert 0.85 <= took < 2.5, took
    chaos.bandwidth(None)
    assert publish(3) < 0.5
    c.close()


# ---------------------------------------------------------------- bad input

def test_bad_rules_are_refused_with_a_clear_error(chaos):
    with pytest.raises(ValueError, match="direction must be one of"):
        chaos.cut_after_bytes(5, "up")
    with pytest.raises(ValueError, match="nth must be an int >= 1"):
        chaos.cut_at_packet("PUBACK", 0, B2C)
    with pytest.raises(ValueError, match="packet type must be"):
        chaos.cut_at_packet("PUBACKK", 1, B2C)
    with pytest.raises(ValueError, match="packet type must be"):
        chaos.cut_at_packet(16, 1, B2C)
    with pytest.raises(ValueError, match="n must be an int >= 0"):
        chaos.cut_after_bytes(-1, C2B)
    with pytest.raises(ValueError, match="bandwidth must be"):
        chaos.bandwidth(0)
    with pytest.raises(ValueError, match="latency must be"):
        chaos.latency(-0.1)
    with pytest.raises(ValueError, match="stall must be"):
        chaos.stall(float("nan"))
    with pytest.raises(ValueError, match="connections must be"):
        chaos.cut_at_packet(PUBACK, 1, B2C, connections=0)
    with pytest.raises(ValueError, match="upstream must be"):
        ChaosProxy("127.0.0.1:1883")
    assert chaos.rules == []
    assert isinstance(chaos.cut_at_packet(DISCONNECT, 1, C2B), Rule)


# ---------------------------------------------------------------- a client that vanishes

def _will_watcher(broker, topic):
    w = paho("will-watch-" + topic.replace("/", "-"))
    paho_connect(w, broker.address)
    w.subscribe(topic, 1)
    assert w.subacks.get(timeout=TIMEOUT)
    return w


def _gone(chaos, broker, client_id, vanish, disconnect=False, wait=4.0):
    """A client connects through the proxy (keepalive 1 s, a will) and drops its socket; the time the
    broker took to publish the will (None: not within `wait` s)."""
    w = _will_watcher(broker, "gone/" + client_id)
    chaos.client_vanishes(vanish)
    c = Raw(chaos.address)
    c.connect(client_id, keepalive=1, will_topic="gone/" + client_id, will_payload=b"lost", will_qos=1)
    if disconnect:
        c.send(Packet(DISCONNECT))
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    t0 = time.monotonic()
    c.close()  # RST, as a process killed with unread data sends (a power cut of an emulated board)
    try:
        w.messages.get(timeout=wait)
        took = time.monotonic() - t0
    except queue.Empty:
        took = None
    w.loop_stop()
    w.disconnect()
    return took


def test_by_default_a_dropped_client_is_closed_on_the_broker_at_once(chaos, broker):
    took = _gone(chaos, broker, "plain", vanish=False)
    assert took is not None and took < 0.5, took
    assert chaos.connections[-1].close_reason == "client read failed: [Errno 104] Connection reset by peer"


def test_a_vanished_client_leaves_the_broker_side_half_open_until_its_keepalive(chaos, broker):
    took = _gone(chaos, broker, "vanish", vanish=True, wait=9.0)
    # mosquitto gives up after 1.5 x keepalive of silence (2.0.11 looks every 5 s or so), not at the drop
    assert took is not None and 1.4 <= took < 8.5, took
    conn = chaos.connections[-1]
    assert conn.vanished and conn.wait_closed(TIMEOUT) and conn.close_reason == "broker closed"
    assert [e.kind for e in chaos.events if e.conn == conn.id][-2:] == ["vanished", "closed"]


def test_a_vanished_client_that_reconnects_takes_its_session_over(chaos, broker):
    chaos.client_vanishes()
    old = Raw(chaos.address)
    old.connect("takeover", clean=False, keepalive=60)
    old.close()
    assert chaos.wait_for(lambda: chaos.connections[0].vanished, TIMEOUT)
    time.sleep(0.3)
    assert not chaos.connections[0].closed.is_set()  # the broker still holds the old connection
    new = Raw(chaos.address)
    assert new.connect("takeover", clean=False, keepalive=60).session_present
    assert chaos.connections[0].wait_closed(TIMEOUT)  # mosquitto dropped it for the new one
    assert chaos.connections[0].close_reason == "broker closed"
    new.close()


def test_a_client_that_disconnects_cleanly_does_not_vanish(chaos, broker):
    assert _gone(chaos, broker, "clean", vanish=True, disconnect=True, wait=1.0) is None  # DISCONNECT: no will
    conn = chaos.connections[-1]
    assert conn.wait_closed(TIMEOUT) and not conn.vanished
