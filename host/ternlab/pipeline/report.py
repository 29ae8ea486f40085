"""Report: a self-contained HTML directory (``index.html`` + PNG plots) and a rich terminal summary.

Inputs are the audit outputs (``summary.json``, ``devices/``) and the landing data (for the plots over
time; the landing and ledger paths recorded in the summary are used unless others are given).
Plots (matplotlib, Agg backend):

- ``delivery.png`` -- messages received per time bucket, one line per QoS;
- ``latency.png``  -- histogram of delivery latency (first arrival of each message), up to p99.9;
- ``gaps.png``     -- heat map of lost messages, devices x time buckets (the devices with most losses).

Only aggregated rows (buckets, histogram bins, per-device cells) are collected to the driver.
"""

from __future__ import annotations

import datetime as _dt
import html
import io
import json

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from .audit import lost_events, messages, read_landing, read_ledger
from .session import PipelineError, join, read_bytes, write_bytes

PLOTS = ("delivery.png", "latency.png", "gaps.png")
NICE_BUCKETS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
MAX_HEAT_DEVICES = 40
MAX_TABLE_DEVICES = 50
HIST_BINS = 50


def load_summary(spark: SparkSession, audit_dir: str) -> dict:
    raw = read_bytes(spark, join(audit_dir, "summary.json"))
    try:
        return json.loads(raw)
    except ValueError:
        raise PipelineError(f"not an audit summary: {join(audit_dir, 'summary.json')}") from None


def pick_bucket(span_s: float, target: int = 60) -> int:
    """A round bucket size (seconds) that cuts ``span_s`` into about ``target`` buckets."""
    want = max(span_s, 1.0) / target
    for b in NICE_BUCKETS:
        if b >= want:
            return b
    return NICE_BUCKETS[-1]


# --- terminal --------------------------------------------------------------------------------------

def _fmt_ms(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def summary_table(summary: dict):
    """A rich Table of the per-QoS and total counts of an audit summary."""
    from rich.table import Table

    ok = summary["verdict"]["ok"]
    t = Table(title=f"Delivery audit ({summary['expected_from']} expectation) - "
                    f"{'PASS' if ok else 'FAIL'}", title_style="bold " + ("green" if ok else "red"))
    for name in ("QoS", "expected", "received", "unique", "lost", "dup", "reord",
                 "p50 ms", "p95 ms", "p99 ms"):
        t.add_column(name, justify="right", no_wrap=True)
    rows = [(q, summary["per_qos"][q]) for q in sorted(summary["per_qos"])]
    rows.append(("all", summary["totals"]))
    for q, r in rows:
        t.add_row(str(q), *[str(r.get(c, 0)) for c in ("expected", "received", "unique", "lost",
                                                         "duplicated", "reordered")],
                  _fmt_ms(r.get("latency_p50_ms")), _fmt_ms(r.get("latency_p95_ms")),
                  _fmt_ms(r.get("latency_p99_ms")), end_section=(len(rows) > 1 and q == rows[-2][0]))
    return t


def print_summary(summary: dict, console=None) -> None:
    from rich.console import Console

    console = console or Console()
    console.print(summary_table(summary))
    for reason in summary["verdict"]["reasons"]:
        console.print(f"[red]FAIL[/red] {reason}")
    if summary.get("quarantined"):
        console.print(f"{summary['quarantined']} malformed payload(s) in quarantine")
    if summary.get("note"):
        console.print(f"[dim]note: {summary['note']}[/dim]")


# --- plots -----------------------------------------------------------------------------------------

def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4), dpi=100)
    return plt, fig, ax


def _save(spark, plt, fig, path: str) -> None:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    write_bytes(spark, path, buf.getvalue())


def _when(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def plot_delivery(spark, land, t0: float, bucket: int, path: str) -> int:
    rows = (land.groupBy(F.floor((F.col("recv_ts") - t0) / bucket).alias("b"), "qos").count()
            .collect())
    plt, fig, ax = _figure()
    for q in sorted({r["qos"] for r in rows}):
        pts = sorted((r["b"], r["count"]) for r in rows if r["qos"] == q)
        ax.plot([b * bucket / 60.0 for b, _ in pts], [c for _, c in pts], marker=".", label=f"QoS {q}")
    ax.set_xlabel(f"minutes since {_when(t0)} UTC ({bucket} s buckets)")
    ax.set_ylabel("messages received")
    ax.set_title("Delivery over time")
    if rows:
        ax.legend()
    _save(spark, plt, fig, path)
    return len(rows)


def plot_latency(spark, land, path: str) -> int:
    lat = messages(land).select("latency_ms").filter(F.col("latency_ms").isNotNull())
    lo, hi, n = lat.agg(F.min("latency_ms"), F.percentile_approx("latency_ms", 0.999, 10000),
                        F.count(F.lit(1))).first()
    plt, fig, ax = _figure()
    if n:
        width = max((hi - lo) / HIST_BINS, 1e-6)
        b = F.least(F.floor((F.col("latency_ms") - lo) / width), F.lit(HIST_BINS))
        bins = sorted((r["b"], r["count"]) for r in lat.groupBy(b.alias("b")).count().collect())
        ax.bar([lo + (k + 0.5) * width for k, _ in bins], [c for _, c in bins], width=width * 0.9)
        ax.set_title(f"Delivery latency of {n} messages (first arrival; last bar: above p99.9)")
    else:
        ax.set_title("Delivery latency: no message carried a send time")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("messages")
    _save(spark, plt, fig, path)
    return int(n or 0)


def plot_gaps(spark, land, ledger, t0: float, bucket: int, n_buckets: int, path: str) -> int:
    ev = lost_events(land, ledger).filter(F.col("ts").isNotNull())
    cells = (ev.groupBy("device", F.floor((F.col("ts") - t0) / bucket).alias("b"))
             .agg(F.sum("lost").alias("lost")))
    top = (cells.groupBy("device").agg(F.sum("lost").alias("t"))
           .orderBy(F.desc("t"), "device").limit(MAX_HEAT_DEVICES))
    rows = cells.join(top.select("device"), "device").collect()
    devices = sorted({r["device"] for r in rows})
    plt, fig, ax = _figure()
    total = sum(int(r["lost"]) for r in rows)
    if devices:
        nb = max(n_buckets, max(int(r["b"]) for r in rows) + 1)
        grid = [[0] * nb for _ in devices]
        index = {d: i for i, d in enumerate(devices)}
        for r in rows:
            grid[index[r["device"]]][max(int(r["b"]), 0)] += int(r["lost"])
        im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="Reds",
                       extent=(0, nb * bucket / 60.0, len(devices) - 0.5, -0.5))
        ax.set_yticks(range(len(devices)))
        ax.set_yticklabels(devices, fontsize=7)
        fig.colorbar(im, ax=ax, label="lost messages")
        ax.set_title(f"Lost messages per device and {bucket} s bucket ({total} shown)")
    else:
        ax.text(0.5, 0.5, "no losses detected", ha="center", va="center", transform=ax.transAxes)
        ax.set_title("Lost messages per device")
    ax.set_xlabel(f"minutes since {_when(t0)} UTC")
    _save(spark, plt, fig, path)
    return total


