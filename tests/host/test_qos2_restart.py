"""Why a QoS 2 reading reached the subscriber twice around a broker restart, one candidate per test,
each against a real Mosquitto 2.x (persistence on, graceful restarts) with paho-mqtt as the reference
subscriber and the chaos proxy where a connection must die at a chosen packet.

The cause: the blocking client's publish() raised the socket's error (EPIPE after the broker or the
proxy had closed the connection) for a QoS 1/2 message it had already stored and queued. The firmware,
like any caller, takes an exception as "not accepted" and gives the next reading the same sequence
number; the stored message then went out after the reconnect: two messages with one (boot, seq).
The tests below that pass without the fix show where the duplicate does NOT come from: Mosquitto keeps
an incoming QoS 2 message it has PUBREC'd across a graceful restart, Tern resends PUBREL (not the
PUBLISH) for a message whose PUBREC it had, and a Tern subscriber whose session survives (session
present = 1 after the restart) answers the broker's redelivery without delivering it again.
"""

import collections
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from rawmqtt import Raw
from tern.codec import Packet
from tern.client import Client
from tern.wire import PUBCOMP, PUBLISH, PUBREC, PUBREL
from ternlab.brokers.mosquitto import Broker
from ternlab.brokers.chaos import B2C, C2B, ChaosProxy
from ternlab.pytest_plugin import attach

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "lib"


@pytest.fixture
def pbroker(request, tmp_path):
    """Mosquitto with persistence, as in the firmware's fault test; its log is attached on failure."""
    b = Broker(tmp_path / "broker", persistence=True)
    attach(request, "mosquitto log", lambda: b.log_path.read_text(errors="replace") if b.log_path.exists() else "")
    b.start()
    yield b
    b.stop()


class PahoInbox:
    """paho-mqtt as the reference subscriber: a persistent session (MQTT 3.1.1, clean session off) made
    before the scenario and read after it. Whatever the broker queued for it arrives as a first delivery,
    so a repeat it shows is a second message in the broker, not a redelivery a subscriber failed to
    recognise."""

    def __init__(self, broker, cid, flt):
        self.broker, self.cid = broker, cid
        done = threading.Event()
        c = self._client()
        c.on_subscribe = lambda *a: done.set()
        c.connect(broker.host, broker.port)
        c.loop_start()
        c.subscribe(flt, 2)
        assert done.wait(5), "paho got no SUBACK"
        c.disconnect()
        c.loop_stop()

    def _client(self):
        return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.cid, clean_session=False,
                           protocol=mqtt.MQTTv311)

    def collect(self, want, quiet=0.4, timeout=10):
        """Payloads received until at least `want` arrived and nothing more came for `quiet` seconds."""
        got = []
        c = self._client()
        c.on_message = lambda cl, ud, m: got.append(bytes(m.payload))
        c.connect(self.broker.host, self.broker.port)
        c.loop_start()
        try:
            deadline = time.monotonic() + timeout
            n, last = -1, time.monotonic()
            while time.monotonic() < deadline:
                if len(got) != n:
                    n, last = len(got), time.monotonic()
                elif n >= want and time.monotonic() - last >= quiet:
                    break
                time.sleep(0.02)
        finally:
            c.disconnect()
            c.loop_stop()
        return got


def once_each(got, accepted, what):
    counts = collections.Counter(got)
    twice = {p: k for p, k in counts.items() if k > 1}
    assert not twice, f"{what}: QoS 2 messages delivered more than once {twice} (accepted: {accepted})"
    assert sorted(counts) == sorted(accepted), f"{what}: received {sorted(counts)}, accepted {sorted(accepted)}"


# ------------------------------------------------------------------- the cause: publish() on a dead socket

