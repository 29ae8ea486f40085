"""Report: one self-contained HTML page (``index.html``, its plots inline SVG: nothing else to fetch, so
it can be attached to a CI run and read offline) and a rich terminal summary.

Inputs: the audit outputs (``summary.json``, ``devices/``, ``problems/``), the landing data (delivery
over time, latency) and, when there is one, the run's fault log (``faults.jsonl`` of ``tern fleet`` and
``tern demo``), drawn over the time plots so each dip sits beside its cause. The page
(``templates/report.html.j2``, Jinja2) has:

- the verdict and its reasons, the per-QoS table;
- delivery over time: messages received per bucket and QoS, empty buckets drawn as zero, faults shaded;
- latency: the CDF of each QoS on a log axis, p50/p95/p99 marked, and a percentile table;
- problems: a timeline per device of what was lost (QoS >= 1 apart from QoS 0, which may lose),
  duplicated or reordered, with the faults, and the lists of which (device, boot, seq); each lost one
  localised (on the device or before the broker / between broker and landing, by the observer's
  copies) with the fault that overlapped its flight (the rules: :mod:`.losses`);
- the devices with most problems (only devices that have any); the fault log, every fault whatever
  became of it; each board's reboots, explained by a fault or not; links to the boards' consoles and
  the collectors' logs of the run.

Only aggregated rows (buckets, quantiles, per-device cells, the audit's bounded lists) reach the driver.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import math

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pyspark.sql import Window

from ..term import print_table
from . import losses
from .audit import PROBLEM_KINDS, messages, read_landing, read_ledger, read_order_ref
from .judge import KEY, STREAM
from .spark import PipelineError, is_local, join, local_part, path_exists, read_bytes, write_bytes

NICE_BUCKETS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
MAX_TIMELINE_DEVICES = 40
MAX_TABLE_DEVICES = 50
# quantiles drawn per QoS: every percent, then finer into the tail (the reconnect tails live there)
CDF_PROBS = tuple(sorted({i / 100 for i in range(101)} | {0.99 + i / 1000 for i in range(10)}
                         | {0.999, 0.9995, 0.9999}))
MARKED = (0.5, 0.95, 0.99)
LATENCY_FLOOR_MS = 0.1  # the log axis starts here; lower (or negative: clock skew) is drawn at it
FAULT_STYLE = {"power_cut": ("#d62728", "power cut"), "network_cut": ("#ff7f0e", "network cut"),
               "broker_restart": ("#9467bd", "broker restart"),
               "collector_kill": ("#8c564b", "collector killed")}
QOS_COLOR = {0: "#7f7f7f", 1: "#1f77b4", 2: "#2ca02c"}
MAX_BOOT_ROWS = 10000  # (device, boot) rows read for the reboots table
MAX_LOGS = 1000        # log links listed


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


def _seqs(p: dict) -> str:
    return str(p["seq"]) if p["seq_to"] == p["seq"] else f"{p['seq']}-{p['seq_to']}"


def _when(ts) -> str:
    if ts is None:
        return "-"
    t = _dt.datetime.fromtimestamp(ts, _dt.timezone.utc)
    return t.strftime("%H:%M:%S.") + f"{t.microsecond // 1000:03d}"


def problems_table(summary: dict, kind: str):
    """A rich Table of the listed problems of one kind (None when there are none)."""
    from rich.table import Table

    got = summary.get("problems", {}).get(kind)
    if not got or not got["rows"]:
        return None
    more = got["rows"] - len(got["listed"])
    t = Table(title=f"{kind}: {got['messages']} message(s) in {got['rows']} row(s)"
                    + (f", first {len(got['listed'])} shown" if more else ""))
    for name in ("device", "boot", "QoS", "seq", "count", "at (UTC)"):
        t.add_column(name, justify="left" if name == "device" else "right", no_wrap=True)
    for p in got["listed"]:
        t.add_row(p["device"], str(p["boot"]), str(p["qos"]), _seqs(p), str(p["count"]), _when(p["ts"]))
    return t


def print_summary(summary: dict, console=None, problems: bool = False) -> None:
    """The audit table, the verdict's reasons and notes; with ``problems`` the lists of which
    (device, boot, seq) were lost, duplicated or reordered."""
    from rich.console import Console

    console = console or Console(soft_wrap=True)  # a long path stays on one line in a log
    print_table(console, summary_table(summary))
    for reason in summary["verdict"]["reasons"]:
        console.print(f"[red]FAIL[/red] {reason}")
    if summary.get("quarantined"):
        console.print(f"{summary['quarantined']} malformed payload(s) in quarantine")
    if summary.get("note"):
        console.print(f"[dim]note: {summary['note']}[/dim]")
    if problems:
        tables = [t for t in (problems_table(summary, k) for k in PROBLEM_KINDS) if t is not None]
        for t in tables:
            print_table(console, t)
        if not tables:
            console.print("no message lost, duplicated or reordered")
        elif "path" in summary.get("problems", {}):
            console.print(f"complete list: {summary['problems']['path']} (Parquet)")


# --- faults ----------------------------------------------------------------------------------------

def load_faults(spark, path: str) -> list[dict]:
    """Every fault of a run's ``faults.jsonl`` (:func:`.losses.fault_log`: its outcome, the spans in
    which it acted, the boots it caused), whatever became of it."""
    records, lines = [], []
    for n, line in enumerate(read_bytes(spark, path).decode().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            raise PipelineError(f"{path}:{n}: not a fault record") from None
        lines.append(n)
    try:
        return losses.fault_log(records)
    except losses.FaultLogError as e:
        raise PipelineError(f"{path}:{lines[e.n - 1]}: not a fault record") from None


def fault_spans(faults: list[dict]) -> list[dict]:
    """The spans of the faults, one dict each (``index, kind, target, start, end``), for the plots."""
    return sorted(({"index": f["index"], "kind": f["kind"], "target": f["target"], "start": a, "end": b}
                   for f in faults for a, b in f["spans"]), key=lambda s: (s["start"], s["index"]))


# --- where each loss happened ----------------------------------------------------------------------

def landing_delay(land) -> float:
    """The longest a landed copy waited between its receipt and the write of its file (seconds; 0
    when unknown): how long after the broker had a message it should have landed."""
    v = land.agg(F.max(F.col("written_ts") - F.col("recv_ts"))).first()[0]
    return max(float(v), 0.0) if v is not None else 0.0


def _judged(r: dict, faults: list[dict], delay: float) -> dict:
    fl = losses.flight(r["sent"], None if r["open"] else r["reached"], delay)
    return dict(r, flight=fl, fault=losses.blame(r["device"], r["where"], fl, faults))


def lost_runs(land, led, ref, faults: list[dict], delay: float, limit: int = 200) -> dict:
    """The lost messages of a ledger, localised: runs of consecutive seqs of a stream lost at the
    same place (:mod:`.losses`), the first ``limit`` of QoS >= 1 and of QoS 0, each with its flight
    and the fault named for it; and the messages lost per QoS and place.

    A message the observer saw (``ref``) was lost after the broker, one it never saw before; its flight
    ends when the broker had it -- its observer copy, or the observer's first copy of a later message
    of the device -- plus the landing ``delay``. Without ``ref`` the place is unknown and the
    landing's first copies stand in for the observer's."""
    m = led.select(*KEY, "sent_ts").dropDuplicates(list(KEY))
    m = m.join(land.select(*KEY).distinct().withColumn("_landed", F.lit(1)), list(KEY), "left")
    copies = ref if ref is not None else land
    m = m.join(copies.groupBy(*KEY).agg(F.min("recv_ts").alias("_seen")), list(KEY), "left")
    where = (F.when(F.col("_seen").isNotNull(), F.lit(losses.PIPELINE)).otherwise(F.lit(losses.DEVICE))
             if ref is not None else F.lit(losses.UNKNOWN))
    later = Window.partitionBy("device").orderBy("sent_ts", "boot", "qos", "seq").rowsBetween(
        1, Window.unboundedFollowing)
    m = m.withColumn("_next", F.min("_seen").over(later))
    lost = m.filter(F.col("_landed").isNull()).select(
        *KEY, "sent_ts", where.alias("where"), F.coalesce("_seen", "_next").alias("_reached"))
    w = Window.partitionBy(*STREAM, "where").orderBy("seq")
    runs = (lost.withColumn("_run", F.col("seq") - F.row_number().over(w))
            .groupBy(*STREAM, "where", "_run")
            .agg(F.min("seq").alias("seq"), F.max("seq").alias("seq_to"), F.count(F.lit(1)).alias("count"),
                 F.min("sent_ts").alias("sent"), F.max("_reached").alias("reached"),
                 F.max(F.col("_reached").isNull().cast("int")).alias("open"))
            .drop("_run")).cache()
    try:
        counts: dict = {}
        for r in runs.groupBy("qos", "where").agg(F.sum("count").alias("n"), F.count(F.lit(1)).alias("rows")).collect():
            counts.setdefault(int(r["qos"]), {})[r["where"]] = {"messages": int(r["n"]), "rows": int(r["rows"])}
        order = ["device", "boot", "qos", "seq", "where"]
        rows = {k: [_judged(r.asDict(), faults, delay) for r in runs.filter(cond).orderBy(*order).limit(limit).collect()]
                for k, cond in (("qos1", F.col("qos") >= 1), ("qos0", F.col("qos") == 0))}
    finally:
        runs.unpersist()
    return {"rows": rows, "counts": counts, "delay": delay}


def boot_windows(df) -> dict:
    """device -> [(boot, first send, last send)] from ledger or landing rows (the first
    MAX_BOOT_ROWS (device, boot) pairs)."""
    out: dict = {}
    for r in (df.filter(F.col("sent_ts").isNotNull()).groupBy("device", "boot")
              .agg(F.min("sent_ts").alias("a"), F.max("sent_ts").alias("b"))
              .orderBy("device", "boot").limit(MAX_BOOT_ROWS).collect()):
        out.setdefault(r["device"], []).append((int(r["boot"]), float(r["a"]), float(r["b"])))
    return out


def run_logs(run_dir: str | None, out: str) -> dict:
    """Links (relative to the report's folder) to each board's console log and each collector's log
    of a fleet run's folder: ``{"boards": {name: href}, "collectors": {id: href}}`` (local folders only)."""
    import os

    logs = {"boards": {}, "collectors": {}}
    if not run_dir or not is_local(run_dir) or not is_local(out):
        return logs
    base, here = local_part(run_dir), os.path.abspath(local_part(out))
    try:
        boards = sorted(os.listdir(os.path.join(base, "boards")))[:MAX_LOGS]
    except OSError:
        boards = []
    for b in boards:
        p = os.path.join(base, "boards", b, "console.log")
        if os.path.isfile(p):
            logs["boards"][b] = os.path.relpath(os.path.abspath(p), here)
    try:
        cols = sorted(os.listdir(os.path.join(base, "collectors")))[:MAX_LOGS]
    except OSError:
        cols = []
    for c in cols:
        if c.endswith(".log"):
            logs["collectors"][c[:-4]] = os.path.relpath(os.path.abspath(os.path.join(base, "collectors", c)), here)
    return logs


# --- plots -----------------------------------------------------------------------------------------

class _Axis:
    """The time axis shared by the time plots: seconds (or minutes, for long runs) since t0."""

    def __init__(self, t0: float, t1: float):
        self.t0, self.t1 = t0, t1
        self.unit = 1.0 if t1 - t0 <= 900 else 60.0
        self.label = (f"{'seconds' if self.unit == 1 else 'minutes'} since "
                      f"{_dt.datetime.fromtimestamp(t0, _dt.timezone.utc):%Y-%m-%d %H:%M:%S} UTC")

    def x(self, ts: float) -> float:
        return (ts - self.t0) / self.unit


def _figure(height=4.0):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, height), dpi=100)
    return plt, fig, ax


