"""Retiring a collector: `tern collect --retire --id X` against a real Mosquitto. Two collectors share
one subscription; one is stopped while messages flow, so the broker queues its share for its session;
retiring it lands that queue, stops the broker from giving it a share, ends the session -- nothing is
lost across the landing set, and the broker holds no session for the retired id afterwards."""

import time
from collections import Counter

import pytest

from devices.collecting import publish_all, read_rows, start_collector
from tern.client import Client
from ternlab.pipeline import schema


def wave(first, n):
    """n messages from dev-r, seq first.., QoS 1 and 2 alternating."""
    return [("tern/dev-r/telemetry",
             schema.make_payload("dev-r", 1, s, 1 + s % 2, 1700000000.0 + s, {"temp": 1.0 * s}), 1 + s % 2)
            for s in range(first, first + n)]


def publish(broker, msgs):
    publish_all(broker, msgs, "pub-r")


def seqs(land):
    return Counter(r["seq"] for r in read_rows(land))


def wait_landed(land, n, timeout=20):
    deadline = time.monotonic() + timeout
    while sum(seqs(land).values()) < n:
        assert time.monotonic() < deadline, f"landed {sum(seqs(land).values())} of {n}"
        time.sleep(0.05)


@pytest.mark.parametrize("version", ["5", "311"])
def test_retiring_a_stopped_collector_lands_its_queue_and_ends_its_session(broker, tmp_path, version):
    land = tmp_path / "landing"
    opts = ("-V", version, "--batch-size", "20", "--batch-time", "0.2")
    c1 = start_collector(broker, land, "c1", *opts)
    c2 = start_collector(broker, land, "c2", *opts)
    retire = None
    try:
        for c in (c1, c2):
            c.wait_for("subscribed to")
        publish(broker, wave(0, 40))
        wait_landed(land, 40)
        assert c1.terminate() == 0  # its session stays: the broker goes on giving it a share, queued
        before = {r["seq"] for r in read_rows(land) if r["collector"] == "c1"}
        publish(broker, wave(40, 120))

        retire = start_collector(broker, land, "c1", "--retire", "--drain-idle", "0.5", *opts)
        retire.wait_for(r"retiring: unsubscribed from \$share/tern/tern/\+/telemetry .*session present: 1")
        publish(broker, wave(160, 40))  # after the UNSUBACK: all of it goes to c2
        assert retire.proc.wait(20) == 0, retire.lines[-10:]
        retire.terminate()
        retire.wait_for(r"retired: the session ended at the broker")
        s = retire.summary()
        drained = {r["seq"] for r in read_rows(land) if r["collector"] == "c1"} - before
        assert s["landed"] == s["acked"] == len(drained) > 0, retire.lines  # its queued share
        assert all(40 <= q < 160 for q in drained)  # published while it was stopped
        wait_landed(land, 200)
        time.sleep(0.3)
    finally:
        rc2 = c2.terminate()
        for c in (c1, retire):
            if c is not None and c.proc.poll() is None:
                c.kill()
    assert rc2 == 0
    got = seqs(land)
    want = Counter(range(200))
    assert got == want, f"lost {set(want) - set(got)}, twice {+(got - want)}"
    late = [r["collector"] for r in read_rows(land) if r["seq"] >= 160]
    assert set(late) == {"c2"}  # the retired collector had left the shared subscription

    # the broker keeps no session for c1: a persistent connect finds none (and leaves none: expiry 0)
    probe = Client("c1", server=broker.host, port=broker.port, version=5 if version == "5" else 4,
                   clean=False)
    assert probe.connect() is False
    probe.disconnect()