# The firmware's rule for a reading (firmware/app/telemetry.py): an accepted publish uses up the sequence
# number, an exception means "not accepted" and the next reading takes the same number. One file, run by
# CPython and by the MicroPython unix port; the host steps it with a line on stdin.
APP = r"""
import sys, json, time
from tern.client import Client
c = Client("a-pub", server="127.0.0.1", port=int(sys.argv[1]), version=5, clean=False, session_expiry=3600,
           backoff_min=0.02, backoff_max=0.1)
c.connect()
seq = 0
ledger = []
raised = []

def reading():
    global seq
    try:
        c.publish("q2/a", b"%d" % seq, qos=2)
    except OSError as e:
        raised.append([seq, str(e)])
        return
    ledger.append(seq)
    seq += 1

def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")

for _ in range(4):
    reading()
c.wait_all(5)
say("live")  # the host stops the broker now (gracefully: it closes our connection)
sys.stdin.readline()
for _ in range(4):  # the client has not read the close yet: its writes fail
    reading()
    time.sleep(0.02)
say("dead")  # the host starts the broker again
sys.stdin.readline()
c.wait_all(10)
say({"ledger": ledger, "raised": raised, "pending": c.session.pending()})
c.disconnect()
"""


def _app_cmd(runtime, path, port):
    if runtime == "cpython":
        return [sys.executable, "-u", str(path), str(port)], dict(os.environ, PYTHONPATH=str(LIB))
    exe = Path(sys.executable).with_name("micropython")
    return [str(exe), "-X", "heapsize=2m", str(path), str(port)], dict(os.environ, MICROPYPATH=str(LIB))


@pytest.mark.parametrize("runtime", ["cpython", "micropython"])
def test_publish_on_a_connection_the_broker_closed_is_accepted_and_arrives_once(pbroker, tmp_path, runtime):
    inbox = PahoInbox(pbroker, "a-watch", "q2/a")
    app = tmp_path / "app.py"
    app.write_text(APP)
    cmd, env = _app_cmd(runtime, app, pbroker.port)
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=str(tmp_path))
    try:
        def step(expect):
            line = proc.stdout.readline()
            assert json.loads(line or "null") == expect, f"app said {line!r}; stderr: {proc.stderr.read()}"

        step("live")
        pbroker.stop()  # graceful: persistence saved, every connection closed
        proc.stdin.write("\n")
        proc.stdin.flush()
        step("dead")
        pbroker.start()
        out, err = proc.communicate("\n", timeout=30)
        assert proc.returncode == 0, err
        res = json.loads(out.strip().splitlines()[-1])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    got = inbox.collect(len(res["ledger"]))
    assert not res["raised"], (
        f"publish() raised {res['raised']} for QoS 2 messages it had stored; they went out after the "
        f"reconnect anyway, so the app's retried sequence numbers arrived as {sorted(got)}")
    assert res["pending"] == []
    assert res["ledger"] == list(range(8))
    once_each(got, [b"%d" % s for s in res["ledger"]], runtime)


# --------------------------------------------------------------------- not the cause: the publisher's flow


def test_mosquitto_keeps_an_incoming_qos2_message_across_a_graceful_restart(pbroker):
    """A raw MQTT 3.1.1 publisher: PUBLISH (QoS 2, id 7), PUBREC, then the broker restarts before the
    PUBREL. Mosquitto persisted its half of the flow: session present = 1, the resent PUBLISH (DUP) is
    recognised, and the message is released once, at the PUBREL. The same PUBLISH sent again after
    PUBCOMP is a new message (the protocol says so): a publisher must resend PUBREL, never the PUBLISH,
    once it has the PUBREC."""
    inbox = PahoInbox(pbroker, "b-watch", "q2/b")
    pub = Packet(PUBLISH, topic="q2/b", payload=b"held", qos=2, pid=7)
    r = Raw(pbroker.address)
    r.connect("b-raw", clean=False)
    r.send(pub)
    p = r.recv()
    assert (p.type, p.pid) == (PUBREC, 7), p
    r.close()
    pbroker.restart()
    r = Raw(pbroker.address)
    assert r.connect("b-raw", clean=False).session_present, "Mosquitto lost the publisher's session"
    r.send(Packet(PUBLISH, topic="q2/b", payload=b"held", qos=2, pid=7, dup=True))
    p = r.recv()
    assert (p.type, p.pid) == (PUBREC, 7), p
    r.send(Packet(PUBREL, pid=7))
    p = r.recv()
    assert (p.type, p.pid) == (PUBCOMP, 7), p
    assert inbox.collect(1) == [b"held"], "the message held across the restart was not released exactly once"
    # contrast: the PUBLISH again after its flow completed is a second message
    r.send(Packet(PUBLISH, topic="q2/b", payload=b"held", qos=2, pid=7, dup=True))
    assert r.recv().type == PUBREC
    r.send(Packet(PUBREL, pid=7))
    assert r.recv().type == PUBCOMP
    r.close()
    assert inbox.collect(1) == [b"held"]


