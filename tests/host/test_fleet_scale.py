"""150 boards for 90 seconds in one runner process, under the faults of the thousand-board scenario
(scenarios/thousand.toml, its windows scaled to the run): every board's relay on one event loop
(ternlab.boards.hub), not a thread each, and the Spark audit of what the collectors landed finds no
accepted reading lost and no QoS 2 reading landed twice -- the same counts as the fleet's own judge.
Slow (minutes, 150 processes): run with `-m slow`."""

import os
import threading
from pathlib import Path

import pytest

from ternlab.fleet import Callbacks, load_scenario

ROOT = Path(__file__).resolve().parents[2]
BOARDS = 150


class Watch(Callbacks):
    """The most threads and descriptors the runner held while the boards ran."""

    def __init__(self):
        self.threads = self.fds = 0

    def on_tick(self, fleet):
        self.threads = max(self.threads, threading.active_count())
        self.fds = max(self.fds, len(os.listdir("/proc/self/fd")))


@pytest.mark.slow
def test_150_boards_for_90_seconds_under_faults_lose_nothing_by_the_spark_audit(fleet, spark, tmp_path):
    from ternlab.pipeline.audit import run_audit

    scenario = load_scenario(ROOT / "scenarios" / "thousand.toml").with_overrides(
        boards=BOARDS, duration=90, stretch=True)
    watch = Watch()
    result = fleet(scenario, seed=150, callbacks=watch).run()
    assert result.ok, "\n".join(result.failures[:20])
    # the faults happened: a power cut on every board (at a flash operation or, later, at a random time)
    cut = {r["target"] for r in result.faults if r["kind"] == "power_cut" and r["status"] in ("fired", "injected")}
    assert len(cut) == BOARDS, sorted(set(result.boards) - cut)[:10]
    kinds = {r["kind"] for r in result.faults if r["status"] in ("injected", "fired")}
    assert kinds == {"power_cut", "network_cut", "broker_restart", "collector_kill"}, kinds
    assert all(b["published"] > 0 and b["landed"] for b in result.boards.values())
    # one event loop: no thread per board, and a few descriptors a board (the port pty, the device pty
    # while it runs, the console log, the folder lock, custody's duplicates), no select() limit near
    assert watch.threads < 20, watch.threads
    assert watch.fds < 10 * BOARDS, watch.fds

    out = result.out
    summary = run_audit(spark, str(out / "landing"), str(tmp_path / "audit"), ledger=str(out / "ledger.jsonl"),
                        order_ref=str(out / "received.jsonl"))
    per_qos = summary["per_qos"]
    assert summary["verdict"] == {"ok": True, "reasons": []}, summary["verdict"]
    assert set(per_qos) == {"1", "2"}
    assert per_qos["1"]["lost"] == per_qos["2"]["lost"] == 0 and per_qos["2"]["duplicated"] == 0, per_qos
    assert per_qos["1"]["expected"] + per_qos["2"]["expected"] == result.ledger_rows
    # the fleet's judge (Python, its one read of the landing) and the audit (Spark) count alike
    assert result.landing["lost"] == 0
    assert {q: c["duplicated"] for q, c in per_qos.items() if c["duplicated"]} == \
        {q: n for q, n in result.landing["duplicates"].items()}
