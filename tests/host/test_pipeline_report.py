"""Report: one self-contained page, consistent with the audit, and what a person sees in it when
Debian's Chromium (headless) opens it; the rich summary."""

import html as _html
import json
import re
import shutil
import subprocess
import uuid

import pytest
from rich.console import Console

from ternlab.pipeline import report
from ternlab.pipeline.audit import read_landing, run_audit
from ternlab.pipeline.generate import generate

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars")
FAIL_RGB, PASS_RGB = (0xB0, 0x00, 0x20), (0x17, 0x6B, 0x2C)  # the verdict's colours in the template
SECTIONS = ("verdict", "delivery", "latency", "problems", "devices", "faults", "reboots", "logs")


def chromium(page, tmp_path, *args) -> str:
    """Run Debian's chromium headless on ``page`` with a fresh profile; its stdout."""
    exe = shutil.which("chromium")
    assert exe, "chromium is missing: `make setup` installs it (tools/debian-packages.txt)"
    profile = tmp_path / f"chromium-{uuid.uuid4().hex[:8]}"
    r = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, page.resolve().as_uri()],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def seen(page, tmp_path):
    """The page as Chromium renders it: ({section id: (text, number of <svg>)}, {list id: rows of cells},
    screenshot as an RGB array)."""
    import matplotlib.image

    dom = chromium(page, tmp_path, "--dump-dom")
    sections = {}
    for sid, body in re.findall(r'<section id="([^"]+)">(.*?)</section>', dom, re.S):
        text = _html.unescape(re.sub(r"\s+", " ", re.sub(r"<svg.*?</svg>|<[^>]+>", " ", body, flags=re.S)))
        sections[sid] = (text, body.count("<svg"))
    lists = {}
    for lid, body in re.findall(r'<h3 id="([^"]+)">(.*?)(?=<h3 |</section>)', dom, re.S):
        lists[lid] = [[_html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
                      for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]
        lists[lid] = [r for r in lists[lid] if r]
    shot = tmp_path / f"shot-{uuid.uuid4().hex[:8]}.png"
    chromium(page, tmp_path, "--window-size=1200,5000", f"--screenshot={shot}")
    return sections, lists, (matplotlib.image.imread(shot)[:, :, :3] * 255).round()


def pixels(img, rgb, rows=slice(None)) -> int:
    import numpy as np

    return int(np.all(np.abs(img[rows] - np.array(rgb)) <= 12, axis=-1).sum())


def write_faults(path, t0):
    """A faults.jsonl as the fleet writes it (an armed power cut that fired, a network cut, a skipped
    fault), around the generated set's first minute."""
    recs = [(0, "power_cut", "dev-0000", "armed", 15), (0, "power_cut", "dev-0000", "fired", 20),
            (0, "power_cut", "dev-0000", "restored", 30), (1, "network_cut", "dev-0001", "injected", 50),
            (1, "network_cut", "dev-0001", "restored", 60), (2, "broker_restart", "broker", "skipped", 70)]
    path.write_text("".join(json.dumps({"t": dt, "index": i, "kind": k, "target": tg, "status": st,
                                        "detail": f"{st} detail", "ts": t0 + dt}) + "\n"
                            for i, k, tg, st, dt in recs))
    return str(path)


@pytest.fixture(scope="module")
def lossy_report(spark, fleet_set, fleet_audit, tmp_path_factory):
    """The report of the generated fleet (losses at every QoS, duplicates, reorderings) with a fault log."""
    audit_dir, summary = fleet_audit
    out = tmp_path_factory.mktemp("lossy")
    t0 = read_landing(spark, fleet_set.landing).selectExpr("min(recv_ts)").first()[0]
    faults = write_faults(out / "faults.jsonl", t0)
    console = Console(record=True, width=120)
    res = report.run_report(spark, audit_dir, str(out / "rep"), faults=faults, console=console)
    return out / "rep", res, summary, console.export_text(), t0


@pytest.fixture(scope="module")
def clean_report(spark, tmp_path_factory):
    """The report of a set where nothing went wrong (audited against its ledger)."""
    root = tmp_path_factory.mktemp("clean")
    s = generate(spark, str(root / "landing"), n_messages=300, devices=2, boots=1, qos_levels=(0, 1, 2),
                 seed=3, ledger=str(root / "ledger"), counts=False)
    summary = run_audit(spark, s.landing, str(root / "audit"), ledger=s.ledger)
    t0 = read_landing(spark, s.landing).selectExpr("min(recv_ts)").first()[0]
    write_faults(root / "faults.jsonl", t0)  # beside the landing directory: found without --faults
    res = report.run_report(spark, str(root / "audit"), str(root / "rep"), console=Console(record=True))
    return root / "rep", res, summary


def test_report_is_one_self_contained_page(lossy_report):
    out, res, summary, text, _ = lossy_report
    assert [p.name for p in out.iterdir()] == ["index.html"] and res["index"] == str(out / "index.html")
    page = (out / "index.html").read_text()
    # nothing to fetch: no image files, scripts, style sheets or fonts from elsewhere
    assert not re.search(r"<img|<script|<link|<iframe|src=|url\((?!#)|@import", page)
    assert page.count("<svg") == 3 and res["plots"] == ["delivery", "latency", "problems"]
    assert res["faults"] == 3  # every fault of the log, the skipped one too
    assert "Verdict: FAIL" in page
    for reason in summary["verdict"]["reasons"]:
        assert _html.escape(reason) in page
    cells = re.findall(r"<tr><td>all</td>((?:<td>[^<]*</td>)+)</tr>", page)
    assert cells and f"<td>{summary['totals']['lost']}</td>" in cells[0]
    assert "FAIL" in text and str(summary["totals"]["received"]) in text
    assert "3 malformed payload(s)" in text


def test_delivery_over_time_draws_empty_buckets_as_zero(spark, fleet_set):
    # the generated devices are off between their two boots: buckets with nothing in them used to be
    # dropped, and the line was drawn straight across the outage
    land = read_landing(spark, fleet_set.landing)
    t0, t1 = land.selectExpr("min(recv_ts)", "max(recv_ts)").first()
    n = int((t1 - t0) // 15) + 1
    series = report.delivery_series(report.delivery_rows(land, t0, 15), n)
    assert sorted(series) == [0, 1, 2] and all(len(v) == n for v in series.values())
    assert sum(map(sum, series.values())) == fleet_set.rows
    empty = [k for k in range(n) if all(v[k] == 0 for v in series.values())]
    assert len(empty) > 10 and empty == list(range(empty[0], empty[-1] + 1))  # the outage, as zeros
    assert all(v[empty[0] - 1] > 0 and v[empty[-1] + 1] > 0 for v in series.values())


def test_latency_is_drawn_per_qos_with_the_audits_percentiles(spark, fleet_set, fleet_audit):
    _, summary = fleet_audit
    q = report.latency_quantiles(read_landing(spark, fleet_set.landing))
    assert sorted(q) == [0, 1, 2]
    for qos, d in q.items():
        assert d["n"] == summary["per_qos"][str(qos)]["unique"]
        for p in (0.5, 0.95, 0.99):
            audited = summary["per_qos"][str(qos)][f"latency_p{p * 100:g}_ms"]
            assert report._at(d["q"], p) == pytest.approx(audited, rel=0.02, abs=2.0), (qos, p)
        values = [v for _, v in d["q"]]
        assert values == sorted(values) and report._at(d["q"], 1.0) > 10 * report._at(d["q"], 0.5)
    svg = report.plot_latency(q)
    assert "log scale" in svg and all(f"QoS {k}: p50" in svg for k in q)


def test_fault_log_lists_every_fault_with_the_spans_it_acted_in(tmp_path, spark):
    faults = report.load_faults(spark, write_faults(tmp_path / "f.jsonl", 1000.0))
    # every fault, the skipped one too; the arm's power cycle is a span (and a boot) of its own
    assert [(f["index"], f["kind"], f["target"], f["outcome"], f["spans"], f["boots"]) for f in faults] == [
        (0, "power_cut", "dev-0000", "armed -> fired -> restored", [(1015.0, 1015.0), (1020.0, 1030.0)],
         [1015.0, 1030.0]),
        (1, "network_cut", "dev-0001", "injected -> restored", [(1050.0, 1060.0)], []),
        (2, "broker_restart", "broker", "skipped", [], [])]
    assert [(s["index"], s["start"], s["end"]) for s in report.fault_spans(faults)] == [
        (0, 1015.0, 1015.0), (0, 1020.0, 1030.0), (1, 1050.0, 1060.0)]
    (tmp_path / "bad.jsonl").write_text('{"kind": "x"}\n\n{"index": 0}\n')
    with pytest.raises(report.PipelineError, match="bad.jsonl:1: not a fault record"):
        report.load_faults(spark, str(tmp_path / "bad.jsonl"))


def test_chromium_shows_the_verdict_a_plot_per_section_and_the_lost_messages(lossy_report, tmp_path):
    out, _, summary, _, t0 = lossy_report
    sections, lists, img = seen(out / "index.html", tmp_path)
    assert sorted(sections) == sorted(SECTIONS)
    assert "Verdict: FAIL" in sections["verdict"][0]
    for reason in summary["verdict"]["reasons"]:
        assert reason in sections["verdict"][0]
    for sid in ("delivery", "latency", "problems"):
        assert sections[sid][1] == 1, sid
    # the faults are drawn and listed
    assert "power cut" in re.sub(r"\s+", " ", (out / "index.html").read_text().split('id="delivery"')[1]
                                 .split("</section>")[0])
    assert "power_cut dev-0000" in sections["faults"][0] and "network_cut dev-0001" in sections["faults"][0]
    # which (device, boot, seq) were lost at QoS >= 1: every one the audit listed, apart from QoS 0
    listed = summary["problems"]["lost"]["listed"]
    want = [[p["device"], str(p["boot"]), str(p["qos"]), str(p["seq"]) if p["seq"] == p["seq_to"]
             else f"{p['seq']}-{p['seq_to']}"] for p in listed]
    assert [r[:4] for r in lists["lost-qos1"]] == [w for w in want if w[2] != "0"] != []
    assert [r[:4] for r in lists["lost-qos0"]] == [w for w in want if w[2] == "0"] != []
    assert len(lists["duplicated"]) == summary["problems"]["duplicated"]["rows"] > 0
    assert len(lists["reordered"]) == summary["problems"]["reordered"]["rows"] > 0
    # a loss on dev-0000 inside or just after its power cut names it
    assert any(r[0] == "dev-0000" and r[7] == "#0 power_cut dev-0000" for r in lists["lost-qos1"] + lists["lost-qos0"])
    # ranked by problems: every device row shown has some
    devices = sections["devices"][0]
    assert "None" not in devices and "dev-0000" in devices
    # the screenshot: the verdict painted in red near the top, and the plots painted below it
    assert pixels(img, FAIL_RGB, slice(0, 300)) > 100 and pixels(img, PASS_RGB) == 0
    blue = report.QOS_COLOR[1]
    assert pixels(img, tuple(int(blue[i:i + 2], 16) for i in (1, 3, 5))) > 500  # QoS 1's curves


def test_chromium_shows_pass_and_no_empty_loss_plot_when_nothing_went_wrong(clean_report, tmp_path):
    out, res, summary = clean_report
    assert summary["verdict"]["ok"] and summary["totals"]["lost"] == 0
    sections, lists, img = seen(out / "index.html", tmp_path)
    assert "Verdict: PASS" in sections["verdict"][0]
    assert sections["delivery"][1] == 1 and sections["latency"][1] == 1
    # no loss: a sentence, not an empty axis; every list says None; no device ranked
    assert sections["problems"][1] == 0 and "No message lost, duplicated or reordered." in sections["problems"][0]
    assert all(rows == [] for rows in lists.values()) and len(lists) == 4
    assert "None: no device lost, duplicated or reordered a message." in sections["devices"][0]
    # the fault log beside the landing directory was found by itself
    assert res["faults"] == 3 and "power_cut dev-0000" in sections["faults"][0]
    assert pixels(img, PASS_RGB, slice(0, 300)) > 100 and pixels(img, FAIL_RGB) == 0