def _svg(plt, fig) -> str:
    buf = io.StringIO()
    fig.tight_layout()
    with plt.rc_context({"svg.fonttype": "none"}):  # text stays text: searchable, readable by a test
        fig.savefig(buf, format="svg")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # no XML prolog or DOCTYPE inside the HTML page


def _overlay(ax, spans: list[dict], axis: _Axis) -> None:
    """Shade each fault's span (a line for a short one) and number it as in the fault table."""
    import matplotlib.transforms as mtransforms

    top = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    seen = set()
    min_w = (axis.t1 - axis.t0) / axis.unit / 300
    last, level = None, 0  # numbers of faults that start close together go on separate rows
    for s in spans:
        color, name = FAULT_STYLE.get(s["kind"], ("#555555", s["kind"]))
        a, b = axis.x(s["start"]), axis.x(s["end"] if s["end"] is not None else axis.t1)
        label = None if s["kind"] in seen else name
        seen.add(s["kind"])
        if b - a > min_w:
            ax.axvspan(a, b, color=color, alpha=0.18, lw=0, label=label)
        else:
            ax.axvline(a, color=color, alpha=0.6, lw=1.2, label=label)
        level = level + 1 if last is not None and a - last < 10 * min_w and level < 2 else 0
        last = a
        ax.text(a, 1.0 + 0.045 * level, f"#{s['index']}", transform=top, fontsize=7, color=color, va="bottom")


