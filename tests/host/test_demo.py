"""`tern demo --short`, run as a user runs it (a subprocess): its verdict, and what it says it did.

One seeded short run (2 boards, 20 s of faults, two collectors, the Spark audit) is asserted from its
output files: the audit found nothing lost at QoS >= 1 and no QoS 2 duplicate, every board landed
readings, the report exists, and every fault kind really happened (faults.jsonl)."""

import json
import subprocess
import sys
from collections import defaultdict

import pyarrow.parquet as pq

from ternlab.cli import main as tern
from ternlab.demo import PASS_LINE

SEED = 11


def test_the_short_demo_passes_through_every_kind_of_fault(tmp_path):
    out = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "ternlab.cli", "demo", "--short", "--seed", str(SEED), "--out", str(out)],
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert PASS_LINE in r.stdout and "FAIL" not in r.stdout
    assert f"output in {out.resolve()}" in r.stdout.splitlines()[1]
    assert f"replay: tern demo --short --seed {SEED} --boards 2 --duration 20" in r.stdout

    summary = json.loads((out / "audit" / "summary.json").read_text())
    assert summary["expected_from"] == "ledger" and summary["verdict"] == {"ok": True, "reasons": []}
    for q in ("1", "2"):
        assert summary["per_qos"][q]["expected"] > 20 and summary["per_qos"][q]["lost"] == 0
    assert summary["per_qos"]["2"]["duplicated"] == 0
    # order per subscriber stream (each collector, and the observer for the whole stream): a backlog
    # the shared subscription split between the collectors after an outage is not a reordering
    assert summary["order_ref"] == str((out / "received.jsonl").resolve())
    assert summary["totals"]["reordered"] == 0, summary["problems"]["reordered"]
    devices = defaultdict(int)
    for row in pq.read_table(out / "audit" / "devices").to_pylist():
        devices[row["device"]] += row["received"]
    assert sorted(devices) == ["board-000", "board-001"] and min(devices.values()) > 20
    report = out / "report" / "index.html"
    assert f"report: {report.resolve()}" in r.stdout
    # one self-contained page: the three plots inline, the faults of the run drawn and listed
    assert [p.name for p in (out / "report").iterdir()] == ["index.html"]
    page = report.read_text()
    assert page.count("<svg") >= 2 and "Verdict: PASS" in page and "collector_kill" in page
    # the JVM's own lines (its warnings, log4j's) went to a log named at the end, not into the live view
    jvm = out / "spark.log"
    assert "log4j" in jvm.read_text() and f"Spark's own output (JVM warnings, log4j): {jvm.resolve()}" in r.stdout
    for noise in ("WARNING: Using incubator modules", "default log4j profile", "NativeCodeLoader", "SPARK_LOCAL_IP"):
        assert noise not in r.stdout and noise not in r.stderr, noise
    assert list((out / "rollup").glob("*.parquet"))

    faults = [json.loads(x) for x in (out / "faults.jsonl").read_text().splitlines()]
    seen = defaultdict(list)
    for f in faults:
        seen[(f["kind"], f["target"])].append(f["status"])
    # a power cut at a flash operation on each board: armed, fired (the torn write), power back
    for board in ("board-000", "board-001"):
        assert seen[("power_cut", board)] == ["armed", "fired", "restored"]
    assert [s for (k, _), st in seen.items() if k == "network_cut" for s in st] == ["injected", "restored"]
    assert seen[("broker_restart", "broker")] == ["injected", "restored"]
    (kill,) = [f for f in faults if f["kind"] == "collector_kill" and f["status"] == "injected"]
    assert kill["detail"].startswith("SIGKILL with ") and not kill["detail"].startswith("SIGKILL with 0 ")
    assert seen[("collector_kill", kill["target"])] == ["injected", "restored"]
    # the schedule printed before the run names the collector as the fault record does
    assert f"#{kill['index']} SIGKILL {kill['target']}, restarted" in r.stdout
    # the fault lines were printed as they happened
    for f in faults:
        assert f"fault #{f['index']} {f['kind']} {f['target']}: {f['status']}" in r.stdout
    # the killed collector came back under its id; both stopped cleanly at the end
    landing = json.loads((out / "summary.json").read_text())["landing"]
    assert landing["lost"] == 0
    assert landing["collectors"][kill["target"]]["exit_codes"] == [-9, 0]
    assert all(c["exit_codes"][-1] == 0 and c["landed"] > 0 for c in landing["collectors"].values())


def test_bad_options_are_one_line_before_anything_runs(tmp_path, capsys):
    assert tern(["demo", "--boards", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tern demo: ") and "--boards must be in 1..4096, not 0" in err and err.count("\n") == 1
    assert tern(["demo", "--seed", "x"]) == 2
    assert "--seed: must be a non-negative integer" in capsys.readouterr().err
    used = tmp_path / "used"
    used.mkdir()
    (used / "old").write_text("")
    assert tern(["demo", "--short", "--out", str(used)]) == 2
    assert f"--out {used}: exists and is not an empty directory" in capsys.readouterr().err
    assert list(used.iterdir()) == [used / "old"]
