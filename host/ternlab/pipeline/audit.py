"""Delivery audit: per device and QoS, what was expected, received, lost, duplicated, reordered, and
how long delivery took.

Definitions (one *message* is a distinct ``(device, boot, qos, seq)``; a *copy* is one landing row):

- ``received``   -- landing rows (copies);
- ``unique``     -- distinct messages received;
- ``duplicated`` -- ``received - unique``;
- ``expected``   -- with a ledger: distinct messages in the ledger. Without one it is inferred per
  ``(device, boot, qos)`` stream as ``max(seq) + 1`` of what was received, so a gap inside a boot is a
  loss, but messages lost *after the last one received* in a boot (the tail) cannot be seen;
- ``lost``       -- expected messages never received (``expected - unique`` when inferred);
- ``unexpected`` -- (ledger mode) messages received that the ledger does not list;
- ``reordered``  -- MQTT ordering, per ``(device, boot, qos)`` stream *as one subscriber saw it*
  (each collector's landing rows; and, given, an order reference such as the fleet's observer, a
  subscription of its own), in arrival order (``recv_ts``, then ``recv_idx``): the *final copy* of a
  message in that subscriber's stream (its last arrival there) is reordered when it arrives after
  the final copy there of a message with a higher ``seq``. Non-final copies (a duplicate of an
  earlier message that is delivered again later) never count, nor does a backlog that a shared
  subscription split between its members (separate streams: MQTT orders per subscription), nor a
  first copy left behind in one member when the publisher's resend went to another (the landing's
  collectors are one shared subscription: a higher seq outruns a message only with its final copy
  in the whole landing);
- ``latency_p50_ms`` / ``p95`` / ``p99`` -- ``recv_ts - sent_ts`` of each message's *first* arrival, in
  milliseconds (from KLL quantile sketches: exact for groups of up to about ``KLL_K`` messages,
  approximate beyond; messages without ``sent_ts`` are left out);
- ``streams``    -- (device, boot, qos) streams with at least one message received (per device row: the
  boots seen at that QoS).

Verdict (:func:`.judge.verdict`, the one rule the fleet and the demo use too): fails when any
QoS >= 1 message is lost or any QoS 2 message is duplicated.

Which messages: ``<out>/problems`` (Parquet) lists every loss, duplicate and reordering by
``(device, boot, qos, seq)`` -- a run of consecutive lost seqs is one row ``seq..seq_to`` -- with the
time it shows on a timeline (see ``problems()``); ``summary.json`` carries the first ``MAX_LISTED`` of
each kind, QoS >= 1 first, so a failure can be traced to a device's console and the fault behind it.

Input that cannot be audited is an error, never a silent result: a landing or ledger row without a
usable key (device, boot, seq >= 0, qos 0..2; landing: recv_ts) -- such a row would count as a
message of its own and hide a loss -- and a landing set with no rows and no ledger.

Everything runs as Spark transformations: one shuffle of the landing rows by stream, one sort that
serves both the per-message aggregation and the ordering window, one aggregation per device and QoS
(sums and a latency sketch), and the QoS and total levels re-aggregated from those rows. Only the
aggregated rows reach the driver.
"""

from __future__ import annotations

import datetime as _dt
import json
import time

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from . import schema
from . import judge
from .judge import verdict  # noqa: F401  (audit.verdict: the rule, defined once in .judge)
from .spark import PipelineError, glob_count, glob_paths, join, path_exists, write_bytes