def delivery_rows(land, t0: float, bucket: float) -> dict:
    """{qos: {bucket index: messages received}} (only non-empty buckets come from Spark)."""
    rows = (land.groupBy(F.floor((F.col("recv_ts") - t0) / bucket).alias("b"), "qos").count()
            .collect())
    out = {}
    for r in rows:
        out.setdefault(int(r["qos"]), {})[int(r["b"])] = int(r["count"])
    return out


def delivery_series(counts: dict, n_buckets: int) -> dict:
    """{qos: [messages in bucket 0, 1, ... n_buckets - 1]}: a bucket nothing arrived in is a 0, so an
    outage shows as a drop to zero instead of a line drawn across it."""
    return {q: [c.get(k, 0) for k in range(n_buckets)] for q, c in sorted(counts.items())}


def plot_delivery(counts: dict, axis: _Axis, bucket: float, n_buckets: int, spans: list[dict]) -> str:
    """Messages received per bucket and QoS, every bucket drawn (an empty one is a zero), faults shaded."""
    plt, fig, ax = _figure()
    xs = [axis.x(axis.t0 + k * bucket) for k in range(n_buckets + 1)]
    for q, ys in delivery_series(counts, n_buckets).items():
        ax.stairs(ys, xs, color=QOS_COLOR.get(q), lw=1.5, label=f"QoS {q}")
    _overlay(ax, spans, axis)
    ax.set_xlim(xs[0], xs[-1])
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"{axis.label} ({bucket:g} s buckets)")
    ax.set_ylabel(f"messages received per {bucket:g} s")
    if counts or spans:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _svg(plt, fig)


