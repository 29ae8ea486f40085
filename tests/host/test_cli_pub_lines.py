"""`tern pub -l` as a real process against a real Mosquitto, mosquitto_sub the peer: every line once
and in order at each QoS (stdin read in chunks, lines cut across them), and acknowledgements read as
they come while stdin stays open (issue 40: at a light rate they were read only after 100 ms
without input, so a QoS 1/2 stream fed faster than that stalled once the window was full)."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ternlab.brokers.chaos import B2C, C2B
from ternlab.brokers.mosquitto import Broker

TERN = str(Path(sys.executable).with_name("tern"))
MOSQ_SUB = "/usr/bin/mosquitto_sub"


def _sub(broker, topic, qos, count, out=subprocess.PIPE, timeout=60):
    """mosquitto_sub, subscribed; its output to `out` (a file, when it is more than a pipe holds:
    a subscriber that cannot write would fall behind, and Mosquitto drop what it queues for it)."""
    cid = "lsub-%s" % topic.replace("/", "-")
    p = subprocess.Popen([MOSQ_SUB, "-h", broker.host, "-p", str(broker.port), "-i", cid, "-t", topic,
                          "-q", str(qos), "-C", str(count), "-W", str(timeout)],
                         stdout=out, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while "Sending SUBACK to " + cid not in broker.log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline and p.poll() is None, "mosquitto_sub never subscribed"
        time.sleep(0.02)
    return p


def _pub(broker, topic, qos, *more):
    return subprocess.Popen([TERN, "pub", "-h", broker.host, "-p", str(broker.port), "-t", topic,
                             "-q", str(qos), "-l", *more], stdin=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture
def roomy(tmp_path):
    """A Mosquitto that queues without limit for a subscriber behind (by default it keeps 1,000
    QoS 1/2 messages and drops the rest: a loaded machine's mosquitto_sub falls that far behind)."""
    with Broker(tmp_path / "broker", max_queued_messages=0) as b:
        yield b


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_every_line_once_and_in_order(roomy, qos, tmp_path):
    # 3,000 lines of 0..299 bytes (about 450 KiB: more than one 256 KiB read of stdin, so lines are
    # cut between reads; lengths on both sides of 127, where a packet's header grows a byte)
    n = 3000
    lines = [b"%d-%04d-" % (qos, i) + b"y" * (i % 293) for i in range(n)]
    with open(tmp_path / "got", "wb") as f:
        sub = _sub(roomy, "lines/%d" % qos, max(qos, 1), n, f)
    pub = _pub(roomy, "lines/%d" % qos, qos)
    _, err = pub.communicate(b"\n".join(lines) + b"\n", timeout=60)
    assert pub.returncode == 0, err.decode()
    _, err = sub.communicate(timeout=60)
    assert sub.returncode == 0, err.decode()
    assert (tmp_path / "got").read_bytes().split(b"\n")[:-1] == lines


def test_acknowledgements_are_read_while_lines_keep_coming(broker):
    """QoS 2, a line every 20 ms on a pipe that stays open: each message is released (PUBREC read,
    PUBREL sent) and reaches the subscriber while the input goes on. Before, the PUBRECs were read
    only after 100 ms without input or with the outbox full (256): past the window of 16 nothing
    more left, and the subscriber had none of them (Mosquitto delivers a QoS 2 message at its
    PUBREL) until the input paused."""
    n = 60
    sub = _sub(broker, "light", 2, n)
    pub = _pub(broker, "light", 2)
    got = []

    def read():
        for line in sub.stdout:
            got.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        for i in range(200):  # (fewer than the outbox holds: a full outbox would read them)
            pub.stdin.write(b"m%03d\n" % i)
            pub.stdin.flush()
            if len(got) >= n:
                break
            time.sleep(0.02)
        # the pipe is still open and lines still came every 20 ms: the first n arrived meanwhile
        assert pub.poll() is None
        assert got == [b"m%03d\n" % i for i in range(n)], "%d of %d arrived while stdin was open" % (len(got), n)
        assert i < n + 100, i  # (a generous bound: within about 2 s of the n-th line)
    finally:
        pub.stdin.close()
        assert pub.wait(timeout=20) == 0, pub.stderr.read().decode()
        sub.wait(timeout=20)
        reader.join(5)


@pytest.mark.parametrize("more,inflight", [((), 20), (("-M", "3"), 3), (("-M", "0"), 50)])
def test_max_inflight(chaos, more, inflight):
    """-M as mosquitto_pub's: at most that many QoS 1 messages unacknowledged (20 by default; 0: no
    limit); here no PUBACK comes back, and the 50 lines wait in the outbox past the window."""
    chaos.stall_at_packet("PUBACK", 1, B2C, 60, stall_direction=B2C, connections=1)
    p = _pub(chaos, "window", 1, *more)
    try:
        p.stdin.write(b"".join(b"w%d\n" % i for i in range(50)))
        p.stdin.flush()
        assert chaos.wait_for(lambda: len(chaos.packets(C2B, "PUBLISH")) == inflight, 10)
        time.sleep(0.5)  # and no more
        assert len(chaos.packets(C2B, "PUBLISH")) == inflight
    finally:
        p.kill()
        p.wait(10)