KEY = list(judge.KEY)  # a message, and its stream: defined once in .judge
STREAM = list(judge.STREAM)
# expected and lost come from seqs (max seq + 1 per stream without a ledger): each at most
# schema.MAX_SEQ + 1, but their sums over boots and devices would overflow a long, so they are summed
# (and written) as decimal(38,0); the other counts count rows
COUNT = "decimal(38,0)"
COUNT_COLS = ["expected", "received", "unique", "lost", "duplicated", "reordered", "unexpected"]
LATENCY_COLS = ["latency_p50_ms", "latency_p95_ms", "latency_p99_ms"]
# KLL sketch size for the latency percentiles: exact while a group has no more than about this many
# messages, and a rank error of about 0.05 % beyond (DataSketches' KLL bound for k = 8192)
KLL_K = 8192
RESULT_COLS = ["device", "qos"] + COUNT_COLS + LATENCY_COLS + ["streams", "first_recv_ts", "last_recv_ts"]
LANDING_CHECKED = ("device", "boot", "seq", "qos", "recv_ts", "sent_ts")
TAIL_NOTE = ("expected was inferred per (device, boot, qos) as max(seq)+1 of what was received: gaps "
             "inside a boot are counted as lost, but losses at the tail of a boot cannot be seen "
             "without a ledger")


# --- reading ---------------------------------------------------------------------------------------

def read_landing(spark: SparkSession, root: str, written: bool = False) -> DataFrame:
    """Landing rows under ``root`` (``date=*/hour=*`` partitions; else ``root`` is read as is);
    ``written``: also ``written_ts``, when the row's file was written (its modification time)."""
    if not path_exists(spark, root):
        raise PipelineError(f"landing path not found: {root}")
    reader = spark.read.schema(schema.landing_schema())
    parts = glob_paths(spark, join(root, "date=*"))
    if parts:
        # the quarantine/ directory beside the partitions must not take part in partition discovery
        df = reader.option("basePath", root).parquet(*parts)
    elif path_exists(spark, join(root, schema.QUARANTINE_DIR)):
        # no partitions yet (or a flat copy): still never read quarantined payloads as landing rows
        rest = [p for p in glob_paths(spark, join(root, "*"))
                if p.rstrip("/").rsplit("/", 1)[-1] != schema.QUARANTINE_DIR
                and not p.rstrip("/").rsplit("/", 1)[-1].startswith((".", "_"))]
        df = (reader.parquet(*rest) if rest
              else spark.createDataFrame([], schema.landing_schema()))
    else:
        df = reader.parquet(root)
    if not written:
        return df.select(*schema.LANDING_FIELDS)
    when = F.col("_metadata.file_modification_time").cast("double")
    try:  # a file source's hidden column (select analyses at once); the empty frame of a landing has none
        df.select(when)
    except Exception:
        when = F.lit(None).cast("double")
    return df.select(*schema.LANDING_FIELDS, when.alias("written_ts"))


def _why_invalid(fields) -> "F.Column":
    """Why a landing or ledger row cannot be audited (null when it can). A missing key would make
    a message of its own (a row without ``seq`` fills a gap and hides a loss); a column missing from
    a file reads as null; a value the collector would not have landed (``seq`` past
    ``schema.MAX_SEQ``, a time outside years 1..9999) would overflow the jobs' arithmetic. ``fields``
    are the columns checked, each named in the reason."""
    c = F.col

    def bad_time(name, nullable):
        t = c(name)
        return (F.lit(False) if nullable else t.isNull()) | F.isnan(t) | (t < schema.MIN_TS) | (t > schema.MAX_TS)

    checks = {
        "device": c("device").isNull() | (c("device") == ""),
        "boot": c("boot").isNull() | (c("boot") < 0),
        "seq": c("seq").isNull() | (c("seq") < 0) | (c("seq") > schema.MAX_SEQ),
        "qos": c("qos").isNull() | ~c("qos").isin(*schema.QOS_LEVELS),
        "recv_ts": bad_time("recv_ts", False),
        "sent_ts": F.coalesce(bad_time("sent_ts", True), F.lit(False)),
    }
    return F.coalesce(*[F.when(checks[f], F.concat(F.lit(f"{f}="), F.coalesce(
        c(f).cast("string"), F.lit("null")))) for f in fields])


RULES = (f"device, boot, seq, qos must be present, not negative, seq at most {schema.MAX_SEQ}, qos 0..2; "
         "times (seconds since the epoch) within years 1..9999")