def latency_quantiles(land) -> dict:
    """{qos: {"n": messages with a send time, "q": [(p, ms) for p in CDF_PROBS]}} of first arrivals."""
    lat = messages(land).select("qos", "latency_ms").filter(F.col("latency_ms").isNotNull())
    rows = lat.groupBy("qos").agg(
        F.count(F.lit(1)).alias("n"),
        F.percentile_approx("latency_ms", list(CDF_PROBS), 10000).alias("q")).collect()
    return {int(r["qos"]): {"n": int(r["n"]), "q": list(zip(CDF_PROBS, r["q"]))} for r in rows}


def _at(quant: list, p: float) -> float:
    return next(v for pp, v in quant if abs(pp - p) < 1e-9)


def plot_latency(quantiles: dict) -> str:
    """The CDF of delivery latency per QoS on a log axis, p50/p95/p99 marked on each curve."""
    plt, fig, ax = _figure()
    for q in sorted(quantiles):
        quant = quantiles[q]["q"]
        xs = [max(v, LATENCY_FLOOR_MS) for _, v in quant]
        ax.step(xs, [p for p, _ in quant], where="post", color=QOS_COLOR.get(q), lw=1.5,
                label=f"QoS {q}: p50 {_at(quant, 0.5):.0f}, p95 {_at(quant, 0.95):.0f}, "
                      f"p99 {_at(quant, 0.99):.0f} ms ({quantiles[q]['n']} messages)")
        for p in MARKED:
            ax.plot([max(_at(quant, p), LATENCY_FLOOR_MS)], [p], "o", color=QOS_COLOR.get(q), ms=4)
    for p in MARKED:
        ax.axhline(p, color="#bbbbbb", lw=0.6, ls=":")
        ax.text(1.0, p, f" p{p * 100:g}", transform=ax.get_yaxis_transform(), fontsize=7,
                va="center", color="#666666")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("delivery latency, ms (log scale; first arrival of each message)")
    ax.set_ylabel("fraction of messages delivered")
    if quantiles:
        ax.legend(fontsize=8, loc="lower right")
    return _svg(plt, fig)