def test_tern_resends_pubrel_not_the_publish_after_a_restart(pbroker):
    """The Tern publisher has the PUBREC; its PUBREL dies with the connection (the proxy drops it and
    cuts), the broker restarts, and the reconnect carries PUBREL for that id, not the PUBLISH."""
    inbox = PahoInbox(pbroker, "c-watch", "q2/c")
    with ChaosProxy(pbroker.address) as proxy:
        proxy.cut_at_packet("PUBREL", 1, C2B, connections=1)
        sp = []
        c = Client("c-pub", server=proxy.address[0], port=proxy.address[1], version=5, clean=False,
                   session_expiry=3600, backoff_min=0.02, backoff_max=0.1)
        c.on_connect = lambda present, rc: sp.append(present)
        c.connect()
        c.reconnect = False  # stay down until the broker has restarted
        pid = c.publish("q2/c", b"rel", qos=2)
        t = time.monotonic()
        while c.loop(20) and time.monotonic() - t < 5:
            pass
        assert c.session.pending() == [pid] and proxy.packets(B2C, PUBREC), "the proxy did not cut at the PUBREL"
        pbroker.restart()
        c.reconnect = True
        c.wait_all(10)
        c.disconnect()
        again = [(r.type, r.pid) for r in proxy.packets(C2B, conn=2) if r.pid == pid]
    assert sp == [False, True], f"session present on each CONNACK: {sp}"
    assert again == [("PUBREL", pid)], f"after the restart the client sent {again} for message {pid}"
    assert inbox.collect(1) == [b"rel"]


# -------------------------------------------------------------------- not the cause: the subscriber's side


@pytest.mark.parametrize("lost", ["PUBREC", "PUBREL"])
def test_tern_subscriber_delivers_once_when_the_broker_restarts_mid_flow(pbroker, lost):
    """A Tern subscriber (persistent session, MemoryStore) gets a QoS 2 message; the flow is cut at the
    subscriber's PUBREC (the broker then redelivers the PUBLISH, DUP, after the restart) or at the
    broker's PUBREL (the broker then resends PUBREL). The session is present after the restart, the
    packet id recorded before delivery is still known, and the message is delivered once."""
    with ChaosProxy(pbroker.address) as proxy:
        proxy.cut_at_packet(lost, 1, C2B if lost == "PUBREC" else B2C, connections=1)
        got, sp = [], []
        s = Client("d-sub", server=proxy.address[0], port=proxy.address[1], version=5, clean=False,
                   session_expiry=3600, backoff_min=0.02, backoff_max=0.1)
        s.on_message = lambda m: got.append(bytes(m.payload))
        s.on_connect = lambda present, rc: sp.append(present)
        s.connect()
        s.subscribe("q2/d", 2)
        s.reconnect = False  # stay down until the broker has restarted
        pub = Client("d-pub", server=pbroker.host, port=pbroker.port, version=5)
        pub.connect()
        pub.wait_published(pub.publish("q2/d", b"once", qos=2))
        pub.disconnect()
        t = time.monotonic()
        while s.loop(20) and time.monotonic() - t < 5:
            pass
        assert got == [b"once"] and not s.connected, f"the proxy did not cut at {lost}: got {got}"
        mid = proxy.packets(B2C, PUBLISH, conn=1)[-1].pid
        pbroker.restart()
        s.reconnect = True
        redo = "PUBLISH" if lost == "PUBREC" else "PUBREL"
        done = lambda: [r for r in proxy.packets(C2B, conn=2) if r.pid == mid and r.type == "PUBCOMP"]
        t = time.monotonic()
        while not done() and time.monotonic() - t < 10:
            s.loop(20)
        s.loop(200)
        s.disconnect()
        b2c = [r.type for r in proxy.packets(B2C, conn=2) if r.pid == mid]
    assert sp == [False, True], f"session present on each CONNACK: {sp}"
    assert redo in b2c, f"the broker did not resend {redo} for {mid} after the restart: {b2c}"
    assert got == [b"once"], f"delivered {len(got)} times"
