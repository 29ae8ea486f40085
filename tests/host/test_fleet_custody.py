"""Socket custody (ternlab.fleet.custody) against a real Mosquitto: a client process's connection that
the fleet holds outlives the process, as a powered-off board's does, and a cut ends it for both sides.

The broker's will message tells what it saw: it is published at once when a connection closes without
DISCONNECT, and only after keepalive x 1.5 when the client just goes silent."""

import signal
import subprocess
import sys
import time

import pytest

from tern.client import Client
from ternlab.fleet import custody

pytestmark = pytest.mark.skipif(not custody.available(),
                                reason="pidfd_getfd is not allowed here (Linux 5.6+, not blocked by seccomp)")

KEEPALIVE = 2  # the broker gives up on a silent client after 3 s

CHILD = """
import sys, time
from tern.client import Client
c = Client(sys.argv[1], server="127.0.0.1", port=int(sys.argv[2]), keepalive=%d,
           will_topic="will/" + sys.argv[1], will_payload=b"gone", reconnect=False)
c.connect()
print("connected", flush=True)
try:
    while c.loop(50) or c.connected:
        pass
except OSError as e:
    print("lost", e, flush=True)
print("lost", flush=True)
time.sleep(30)
""" % KEEPALIVE


class Wills:
    def __init__(self, broker):
        self.got = {}
        self.c = Client("will-watch", server=broker.host, port=broker.port)
        self.c.on_message = lambda m: self.got.setdefault(m.topic, time.monotonic())
        self.c.connect()
        self.c.subscribe("will/#", 1)

    def wait(self, topic, seconds):
        """Monotonic time the will came, or None if it did not within seconds."""
        end = time.monotonic() + seconds
        while topic not in self.got and time.monotonic() < end:
            self.c.loop(20)
        return self.got.get(topic)

    def close(self):
        self.c.disconnect()


def _child(broker, cid):
    p = subprocess.Popen([sys.executable, "-c", CHILD, cid, str(broker.port)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "connected"
    return p


@pytest.fixture
def held(broker):
    k = custody.SocketCustody(broker.address)
    yield k
    k.close()


def test_without_custody_a_killed_client_is_gone_at_once(broker):
    """The control: what the host kernel does to a dead process's socket (FIN: the will at once)."""
    wills = Wills(broker)
    p = _child(broker, "plain")
    try:
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert wills.wait("will/plain", 1.5) is not None
    finally:
        wills.close()


def test_a_held_connection_outlives_its_killed_process_until_the_keepalive(broker, held):
    wills = Wills(broker)
    p = _child(broker, "vanish")
    try:
        held.sync("b", p.pid)
        assert held.held("b") == 1
        killed = time.monotonic()
        p.send_signal(signal.SIGKILL)
        p.wait()
        held.sync("b", None)  # the process is gone: custody drains what the broker still sends
        assert held.held("b") == 1
        at = wills.wait("will/vanish", 6)
        assert at is not None, "the broker never gave up on the silent connection"
        assert at - killed >= KEEPALIVE, f"the broker knew after {at - killed:.2f} s: the connection was closed"
        end = time.monotonic() + 3
        while held.held("b") and time.monotonic() < end:  # the broker closed it: custody lets go
            time.sleep(0.02)
        assert held.held("b") == 0
    finally:
        p.kill()
        wills.close()


def test_a_takeover_ends_a_held_connection(broker, held):
    p = _child(broker, "again")
    try:
        held.sync("b", p.pid)
        p.send_signal(signal.SIGKILL)
        p.wait()
        held.sync("b", None)
        nxt = Client("again", server=broker.host, port=broker.port, keepalive=KEEPALIVE)
        nxt.connect()  # the next boot: the broker closes the old connection
        end = time.monotonic() + 3
        while held.held("b") and time.monotonic() < end:
            time.sleep(0.02)
        assert held.held("b") == 0
        nxt.disconnect()
    finally:
        p.kill()


def test_a_cut_ends_the_connection_for_both_sides(broker, held):
    wills = Wills(broker)
    p = _child(broker, "cut")
    try:
        held.sync("b", p.pid)
        cut = time.monotonic()
        assert held.cut("b", p.pid) == 1
        assert p.stdout.readline().startswith("lost")  # the client's side ended
        at = wills.wait("will/cut", 1.5)
        assert at is not None and at - cut < 1.5  # and the broker's, at once
        assert held.held("b") == 0
    finally:
        p.kill()
        wills.close()


def test_only_connections_to_the_broker_are_taken(broker, held):
    other = "import socket\na, b = socket.socketpair()\n"  # sockets of the process's own, left alone
    p = subprocess.Popen([sys.executable, "-c", other + CHILD, "mixed", str(broker.port)],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "connected"
        held.sync("b", p.pid)
        assert held.held("b") == 1
        held.sync("b", p.pid)  # nothing new, nothing taken twice
        assert held.held("b") == 1
    finally:
        p.kill()