def latency_table(quantiles: dict) -> list[dict]:
    return [{"qos": q, "n": quantiles[q]["n"],
             **{f"p{p * 100:g}": _at(quantiles[q]["q"], p) for p in (0.5, 0.9, 0.95, 0.99, 0.999)},
             "max": _at(quantiles[q]["q"], 1.0)} for q in sorted(quantiles)]


def problem_cells(spark, path: str, t0: float, bucket: float):
    """Problems per (device, bucket, kind, QoS class) for the timeline, for the devices with most
    problems: (rows, devices in order, devices left out)."""
    df = spark.read.parquet(path).filter(F.col("ts").isNotNull())
    cls = F.when(F.col("kind") != "lost", F.col("kind")).when(F.col("qos") == 0, F.lit("lost0")) \
        .otherwise(F.lit("lost"))
    cells = (df.groupBy("device", F.floor((F.col("ts") - t0) / bucket).alias("b"), cls.alias("cls"))
             .agg(F.sum("count").alias("n")))
    per_dev = cells.groupBy("device").agg(F.sum("n").alias("t"))
    n_dev = per_dev.count()
    top = per_dev.orderBy(F.desc("t"), "device").limit(MAX_TIMELINE_DEVICES)
    rows = cells.join(top.select("device"), "device").collect()
    devices = [r["device"] for r in top.collect()]
    return rows, devices, max(n_dev - len(devices), 0)


PROBLEM_MARK = {"lost": ("X", "#d62728", "lost, QoS ≥ 1"), "lost0": ("o", "#9a9a9a", "lost, QoS 0 (allowed)"),
                "duplicated": ("^", "#1f77b4", "duplicated"), "reordered": ("D", "#ff7f0e", "reordered")}