def check_rows(df: DataFrame, what: str, fields) -> None:
    """Raise PipelineError naming the first unusable row (its file, the column and value) and how
    many there are; return quietly when every row is usable. Bad rows are never dropped silently."""
    why = _why_invalid(fields)
    bad = df.select(why.alias("why"), F.input_file_name().alias("file")).filter(
        F.col("why").isNotNull())
    first = bad.limit(1).collect()
    if first:
        n = bad.count()
        raise PipelineError(f"{n} {what} row(s) are unusable: {first[0]['why']} ({RULES}); first in "
                            f"{first[0]['file'] or '(unknown file)'}")


def count_quarantine(spark: SparkSession, root: str) -> int:
    """Rows under ``<root>/quarantine/`` (0 when there is none)."""
    q = join(root, schema.QUARANTINE_DIR)
    if not path_exists(spark, q) or glob_count(spark, join(q, "*")) == 0:
        return 0
    return (spark.read.schema(schema.quarantine_schema())
            .option("recursiveFileLookup", "true").parquet(q).count())


def ledger_format(spark: SparkSession, path: str, fmt: str = "auto") -> str:
    if fmt != "auto":
        return fmt
    if path.endswith((".json", ".jsonl", ".ndjson")):
        return "json"
    if any(glob_count(spark, join(path, pat)) for pat in ("*.json", "*.jsonl", "*.ndjson")):
        return "json"
    return "parquet"


def read_ledger(spark: SparkSession, path: str, fmt: str = "auto") -> DataFrame:
    """Ledger rows from Parquet or JSON lines (``fmt`` auto-detects from the file names)."""
    if not path_exists(spark, path):
        raise PipelineError(f"ledger path not found: {path}")
    fmt = ledger_format(spark, path, fmt)
    reader = spark.read.schema(schema.ledger_schema())
    df = reader.json(path, mode="FAILFAST") if fmt == "json" else reader.parquet(path)
    return df.select(*schema.LEDGER_FIELDS)


# --- the job ---------------------------------------------------------------------------------------

