"""Pipeline commands given the wrong folder: one line saying what it is and what to pass, exit 2, no
trace on the terminal, and Spark never started (the check runs first: no Spark log is made).

The fleet output is a real `tern fleet run smoke` (a scenario without collectors: no OUT/landing)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TERN = str(Path(sys.executable).with_name("tern"))
NO_COLLECTORS = "is a fleet run without collectors (scenario smoke): it has no landing to audit; run a scenario with collectors"
PASS_LANDING = "pass the folder the collectors wrote (OUT/landing)"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A real smoke fleet's output (one board), and the other wrong folders beside it."""
    root = tmp_path_factory.mktemp("wrong")
    smoke = root / "smoke"
    r = subprocess.run([TERN, "fleet", "run", "smoke", "--seed", "1", "--boards", "1", "--quiet", "--out", str(smoke)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert not (smoke / "landing").exists() and (smoke / "received.jsonl").stat().st_size > 0
    (root / "empty").mkdir()
    (root / "jsonl").mkdir()
    shutil.copy(smoke / "received.jsonl", root / "jsonl" / "part-0.json")
    # a ledger written as Parquet (what tern audit --ledger takes) where the landing should be
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(ln) for ln in (smoke / "ledger.jsonl").read_text().splitlines()]
    (root / "ledger-pq").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), str(root / "ledger-pq" / "part-0.parquet"))
    # a fleet run with collectors: its landing is OUT/landing (a collector's folder, nothing landed)
    shutil.copytree(smoke, root / "withcol", ignore=shutil.ignore_patterns("boards", "broker", "mpy"))
    (root / "withcol" / "landing" / ".tern").mkdir(parents=True)
    return root


def tern(root, *argv):
    env = dict(os.environ, TMPDIR=str(root / "tmp"))
    (root / "tmp").mkdir(exist_ok=True)
    r = subprocess.run([TERN, *argv], capture_output=True, text=True, timeout=300, cwd=root, env=env)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    for stream in (r.stdout, r.stderr):
        assert "Traceback" not in stream and "at org.apache" not in stream and "py4j" not in stream.lower()
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert not list((root / "tmp").glob("*.spark.log")), "Spark was started"
    return lines[0]


@pytest.mark.parametrize("cmd", ["audit", "rollup"])
def test_a_fleet_run_without_collectors(folders, cmd):
    line = tern(folders, cmd, "smoke", "--out", "o")
    assert line == f"tern {cmd}: error: smoke {NO_COLLECTORS}, e.g. demo-short, demo, soak or spread (docs/fleet.md)"
    line = tern(folders, cmd, "smoke/landing", "--out", "o")
    assert line.startswith(f"tern {cmd}: error: smoke/landing not found: smoke {NO_COLLECTORS}")


def test_report_on_a_fleet_run_without_collectors(folders):
    assert NO_COLLECTORS in tern(folders, "report", "--audit", "smoke", "--out", "o")


def test_a_fleet_run_with_collectors_names_its_landing(folders):
    line = tern(folders, "audit", "withcol", "--out", "o")
    assert line == ("tern audit: error: withcol is a fleet run's output folder, not its landing: pass withcol/landing "
                    "(and --ledger withcol/ledger.jsonl)")
    line = tern(folders, "report", "--audit", "withcol", "--out", "o")
    assert line.startswith("tern report: error: withcol is a fleet run's output folder, not an audit: audit it "
                           "first, tern audit withcol/landing --out withcol/audit --ledger withcol/ledger.jsonl")
    line = tern(folders, "audit", "withcol/landing", "--out", "o", "--ledger", "withcol")
    assert line == "tern audit: error: withcol is a fleet run's output folder: its ledger is withcol/ledger.jsonl"


@pytest.mark.parametrize("path, says", [
    ("smoke/received.jsonl", "holds JSON lines, not a landing (the fleet observer's copies: give them with "
                             "--order-ref): " + PASS_LANDING),
    ("smoke/ledger.jsonl", "holds JSON lines, not a landing (a ledger: give it with --ledger): " + PASS_LANDING),
    ("jsonl", "holds JSON lines, not a landing: " + PASS_LANDING),
    ("empty", "is empty: pass the folder the collectors wrote (tern collect LANDING: date=*/hour=*/part-*.parquet)"),
    ("ledger-pq", "is a ledger (what the devices published: no recv_ts), not a landing: give it with --ledger, "
                  "and the folder the collectors wrote as the landing"),
    ("smoke/summary.json", "is a JSON file, not a landing: " + PASS_LANDING),
    ("smoke/boards/board-000/console.log", "is a file, not a landing: " + PASS_LANDING),
])
@pytest.mark.parametrize("cmd", ["audit", "rollup"])
def test_what_is_not_a_landing(folders, path, says, cmd):
    assert tern(folders, cmd, path, "--out", "o") == f"tern {cmd}: error: {path} {says}"


def test_a_missing_path_and_an_audit_of_a_landing(folders):
    assert tern(folders, "audit", "nowhere", "--out", "o") == "tern audit: error: landing path not found: nowhere"
    assert tern(folders, "report", "--audit", "withcol/landing", "--out", "o") == (
        "tern report: error: withcol/landing is a landing, not an audit output: run tern audit withcol/landing "
        "--out DIR first, then --audit DIR")
    assert tern(folders, "report", "--audit", "empty", "--out", "o") == (
        "tern report: error: empty is not an audit output (no summary.json of tern audit): pass the folder "
        "tern audit --out wrote")