def plot_problems(cells, devices: list, axis: _Axis, bucket: float, spans: list[dict]) -> str:
    """A row per device: a marker per bucket and kind of problem (its area grows with the count)."""
    plt, fig, ax = _figure(height=max(2.5, 1.2 + 0.28 * len(devices)))
    row = {d: i for i, d in enumerate(devices)}
    offset = {"lost": -0.2, "lost0": -0.07, "duplicated": 0.07, "reordered": 0.2}
    for cls, (marker, color, name) in PROBLEM_MARK.items():
        pts = [(axis.x(axis.t0 + (int(r["b"]) + 0.5) * bucket), row[r["device"]] + offset[cls], int(r["n"]))
               for r in cells if r["cls"] == cls]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color,
                       s=[18 + 10 * math.sqrt(p[2]) for p in pts], label=name, zorder=3)
    _overlay(ax, spans, axis)
    ax.set_yticks(range(len(devices)))
    ax.set_yticklabels(devices, fontsize=8)
    ax.set_ylim(len(devices) - 0.5, -0.5)
    ax.set_xlim(0, axis.x(axis.t1))
    ax.set_xlabel(f"{axis.label} ({bucket:g} s buckets)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _svg(plt, fig)


# --- html ------------------------------------------------------------------------------------------

def render_html(ctx: dict) -> str:
    """The page from templates/report.html.j2 (autoescaped; the SVGs are inserted as markup)."""
    from jinja2 import Environment, PackageLoader, select_autoescape

    env = Environment(loader=PackageLoader("ternlab.pipeline", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["ms"] = _fmt_ms
    env.filters["seqs"] = _seqs
    env.filters["when"] = _when
    return env.get_template("report.html.j2").render(**ctx)


def _audit_lost(spark, land, summary: dict, faults: list[dict], delay: float) -> dict:
    """Without a ledger: the audit's lost rows (gaps between the seqs received), the place unknown; a
    gap's flight runs from the send of the message before it (from the run's start at a boot's first
    seqs) to the arrival of the one after it (the audit's ``ts``) plus the landing delay."""
    listed = ((summary.get("problems") or {}).get("lost") or {}).get("listed") or []
    keys = [(p["device"], p["boot"], p["qos"], p["seq"] - 1) for p in listed if p["seq"] > 0]
    prev = {}
    if keys:
        small = spark.createDataFrame(keys, "device string, boot int, qos int, seq long")
        for r in (land.join(F.broadcast(small), list(KEY)).groupBy(*KEY).agg(F.min("sent_ts").alias("s"))
                  .collect()):
            prev[(r["device"], r["boot"], r["qos"], r["seq"] + 1)] = r["s"]
    rows = {"qos1": [], "qos0": []}
    for p in listed:
        r = dict(p, where=losses.UNKNOWN, sent=prev.get((p["device"], p["boot"], p["qos"], p["seq"])),
                 reached=p["ts"], open=p["ts"] is None)
        rows["qos1" if p["qos"] >= 1 else "qos0"].append(_judged(r, faults, delay))
    return {"rows": rows, "counts": None, "delay": delay}


def _problem_lists(summary: dict, lost: dict, t0: float) -> list[dict]:
    """The lists for the page: lost split into QoS >= 1 (the guarantee) and QoS 0 (allowed), each
    row with where it was lost and the fault that overlapped its flight; duplicated and reordered as
    the audit listed them."""
    probs = summary.get("problems") or {}
    counts = lost["counts"]
    out = []
    for sid, kind, title, key in (
            ("lost-qos1", "lost", "Lost at QoS ≥ 1", "qos1"),
            ("lost-qos0", "lost", "Lost at QoS 0 (allowed: QoS 0 is at most once)", "qos0"),
            ("duplicated", "duplicated", "Duplicated", None), ("reordered", "reordered", "Reordered", None)):
        got = probs.get(kind) or {"rows": 0, "messages": 0, "listed": []}
        if key is None:
            rows, more = got["listed"], got["rows"] - len(got["listed"])
        else:
            rows = lost["rows"][key]
            if counts is not None:
                qs = [q for q in counts if (q >= 1) == (key == "qos1")]
                more = sum(c["rows"] for q in qs for c in counts[q].values()) - len(rows)
            else:
                more = got["rows"] - len(got["listed"])
        rows = [dict(p, dt=None if p["ts"] is None else p["ts"] - t0) for p in rows]
        out.append({"id": sid, "kind": kind, "title": title, "rows": rows,
                    "messages": sum(p["count"] for p in rows), "more": more})
    return out


def _where_table(lost: dict) -> list[dict]:
    """Messages lost per QoS at each place (ledger mode; empty without a ledger)."""
    counts = lost["counts"] or {}
    return [{"qos": q, **{w: counts[q].get(w, {}).get("messages", 0) for w in losses.WHERE_TEXT}}
            for q in sorted(counts)]


def run_report(spark: SparkSession, audit_dir: str, out: str, landing: str | None = None,
               bucket: float | None = None, faults: str | None = None, console=None,
               observer: str | None = None) -> dict:
    """Write ``<out>/index.html``; print the terminal summary; return what was written.

    ``faults``: a run's ``faults.jsonl`` to draw (default: ``faults.jsonl`` beside the landing
    directory, when there is one); ``observer``: the copies a subscriber of its own received
    (default: the audit's order reference, else ``received.jsonl`` beside the landing), which say
    where each loss happened; the run's folder (where the fault log is) gives the log links."""
    summary = load_summary(spark, audit_dir)
    landing = landing or summary.get("landing")
    if not landing:
        raise PipelineError("no landing path: pass --landing")
    problems_path = join(audit_dir, "problems")
    if "problems" not in summary or not path_exists(spark, problems_path):
        raise PipelineError(f"{audit_dir} has no problem list (an older audit): run tern audit again")
    if bucket is not None and bucket <= 0:
        raise PipelineError(f"--bucket must be a positive number of seconds, got {bucket}")
    run_dir = landing.rstrip("/").rsplit("/", 1)[0] if "/" in landing.rstrip("/") else None

    def beside(name):
        p = join(run_dir, name) if run_dir else None
        return p if p and path_exists(spark, p) else None

    faults = faults or beside("faults.jsonl")
    observer = observer or summary.get("order_ref") or beside("received.jsonl")
    fault_list = load_faults(spark, faults) if faults else []
    spans = fault_spans(fault_list)
    land = read_landing(spark, landing, written=True)
    t0, t1 = land.agg(F.min("recv_ts"), F.max("recv_ts")).first()
    if t0 is None:
        raise PipelineError(f"no landing rows under {landing}")
    if spans:  # the faults before the first message (or after the last) belong on the axis too
        t0 = min(t0, spans[0]["start"])
        t1 = max(t1, *[s["end"] or s["start"] for s in spans])
    bucket = bucket or pick_bucket(t1 - t0)
    n_buckets = int((t1 - t0) // bucket) + 1
    axis = _Axis(t0, t0 + n_buckets * bucket)
    score = F.col("lost") + F.col("duplicated") + F.col("reordered")
    devices = [r.asDict() for r in spark.read.parquet(join(audit_dir, "devices"))
               .filter(score > 0).orderBy(F.desc(score), "device", "qos")
               .limit(MAX_TABLE_DEVICES).collect()]
    quantiles = latency_quantiles(land)
    cells, timeline_devices, left_out = problem_cells(spark, problems_path, t0, bucket)
    plots = {
        "delivery": plot_delivery(delivery_rows(land, t0, bucket), axis, bucket, n_buckets, spans),
        "latency": plot_latency(quantiles) if quantiles else None,
        "problems": plot_problems(cells, timeline_devices, axis, bucket, spans) if cells else None,
    }
    delay = landing_delay(land)
    led = read_ledger(spark, summary["ledger"], summary.get("ledger_format") or "auto") if summary.get("ledger") else None
    ref = read_order_ref(spark, observer) if observer else None
    if led is not None:
        lost = lost_runs(land, led, ref, fault_list, delay, limit=(summary["problems"].get("limit") or 200))
        for key in lost["rows"]:
            for r in lost["rows"][key]:
                r["ts"] = r["sent"]
    else:
        lost = _audit_lost(spark, land, summary, fault_list, delay)
    reboots = losses.explain_reboots(boot_windows(led if led is not None else land), fault_list)
    logs = run_logs(faults.rsplit("/", 1)[0] if faults and "/" in faults else "." if faults else run_dir, out)
    from markupsafe import Markup

    ctx = {
        "summary": summary, "ok": summary["verdict"]["ok"],
        "qos_rows": [(q, summary["per_qos"][q]) for q in sorted(summary["per_qos"])],
        "plots": {k: (Markup(v) if v else None) for k, v in plots.items()},
        "latency": latency_table(quantiles), "bucket": bucket,
        "lists": _problem_lists(summary, lost, t0), "problems_path": problems_path,
        "where": _where_table(lost), "where_text": losses.WHERE_TEXT, "no_fault": losses.NO_FAULT,
        "observer": observer, "ledger": summary.get("ledger"), "delay": delay,
        "timeline_left_out": left_out, "max_timeline": MAX_TIMELINE_DEVICES,
        "devices": devices, "max_devices": MAX_TABLE_DEVICES,
        "faults": [dict(f, dt=f["start"] - t0, length=None if f["end"] is None else f["end"] - f["start"])
                   for f in fault_list], "faults_path": faults,
        "reboots": reboots, "logs": logs,
    }
    write_bytes(spark, join(out, "index.html"), render_html(ctx).encode())
    print_summary(summary, console)
    return {"index": join(out, "index.html"), "bucket_s": bucket, "faults": len(fault_list),
            "plots": sorted(k for k, v in plots.items() if v), "lost": lost, "reboots": reboots,
            "logs": logs, "observer": observer}
