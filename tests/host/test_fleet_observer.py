"""The fleet's observer: a process of its own at idle CPU priority, against a real Mosquitto."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tern.client import Client
from ternlab.fleet.observer import Observer
from ternlab.pipeline.schema import make_payload


def _wait(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _gone(pid) -> bool:
    """Exited (a zombie nobody reaped counts: it runs no more)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(ln.split()[1:2] == ["Z"] for ln in f if ln.startswith("State:"))
    except FileNotFoundError:
        return True


def test_the_observer_records_every_copy_from_an_idle_process_of_its_own(broker, tmp_path):
    obs = Observer("obs-1", broker.host, broker.port, tmp_path / "o" / "copies.jsonl", tmp_path / "o" / "obs.log")
    obs.start("tern/+/telemetry")
    try:
        assert obs.proc.pid != os.getpid()
        if hasattr(os, "SCHED_IDLE"):
            # it must never take a core from the boards, broker or collectors whose latency the demo reports
            assert os.sched_getscheduler(obs.proc.pid) == os.SCHED_IDLE
        pub = Client("obs-pub", server=broker.host, port=broker.port)
        pub.connect()
        sent = [(seq, q) for seq in range(4) for q in (0, 1, 2)]
        for seq, q in sent:
            pub.wait_published(pub.publish("tern/dev-1/telemetry", make_payload("dev-1", 3, seq, q, time.time(), {"x": 1}),
                                           qos=q), timeout=5)
        pub.publish("tern/dev-1/telemetry", b"not json", qos=1)
        pub.disconnect()
        assert _wait(lambda: obs.refresh() or obs.received("dev-1") == len(sent)), obs.copies()
        rows = obs.copies()
        assert sorted((r[3], r[2]) for r in rows) == sorted(sent)  # copies: (device, boot, qos, seq, topic, ts)
        assert all(r[:2] == ("dev-1", 3) and r[4] == "tern/dev-1/telemetry" and r[5] > 0 for r in rows)
        assert obs.has(("dev-1", 3, 2, 2)) and not obs.has(("dev-1", 3, 2, 9))
        assert _wait(lambda: "not a telemetry payload on tern/dev-1/telemetry" in obs.log.read_text())
    finally:
        trouble = obs.stop()
    assert trouble is None and obs.proc.returncode == 0, obs.log.read_text()  # SIGTERM: it read, disconnected, exited


def test_a_copy_that_arrives_just_before_sigterm_is_read(broker, tmp_path):
    obs = Observer("obs-2", broker.host, broker.port, tmp_path / "copies.jsonl", tmp_path / "obs.log")
    obs.start("tern/+/telemetry")
    pub = Client("obs-pub2", server=broker.host, port=broker.port)
    pub.connect()
    pub.wait_published(pub.publish("tern/d/telemetry", make_payload("d", 0, 0, 2, time.time(), {}), qos=2), timeout=5)
    pub.disconnect()
    time.sleep(0.01)  # delivered, most likely not yet flushed (every 50 ms)
    assert obs.stop() is None
    assert obs.received("d") == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_observer_ends_by_itself_when_the_fleet_process_dies(broker, tmp_path):
    code = ("import sys, time; from ternlab.fleet.observer import Observer; from pathlib import Path; "
            f"o = Observer('obs-3', {broker.host!r}, {broker.port}, Path({str(tmp_path / 'c.jsonl')!r}), "
            f"Path({str(tmp_path / 'o.log')!r})); o.start('tern/+/telemetry'); print(o.proc.pid, flush=True); "
            "time.sleep(60)")
    fleet = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(fleet.stdout.readline())
        assert not _gone(pid)
        fleet.send_signal(signal.SIGKILL)  # no stop(), no SIGTERM: only the parent's death tells it
        fleet.wait()
        assert _wait(lambda: _gone(pid), timeout=5), "the observer outlived the fleet that started it"
    finally:
        fleet.kill()
        fleet.wait()


def test_an_observer_that_died_is_said_not_taken_for_losses(broker, tmp_path):
    obs = Observer("obs-4", broker.host, broker.port, tmp_path / "copies.jsonl", tmp_path / "obs.log")
    obs.start("tern/+/telemetry")
    obs.proc.send_signal(signal.SIGKILL)
    obs.proc.wait()
    trouble = obs.stop()
    assert trouble and "status -9" in trouble, trouble


def test_after_a_broker_restart_the_observer_subscribes_again_when_told(tmp_path):
    """Its subscription is shared (served after the collectors'), and Mosquitto forgets a persistent
    session's shared subscriptions across a restart: without subscribe_again() nothing more arrives."""
    from ternlab.brokers.mosquitto import Broker

    broker = Broker(tmp_path / "broker", persistence=True).start()
    obs = Observer("obs-5", broker.host, broker.port, tmp_path / "copies.jsonl", tmp_path / "obs.log")
    obs.start("tern/+/telemetry")
    seq = iter(range(100))

    def publish():
        pub = Client("obs-pub5", server=broker.host, port=broker.port)
        pub.connect()
        pub.wait_published(pub.publish("tern/d5/telemetry", make_payload("d5", 0, next(seq), 1, time.time(), {}),
                                       qos=1), timeout=5)
        pub.disconnect()

    try:
        publish()
        assert _wait(lambda: obs.refresh() or obs.received("d5") == 1)
        broker.restart()
        time.sleep(1.0)  # the observer has reconnected (backoff at most 0.5 s)
        publish()  # goes to nobody: the restarted broker forgot the shared subscription
        assert not _wait(lambda: obs.refresh() or obs.received("d5") > 1, 1.0), obs.copies()
        assert obs.subscribe_again(), obs.log.read_text()
        publish()
        assert _wait(lambda: obs.refresh() or obs.received("d5") == 2), obs.copies()
        assert sorted(r[3] for r in obs.copies()) == [0, 2]
    finally:
        trouble = obs.stop()
        broker.stop()
    assert trouble is None, trouble
