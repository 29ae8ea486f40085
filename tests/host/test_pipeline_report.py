"""Report: index.html with valid PNG plots, consistent with the audit; the rich summary."""

import re
import struct

from rich.console import Console

from ternlab.pipeline import report
from ternlab.pipeline.audit import read_landing

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes):
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_report_writes_html_and_pngs(spark, fleet_set, fleet_audit, tmp_path):
    audit_dir, summary = fleet_audit
    console = Console(record=True, width=120)
    res = report.run_report(spark, audit_dir, str(tmp_path / "rep"), console=console)
    html = (tmp_path / "rep" / "index.html").read_text()
    for name in report.PLOTS:
        data = (tmp_path / "rep" / name).read_bytes()
        w, h = png_size(data)
        assert w >= 400 and h >= 200 and len(data) > 5000, name
        assert f'src="{name}"' in html
    assert sorted(p.rsplit("/", 1)[1] for p in res["plots"]) == sorted(report.PLOTS)
    assert "Verdict: FAIL" in html
    for reason in summary["verdict"]["reasons"]:
        assert reason in html
    cells = re.findall(r"<tr><td>all</td>((?:<td>[^<]*</td>)+)</tr>", html)
    assert cells and f"<td>{summary['totals']['lost']}</td>" in cells[0]
    text = console.export_text()
    assert "FAIL" in text and str(summary["totals"]["received"]) in text
    assert f"{fleet_set.quarantined} malformed payload(s)" in text


def test_gap_heat_map_counts_the_audited_losses(spark, fleet_set, fleet_audit, tmp_path):
    _, summary = fleet_audit
    land = read_landing(spark, fleet_set.landing)
    t0 = min(r[0] for r in land.selectExpr("min(recv_ts)").collect())
    total = report.plot_gaps(spark, land, None, t0, 60, 10, str(tmp_path / "gaps.png"))
    assert total == summary["totals"]["lost"] > 0
    assert png_size((tmp_path / "gaps.png").read_bytes())[0] >= 400