def messages(landing: DataFrame, order_ref: DataFrame | None = None) -> DataFrame:
    """One row per distinct message received, with its ordering flag.

    Columns: device, boot, qos, seq, copies, sent_ts, first_recv_ts, final_recv_ts, latency_ms,
    reordered (bool), boot_max_seq (max seq received in the stream).

    Order is judged per *subscriber stream* (MQTT orders messages per subscription, and each member of
    a shared subscription is a stream of its own): the landing rows of one ``collector`` and, given,
    ``order_ref`` (rows ``device, boot, qos, seq, recv_ts`` of a subscriber of its own, the fleet's
    observer: the order reference for the whole stream). In a subscriber's stream of a (device, boot,
    qos), a message is reordered when its final copy there arrives after the final copy there of a
    higher seq; it counts once however many streams show it. The landing's collectors are taken as the
    members of one shared subscription (what ``tern collect --group`` makes): in a collector's stream a
    higher seq outruns a message only with its final copy in the whole landing, so neither a backlog the
    broker split between the members nor a publisher's resend routed to another member than the first
    copy is a reordering, while a collector whose own copies came out of order still is.
    ``order_ref`` rows never count as copies.

    One shuffle (by stream); per subscriber the rows are grouped by ``(stream, subscriber, -seq)``,
    so the sort the aggregation needs is also the order the window needs, highest seq first. In that
    order a message's final copy is reordered exactly when some message with a higher seq (a row
    before it) had its final copy arrive earlier -- a running minimum of the final arrivals over the
    preceding rows (equivalent to sorting by final arrival and looking for a higher seq before it,
    which costs a second sort). The per-subscriber rows are then summed per message.
    """
    arr = F.struct(F.col("recv_ts").alias("ts"), F.coalesce(F.col("recv_idx"), F.lit(-1)).alias("idx"))
    rows = landing.select(*STREAM, (-F.col("seq")).alias("_nseq"), "sent_ts",
                          F.concat(F.lit("c:"), F.coalesce("collector", F.lit(""))).alias("_sub"),
                          arr.alias("arr"), F.lit(1).alias("_copy"))
    if order_ref is not None:
        rows = rows.unionByName(order_ref.select(
            *STREAM, (-F.col("seq")).alias("_nseq"), F.lit(None).cast("double").alias("sent_ts"),
            F.lit("ref").alias("_sub"),
            F.struct(F.col("recv_ts").cast("double").alias("ts"), F.lit(-1).cast("long").alias("idx"))
            .alias("arr"),
            F.lit(0).alias("_copy")))
    rows = rows.repartition(*STREAM)
    copy = F.col("_copy") == 1
    per_sub = rows.groupBy(*STREAM, "_sub", "_nseq").agg(
        F.sum("_copy").alias("copies"),
        F.min(F.when(copy, F.col("sent_ts"))).alias("sent_ts"),
        F.min(F.when(copy, F.col("arr"))).alias("first"),
        F.max(F.when(copy, F.col("arr"))).alias("final"),
        F.max("arr").alias("_sub_final"),
    )
    # A higher seq's copy in a collector's stream outruns a message only if it is that higher seq's
    # final copy in the whole landing: the collectors are the members of one shared subscription, and a
    # publisher's resend may go to another member than its first copy did, after which the first copy
    # that stayed behind says nothing about order (a collector's own final copies are still judged)
    whole = F.max("final").over(Window.partitionBy(*STREAM, "_nseq"))
    per_sub = per_sub.withColumn("_lead", F.when((F.col("_sub") == "ref") | (F.col("final") == whole),
                                                 F.col("_sub_final")))
    w = Window.partitionBy(*STREAM, "_sub").orderBy("_nseq")
    # (ts, idx) of the earliest such arrival among messages with a higher seq; ties go to the lower seq
    earliest_after = F.min("_lead").over(w.rowsBetween(Window.unboundedPreceding, -1))
    flagged = per_sub.select(
        "*", F.coalesce(earliest_after < F.col("_sub_final"), F.lit(False)).cast("int").alias("_reo"))
    msgs = (flagged.groupBy(*STREAM, "_nseq")
            .agg(F.sum("copies").alias("copies"), F.min("sent_ts").alias("sent_ts"),
                 F.min("first").alias("first"), F.max("final").alias("final"),
                 F.max("_reo").alias("_reo"))
            .filter(F.col("copies") > 0))
    top = F.min("_nseq").over(Window.partitionBy(*STREAM))
    return msgs.select(
        *STREAM, (-F.col("_nseq")).alias("seq"), "copies", "sent_ts",
        F.col("first.ts").alias("first_recv_ts"),
        F.col("final.ts").alias("final_recv_ts"),
        ((F.col("first.ts") - F.col("sent_ts")) * 1000.0).alias("latency_ms"),
        (F.col("_reo") > 0).alias("reordered"),
        (-top).alias("boot_max_seq"),
    )


PROBLEM_KINDS = ("lost", "duplicated", "reordered")
PROBLEM_COLS = ["kind", "device", "boot", "qos", "seq", "seq_to", "count", "ts"]
MAX_LISTED = 200  # rows of each kind in summary.json; <out>/problems holds them all


