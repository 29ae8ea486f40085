"""`tern fleet run --master spark://...`: a fleet's boards in slices on a standalone Spark cluster (a
master and two workers on 127.0.0.1, one core each, started here from pyspark's own jars), the
driver keeping the broker, the collectors and the observer.

What must hold: every slice runs at once, each in its own worker's executor; each injects the power
and network cuts of its own boards and holds its links through the driver's broker restart; the
ledger is whole (every board, from the slices) and nothing accepted at QoS >= 1 is lost."""

import json
import os
import subprocess
import sys

import pytest

from ternlab.fleet.standalone import Standalone, driver_confs

SCENARIO = """
name = "spread"
boards = 4
duration = 8.0
warmup = 2.0
settle = 30.0
[broker]
persistence = true
[firmware]
interval_ms = 200
qos = [1, 2, 0]
[collectors]
count = 1
[[faults]]
kind = "power_cut"
per_board = true
at = "time"
off = [0.3, 0.8]
window = [2.0, 7.0]
[[faults]]
kind = "network_cut"
count = 2
length = [0.5, 1.5]
[[faults]]
kind = "broker_restart"
mode = "hard"
window = [4.0, 5.0]
"""


@pytest.fixture
def cluster(tmp_path):
    c = Standalone(tmp_path / "spark")
    try:
        yield c
    finally:
        c.stop()


@pytest.mark.timeout(240)
def test_a_fleet_runs_in_slices_on_a_two_worker_standalone_cluster(cluster, tmp_path):
    scenario = tmp_path / "spread.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "run"
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    r = subprocess.run([sys.executable, "-m", "ternlab.cli", "fleet", "run", str(scenario), "--seed", "3",
                        "--quiet", "--out", str(out), "--master", cluster.master, *driver_confs()],
                       env=env, capture_output=True, text=True, timeout=200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + (out / "spark.log").read_text()[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    spread = summary["spread"]
    assert spread["master"] == cluster.master
    # two slices, boards 0-1 and 2-3, each in the executor of a different worker
    assert [s["boards"] for s in spread["slices"]] == [[0, 1], [2, 3]]
    used = {i for s in spread["slices"] for i in range(2) if s["workdir"].startswith(str(cluster.workdir(i)))}
    assert used == {0, 1}, spread["slices"]
    # the ledger came back from the slices: every board, and nothing accepted at QoS >= 1 lost
    ledger = [json.loads(x) for x in (out / "ledger.jsonl").read_text().splitlines()]
    assert {row["device"] for row in ledger} == {f"board-{i:03d}" for i in range(4)}
    assert summary["lost"] == 0 and summary["landing"]["lost"] == 0
    assert summary["landing"]["duplicates"].get("2", 0) == 0
    received = {(x["device"], x["boot"], x["seq"], x["qos"])
                for x in map(json.loads, (out / "received.jsonl").read_text().splitlines())}
    assert all((x["device"], x["boot"], x["seq"], x["qos"]) in received for x in ledger if x["qos"])
    faults = [json.loads(x) for x in (out / "faults.jsonl").read_text().splitlines()]
    # each slice cut the power of its own boards (one per board: per_board), and nobody else's
    cuts = {(f["target"], f["slice"]) for f in faults if f["kind"] == "power_cut" and f["status"] == "injected"}
    assert cuts == {("board-000", 0), ("board-001", 0), ("board-002", 1), ("board-003", 1)}
    # the driver restarted the broker; both slices held their links until it said the restart was over
    restart = [f for f in faults if f["kind"] == "broker_restart"]
    assert [f["status"] for f in restart if f["target"] == "broker"] == ["injected", "restored"]
    for k in (0, 1):
        mine = [f["status"] for f in restart if f.get("slice") == k]
        assert mine == ["injected", "restored"], restart
    assert all(b["boots"] == 2 for b in summary["boards"].values())