# --- html ------------------------------------------------------------------------------------------

def _table(headers, rows) -> str:
    h = "".join(f"<th>{html.escape(str(x))}</th>" for x in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in r) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def render_html(summary: dict, devices: list[dict], bucket: int) -> str:
    cols = ("expected", "received", "unique", "lost", "duplicated", "reordered")
    lat = ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms")
    qrows = [[q, *[summary["per_qos"][q][c] for c in cols],
              *[_fmt_ms(summary["per_qos"][q].get(c)) for c in lat]] for q in sorted(summary["per_qos"])]
    qrows.append(["all", *[summary["totals"].get(c, 0) for c in cols],
                  *[_fmt_ms(summary["totals"].get(c)) for c in lat]])
    heads = ("QoS", *cols, "p50 ms", "p95 ms", "p99 ms")
    drows = [[d["device"], d["qos"], *[d[c] for c in cols], *[_fmt_ms(d.get(c)) for c in lat]]
             for d in devices]
    ok = summary["verdict"]["ok"]
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in summary["verdict"]["reasons"])
    note = f"<p class=note>{html.escape(summary['note'])}</p>" if summary.get("note") else ""
    esc = html.escape
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Tern delivery report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }}
th {{ background: #f3f3f3; }}
.pass {{ color: #176b2c; }} .fail {{ color: #b00020; }} .note {{ color: #666; }}
img {{ max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }}
</style></head><body>
<h1>Tern delivery report</h1>
<p>Landing: <code>{esc(str(summary['landing']))}</code>; ledger: <code>{esc(str(summary['ledger']))}</code>;
expectation: {esc(summary['expected_from'])}; devices: {summary['devices']};
quarantined payloads: {summary['quarantined']}; audited {esc(summary['generated_at'])}.</p>
<h2 class="{'pass' if ok else 'fail'}">Verdict: {'PASS' if ok else 'FAIL'}</h2>
<ul>{reasons}</ul>{note}
<h2>Per QoS</h2>
{_table(heads, qrows)}
<h2>Delivery over time</h2>
<img src="delivery.png" alt="messages received per {bucket} s bucket and QoS">
<h2>Latency</h2>
<img src="latency.png" alt="histogram of delivery latency">
<h2>Gaps</h2>
<img src="gaps.png" alt="lost messages per device and time bucket">
<h2>Devices with most problems (up to {MAX_TABLE_DEVICES})</h2>
{_table(("device", *heads), drows)}
</body></html>
"""


def run_report(spark: SparkSession, audit_dir: str, out: str, landing: str | None = None,
               ledger: str | None = None, bucket: int | None = None, console=None) -> dict:
    """Write ``<out>/index.html`` and the PNGs; print the terminal summary; return what was written."""
    summary = load_summary(spark, audit_dir)
    landing = landing or summary.get("landing")
    ledger = ledger or summary.get("ledger")
    if not landing:
        raise PipelineError("no landing path: pass --landing")
    land = read_landing(spark, landing)
    led = read_ledger(spark, ledger, summary.get("ledger_format") or "auto") if ledger else None
    t0, t1 = land.agg(F.min("recv_ts"), F.max("recv_ts")).first()
    if t0 is None:
        raise PipelineError(f"no landing rows under {landing}")
    if bucket is not None and bucket <= 0:
        raise PipelineError(f"--bucket must be a positive number of seconds, got {bucket}")
    bucket = bucket or pick_bucket(t1 - t0)
    n_buckets = int((t1 - t0) // bucket) + 1
    score = F.col("lost") + F.col("duplicated") + F.col("reordered")
    devices = [r.asDict() for r in spark.read.parquet(join(audit_dir, "devices"))
               .orderBy(F.desc(score), "device", "qos").limit(MAX_TABLE_DEVICES).collect()]
    plot_delivery(spark, land, t0, bucket, join(out, "delivery.png"))
    plot_latency(spark, land, join(out, "latency.png"))
    plot_gaps(spark, land, led, t0, bucket, n_buckets, join(out, "gaps.png"))
    write_bytes(spark, join(out, "index.html"), render_html(summary, devices, bucket).encode())
    print_summary(summary, console)
    return {"index": join(out, "index.html"), "plots": [join(out, p) for p in PLOTS],
            "bucket_s": bucket}