def problems(m: DataFrame, ledger: DataFrame | None = None) -> DataFrame:
    """Which messages were lost, duplicated or reordered, from ``messages()`` (and the ledger):
    rows ``(kind, device, boot, qos, seq, seq_to, count, ts)``.

    - ``lost``: one row per run of consecutive lost seqs of a stream, ``seq..seq_to``, ``count`` of
      them; ``ts`` is the ledger's send time of the first (with a ledger), else the arrival of the
      first message after the gap (tail losses are invisible without a ledger);
    - ``duplicated``: one row per message received more than once, ``count`` extra copies, ``ts`` its
      last arrival;
    - ``reordered``: one row per reordered message (``count`` 1), ``ts`` its final arrival.

    The counts add up to the audit's ``lost``, ``duplicated`` and ``reordered``.
    """
    def one(df, kind, seq_to, count, ts):
        return df.select(F.lit(kind).alias("kind"), "device", "boot", "qos", "seq",
                         seq_to.alias("seq_to"), count.cast("long").alias("count"),
                         ts.cast("double").alias("ts"))

    w = Window.partitionBy(*STREAM).orderBy("seq")
    if ledger is not None:
        missing = (ledger.select(*KEY, "sent_ts").dropDuplicates(KEY)
                   .join(m.select(*KEY), KEY, "left_anti"))
        # gaps and islands: consecutive seqs share seq - row_number
        runs = (missing.withColumn("_run", F.col("seq") - F.row_number().over(w))
                .groupBy(*STREAM, "_run")
                .agg(F.min("seq").alias("seq"), F.max("seq").alias("_to"),
                     F.count(F.lit(1)).alias("_n"), F.min_by("sent_ts", "seq").alias("_ts")))
        lost = one(runs, "lost", F.col("_to"), F.col("_n"), F.col("_ts"))
    else:
        gaps = (m.select(*STREAM, "seq", "first_recv_ts", F.lag("seq", 1, -1).over(w).alias("_prev"))
                .filter(F.col("seq") - F.col("_prev") > 1)
                .select(*STREAM, (F.col("_prev") + 1).alias("seq"), (F.col("seq") - 1).alias("_to"),
                        (F.col("seq") - F.col("_prev") - 1).alias("_n"), "first_recv_ts"))
        lost = one(gaps, "lost", F.col("_to"), F.col("_n"), F.col("first_recv_ts"))
    dup = one(m.filter(F.col("copies") > 1), "duplicated", F.col("seq"), F.col("copies") - 1,
              F.col("final_recv_ts"))
    reo = one(m.filter(F.col("reordered")), "reordered", F.col("seq"), F.lit(1), F.col("final_recv_ts"))
    return lost.unionByName(dup).unionByName(reo)


def listed_problems(df: DataFrame, limit: int = MAX_LISTED) -> dict:
    """The first ``limit`` rows of each kind of a ``problems()`` frame (QoS >= 1 first, then device,
    boot, seq) and how many rows and messages each kind has, in one job:
    ``{kind: {"rows": n, "messages": n, "listed": [row dicts]}}``."""
    w = Window.partitionBy("kind")
    order = w.orderBy((F.col("qos") == 0), "device", "boot", "seq")
    rows = (df.select(*PROBLEM_COLS, F.row_number().over(order).alias("_k"),
                      F.count(F.lit(1)).over(w).alias("_rows"),
                      F.sum(F.col("count").cast(COUNT)).over(w).alias("_msgs"))
            .filter(F.col("_k") <= limit).orderBy("kind", "_k").collect())
    out = {k: {"rows": 0, "messages": 0, "listed": []} for k in PROBLEM_KINDS}
    for r in rows:
        d = out[r["kind"]]
        d["rows"], d["messages"] = int(r["_rows"]), int(r["_msgs"])
        d["listed"].append({c: r[c] for c in PROBLEM_COLS if c != "kind"})
    return out


SUM_COLS = ["expected", "received", "unique", "unexpected", "reordered", "streams"]


