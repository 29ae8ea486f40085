"""The report of a real fleet run whose collector is killed holding QoS 0 readings it has received and
not yet written: those losses are said to be between broker and landing, and the collector kill is the
fault named for them; the fault log, the reboots (each board's power is cut at a flash operation) and
the log links are those of the run."""

import html as _html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ternlab.pipeline import losses, report
from ternlab.pipeline.audit import run_audit

TERN = str(Path(sys.executable).with_name("tern"))
SCENARIO = """
name = "kill-qos0"
description = "2 boards, QoS 0 and 1, a power cut at a flash operation on each, one collector with 2 s batches, killed once"
boards = 2
profile = "unix-emulated"
duration = 9.0
warmup = 2.0
settle = 30.0

[broker]
persistence = true

[firmware]
interval_ms = 100
qos = [0, 1]

[collectors]
count = 1
group = "kill"
batch_time = 2.0

[[faults]]
kind = "power_cut"
per_board = true
at = "flash_op"
flash_ops = [2, 10]
off = [0.3, 0.5]
window = [2.0, 2.5]

[[faults]]
kind = "collector_kill"
count = 1
down = [1.0, 1.5]
window = [4.0, 5.0]
"""


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("killrun")
    (root / "kill.toml").write_text(SCENARIO)
    out = root / "out"
    r = subprocess.run([TERN, "fleet", "run", str(root / "kill.toml"), "--seed", "3", "--quiet", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]  # QoS 0 losses do not fail a fleet
    summary = run_audit(spark, str(out / "landing"), str(out / "audit"), ledger=str(out / "ledger.jsonl"),
                        order_ref=str(out / "received.jsonl"))
    res = report.run_report(spark, str(out / "audit"), str(out / "report"))
    return out, summary, res


def test_a_collector_kill_loses_qos0_between_broker_and_landing(run):
    out, summary, res = run
    kill = [json.loads(ln) for ln in (out / "faults.jsonl").read_text().splitlines()]
    injected = next(r for r in kill if r["kind"] == "collector_kill" and r["status"] == "injected")
    held = int(re.search(r"SIGKILL with (\d+) message", injected["detail"]).group(1))
    assert held > 0, injected
    assert summary["per_qos"]["0"]["lost"] > 0 and summary["per_qos"]["1"]["lost"] == 0
    seen = {(r["device"], r["boot"], r["qos"], r["seq"]) for r in map(json.loads, (out / "received.jsonl").read_text().splitlines())}
    rows = res["lost"]["rows"]["qos0"]
    assert rows and not res["lost"]["rows"]["qos1"]
    for r in rows:
        # the place follows the observer's copies, message by message
        keys = [(r["device"], r["boot"], 0, s) for s in range(r["seq"], r["seq_to"] + 1)]
        assert all((k in seen) == (r["where"] == losses.PIPELINE) for k in keys), r
    between = [r for r in rows if r["where"] == losses.PIPELINE]
    assert sum(r["count"] for r in between) >= 1
    for r in between:
        assert r["fault"] is not None and (r["fault"]["kind"], r["fault"]["target"]) == ("collector_kill", "collector-1"), r
        # the kill acted during the flight
        assert losses.overlaps(r["flight"], (injected["ts"], None))
    # what a person reads on the page
    page = _html.unescape(re.sub(r"<[^>]+>", " ", (out / "report" / "index.html").read_text()))
    page = re.sub(r"\s+", " ", page)
    lost0 = page.split("Lost at QoS 0")[1].split("Duplicated:")[0]
    idx = injected["index"]
    assert f"#{idx} collector_kill collector-1 between broker and landing" in lost0


def test_the_report_lists_the_faults_and_links_the_logs(run):
    out, _, res = run
    page = (out / "report" / "index.html").read_text()
    faults = page.split('<section id="faults">')[1].split("</section>")[0]
    assert "collector_kill" in faults and "injected -&gt; restored" in faults
    logs = res["logs"]
    assert sorted(logs["boards"]) == ["board-000", "board-001"] and sorted(logs["collectors"]) == ["collector-1"]
    for href in [*logs["boards"].values(), *logs["collectors"].values()]:
        assert f'href="{href}"' in page and not os.path.isabs(href)
        assert (out / "report" / href).resolve().is_file()
    # every reboot is one of the power cuts' (an arm's power cycle, power back after the cut), on its board
    reboots = res["reboots"]
    assert {r["device"] for r in reboots} == {"board-000", "board-001"}, reboots
    for r in reboots:
        assert r["unexplained"] == 0 and len(r["explained_by"]) == r["reboots"] >= 1, r
        assert all(f["kind"] == "power_cut" and f["target"] == r["device"] for f in r["explained_by"]), r
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.split('<section id="reboots">')[1].split("</section>")[0]))
    assert "unexplained" not in text.split("unexplained", 1)[1] and "power_cut" in text
