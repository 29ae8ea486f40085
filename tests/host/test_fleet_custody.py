"""Socket custody (ternlab.fleet.custody) against a real Mosquitto: a client process's connection that
the fleet holds outlives the process, as a powered-off board's does, and a cut ends it for both sides.

The broker's will message tells what it saw: it is published at once when a connection closes without
DISCONNECT, and only after keepalive x 1.5 when the client just goes silent."""

import contextlib
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


@contextlib.contextmanager
def _watched(broker, cid):
    """A client process `cid` with a will, and a watcher of the wills; both ended after."""
    wills = Wills(broker)
    p = None
    try:
        p = _child(broker, cid)
        yield wills, p
    finally:
        if p is not None:
            p.kill()
        wills.close()


def _kill(p, held=None):
    """Power cut: SIGKILL; with custody, it is told the process is gone (it drains from now on)."""
    p.send_signal(signal.SIGKILL)
    p.wait()
    if held is not None:
        held.sync("b", None)


def _released(held, seconds=3.0):
    """Whether custody let go of everything within seconds (the broker closed its side)."""
    end = time.monotonic() + seconds
    while held.held("b") and time.monotonic() < end:
        time.sleep(0.02)
    return held.held("b") == 0


@pytest.fixture
def held(broker):
    k = custody.SocketCustody(broker.address)
    yield k
    k.close()


def test_without_custody_a_killed_client_is_gone_at_once(broker):
    """The control: what the host kernel does to a dead process's socket (FIN: the will at once)."""
    with _watched(broker, "plain") as (wills, p):
        _kill(p)
        assert wills.wait("will/plain", 1.5) is not None


def test_a_held_connection_outlives_its_killed_process_until_the_keepalive(broker, held):
    with _watched(broker, "vanish") as (wills, p):
        held.sync("b", p.pid)
        assert held.held("b") == 1
        killed = time.monotonic()
        _kill(p, held)
        assert held.held("b") == 1  # still open, drained
        at = wills.wait("will/vanish", 6)
        assert at is not None, "the broker never gave up on the silent connection"
        assert at - killed >= KEEPALIVE, f"the broker knew after {at - killed:.2f} s: the connection was closed"
        assert _released(held)  # the broker closed it: custody lets go


def test_a_takeover_ends_a_held_connection(broker, held):
    p = _child(broker, "again")
    try:
        held.sync("b", p.pid)
        _kill(p, held)
        nxt = Client("again", server=broker.host, port=broker.port, keepalive=KEEPALIVE)
        nxt.connect()  # the next boot: the broker closes the old connection
        assert _released(held)
        nxt.disconnect()
    finally:
        p.kill()


def test_a_cut_ends_the_connection_for_both_sides(broker, held):
    with _watched(broker, "cut") as (wills, p):
        held.sync("b", p.pid)
        cut = time.monotonic()
        assert held.cut("b", p.pid) == 1
        assert p.stdout.readline().startswith("lost")  # the client's side ended
        at = wills.wait("will/cut", 1.5)
        assert at is not None and at - cut < 1.5  # and the broker's, at once
        assert held.held("b") == 0


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