def audit_frame(landing: DataFrame, ledger: DataFrame | None = None,
                sketch_k: int = KLL_K, msgs: DataFrame | None = None,
                order_ref: DataFrame | None = None) -> DataFrame:
    """The audit as one DataFrame with a ``level`` column: ``device`` rows (per device and QoS),
    ``qos`` rows (device null) and one ``total`` row (device and qos null).

    The messages are aggregated once, per (qos, device), into sums and a KLL sketch of the latency; the
    qos and total levels re-aggregate those few rows and merge their sketches (no rollup over the
    messages, which would feed every message to three aggregations)."""
    m = msgs if msgs is not None else messages(landing, order_ref)
    if ledger is None:
        is_last = F.col("seq") == F.col("boot_max_seq")
        rows = m.select(
            "qos", "device", "copies", "first_recv_ts", "final_recv_ts", "latency_ms", "reordered",
            F.when(is_last, F.col("boot_max_seq") + 1).otherwise(F.lit(0)).alias("_expected"),
            F.lit(1).alias("_received_msg"),
            F.lit(0).alias("_unexpected"),
            is_last.cast("int").alias("_stream"),
        )
    else:
        led = (ledger.select(*KEY, F.col("sent_ts").alias("ledger_sent_ts"))
               .dropDuplicates(KEY).withColumn("_in_ledger", F.lit(1)))
        j = m.join(led, KEY, "full_outer")
        got = F.col("copies").isNotNull()
        rows = j.select(
            "qos", "device",
            F.coalesce("copies", F.lit(0)).alias("copies"),
            "first_recv_ts", "final_recv_ts",
            ((F.col("first_recv_ts") - F.coalesce("sent_ts", "ledger_sent_ts")) * 1000.0)
            .alias("latency_ms"),
            F.coalesce("reordered", F.lit(False)).alias("reordered"),
            F.coalesce("_in_ledger", F.lit(0)).alias("_expected"),
            got.cast("int").alias("_received_msg"),
            (got & F.col("_in_ledger").isNull()).cast("int").alias("_unexpected"),
            (F.col("seq") == F.col("boot_max_seq")).cast("int").alias("_stream"),
        )
    k = F.lit(sketch_k)
    dev = rows.groupBy("qos", "device").agg(
        F.sum(F.col("_expected").cast(COUNT)).alias("expected"),
        F.sum("copies").alias("received"),
        F.sum("_received_msg").alias("unique"),
        F.sum("_unexpected").alias("unexpected"),
        F.sum(F.col("reordered").cast("int")).alias("reordered"),
        F.sum("_stream").alias("streams"),
        F.kll_sketch_agg_double("latency_ms", k).alias("_sketch"),
        F.min("first_recv_ts").alias("first_recv_ts"),
        F.max("final_recv_ts").alias("last_recv_ts"),
    )

    def up(df: DataFrame, keys: list, level: str) -> DataFrame:
        return df.groupBy(*keys).agg(
            *[F.sum(c).alias(c) for c in SUM_COLS],
            F.kll_merge_agg_double("_sketch", k).alias("_sketch"),
            F.min("first_recv_ts").alias("first_recv_ts"),
            F.max("last_recv_ts").alias("last_recv_ts"),
        ).select(F.lit(level).alias("level"),
                 *[F.col(c) if c in keys else F.lit(None).alias(c) for c in ("device", "qos")], "*")

    cols = ["level", "device", "qos", *SUM_COLS, "_sketch", "first_recv_ts", "last_recv_ts"]
    levels = (dev.select(F.lit("device").alias("level"), "*").select(*cols)
              .unionByName(up(dev, ["qos"], "qos").select(*cols))
              .unionByName(up(dev, [], "total").select(*cols)))
    # unique counts received messages that the ledger lists plus unexpected ones; lost only the former
    lost = F.col("expected") - (F.col("unique") - F.col("unexpected"))
    have = F.kll_sketch_get_n_double("_sketch") > 0

    def pct(p: float):
        return F.when(have, F.kll_sketch_get_quantile_double("_sketch", F.lit(p)))

    return levels.select(
        "level", F.col("device").cast("string"), F.col("qos").cast("int"),
        F.col("expected").cast(COUNT), *[F.col(c).cast("long").alias(c) for c in ("received", "unique")],
        lost.cast(COUNT).alias("lost"),
        (F.col("received") - F.col("unique")).cast("long").alias("duplicated"),
        F.col("reordered").cast("long"), F.col("unexpected").cast("long"),
        pct(0.5).alias("latency_p50_ms"), pct(0.95).alias("latency_p95_ms"),
        pct(0.99).alias("latency_p99_ms"),
        F.coalesce(F.col("streams"), F.lit(0)).cast("long").alias("streams"), "first_recv_ts", "last_recv_ts",
    )


def _plain(row) -> dict:
    """A result row as JSON can hold it (the decimal counts as ints)."""
    import decimal

    d = {k: int(v) if isinstance(v, decimal.Decimal) else v for k, v in row.asDict().items()}
    d.pop("level", None)
    return d


def read_order_ref(spark: SparkSession, path: str) -> DataFrame:
    """An order reference: rows ``device, boot, qos, seq, recv_ts`` (JSON lines, e.g. the fleet's
    ``received.jsonl``, or Parquet) of one subscriber of its own, in any order."""
    if not path_exists(spark, path):
        raise PipelineError(f"order reference not found: {path}")
    from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType

    sch = StructType([StructField("device", StringType()), StructField("boot", IntegerType()),
                      StructField("qos", IntegerType()), StructField("seq", LongType()),
                      StructField("recv_ts", DoubleType())])
    reader = spark.read.schema(sch)
    df = reader.json(path, mode="FAILFAST") if ledger_format(spark, path) == "json" else reader.parquet(path)
    return df.select(*STREAM, "seq", "recv_ts")


def run_audit(spark: SparkSession, landing: str, out: str, ledger: str | None = None,
              ledger_fmt: str = "auto", order_ref: str | None = None) -> dict:
    """Audit ``landing`` (and ``ledger``; ``order_ref``: a subscriber's own copies, see
    :func:`messages`), write ``<out>/devices`` (Parquet, one row per device and
    QoS) and ``<out>/summary.json``; return the summary."""
    t0 = time.monotonic()
    land = read_landing(spark, landing)
    led = read_ledger(spark, ledger, ledger_fmt) if ledger else None
    check_rows(land, "landing", LANDING_CHECKED)
    if led is not None:
        check_rows(led, "ledger", ("device", "boot", "seq", "qos", "sent_ts"))
    elif not land.take(1):
        # nothing received and nothing expected: a PASS would hide a collector writing elsewhere
        raise PipelineError(f"no landing rows under {landing}: nothing to audit (give --ledger to "
                            "count everything as lost)")
    ref = None
    if order_ref:
        ref = read_order_ref(spark, order_ref)
        check_rows(ref, "order reference", ("device", "boot", "seq", "qos", "recv_ts"))
    msgs = messages(land, ref).cache()  # the audit and the problem list both read it
    result = audit_frame(land, led, msgs=msgs).cache()
    try:
        devices = (result.filter(F.col("level") == "device").select(*RESULT_COLS)
                   .orderBy("device", "qos"))
        devices.write.mode("overwrite").parquet(join(out, "devices"))
        levels = result.filter(F.col("level") != "device").collect()
        problems(msgs, led).write.mode("overwrite").parquet(join(out, "problems"))
    finally:
        result.unpersist()
        msgs.unpersist()
    listed = listed_problems(spark.read.parquet(join(out, "problems")))
    total = next((_plain(r) for r in levels if r["level"] == "total"), {})
    per_qos = {str(r["qos"]): _plain(r) for r in levels if r["level"] == "qos"}
    for d in [total, *per_qos.values()]:
        if d:
            d.pop("device", None)
            d.pop("qos", None)
    n_devices = spark.read.parquet(join(out, "devices")).select("device").distinct().count()
    summary = {
        "landing": landing,
        "ledger": ledger,
        "ledger_format": ledger_format(spark, ledger, ledger_fmt) if ledger else None,
        "expected_from": "ledger" if ledger else "inferred",
        "order_ref": order_ref,
        "order": "per subscriber stream (each collector" + (", and the order reference)" if order_ref else ")"),
        "note": None if ledger else TAIL_NOTE,
        "devices": n_devices,
        "quarantined": count_quarantine(spark, landing),
        "totals": {**total, **{c: total.get(c) or 0 for c in COUNT_COLS}},
        "per_qos": per_qos,
        "verdict": verdict(per_qos),
        "problems": {"path": join(out, "problems"), "limit": MAX_LISTED, **listed},
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "elapsed_s": round(time.monotonic() - t0, 3),
        "spark": {"master": spark.sparkContext.master, "version": spark.version},
    }
    write_bytes(spark, join(out, "summary.json"),
                json.dumps(summary, indent=2, sort_keys=True).encode())
    return summary
