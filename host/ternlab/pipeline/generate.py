"""A seeded synthetic landing set (and ledger) with known injected losses, duplicates and reorderings.

Generated with Spark expressions over ``spark.range`` (no Python loop per row), so millions of rows take
seconds. Every "random" choice is a hash of (seed, purpose, message key), so a set is reproducible and
its fault counts are known by construction; :func:`generate` returns them.

Layout: ``devices x boots x len(qos_levels)`` streams of ``per_stream`` messages each. In a stream,
message ``seq`` is sent at ``start + boot offset + seq * interval`` and arrives ``5..85 ms`` later, so
arrival order follows ``seq`` except for the injected faults:

- loss (rate per QoS): the message never arrives (the ledger still lists it);
- duplicate: a second copy arrives ``interval / 4`` after the first (it stays next to the original, so it
  never changes the order of final copies);
- reorder: for an even ``seq`` whose successor is delivered, the message arrives ``interval / 2`` after
  its successor -- exactly one reordered message per injection.

Losses after the last delivered message of a boot (the tail) are real losses that only a ledger shows:
``lost_inferred`` in the returned counts leaves them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from . import schema
from .spark import join

START_TS = 1714521600.0  # 2024-05-01T00:00:00Z
READINGS = ("temp", "hum")


@dataclass
class GeneratedSet:
    landing: str
    ledger: str | None
    messages: int                       # distinct messages published (ledger rows)
    rows: int                           # landing rows written (received copies)
    quarantined: int
    expected: dict = field(default_factory=dict)   # (device, qos) -> counts
    totals: dict = field(default_factory=dict)


def _rates(rate, qos_levels) -> dict:
    if isinstance(rate, dict):
        return {q: float(rate.get(q, 0.0)) for q in qos_levels}
    return {q: float(rate) for q in qos_levels}


def messages_frame(spark: SparkSession, *, n_messages: int, devices: int = 4, boots: int = 2,
                   qos_levels=(0, 1, 2), loss=0.0, dup=0.0, reorder=0.0, seed: int = 1,
                   interval: float = 1.0, start_ts: float = START_TS, partitions: int | None = None
                   ) -> tuple[DataFrame, int]:
    """One row per published message with its fault flags (``lost``, ``dup``, ``swap``)."""
    qos_levels = tuple(qos_levels)
    nq = len(qos_levels)
    streams = devices * boots * nq
    per = max(1, -(-n_messages // streams))
    lr = _rates(loss, qos_levels)
    parts = partitions or max(spark.sparkContext.defaultParallelism, streams * per // 1_000_000)
    base = spark.range(0, streams * per, numPartitions=parts)
    stream = F.floor(F.col("id") / per)
    dev_idx = F.floor(stream / (boots * nq))

    def u(tag: str, seq):
        h = F.xxhash64(F.lit(seed), F.lit(tag), F.col("device"), F.col("boot"), F.col("qos"), seq)
        return F.pmod(h, F.lit(1_000_003)) / F.lit(1_000_003.0)

    def lost_at(seq):
        expr = F.lit(False)
        for q in qos_levels:
            expr = F.when(F.col("qos") == q, u("loss", seq) < F.lit(lr[q])).otherwise(expr)
        return expr

    df = base.select(
        F.format_string("dev-%04d", dev_idx.cast("int")).alias("device"),
        ((F.floor(stream / nq) % boots) + 1).cast("int").alias("boot"),
        F.element_at(F.array(*[F.lit(q) for q in qos_levels]), (stream % nq + 1).cast("int"))
        .cast("int").alias("qos"),
        (F.col("id") % per).cast("long").alias("seq"),
        dev_idx.alias("_dev_idx"),
    )
    seq = F.col("seq")
    df = df.select(
        "*",
        lost_at(seq).alias("lost"),
        (F.lit(start_ts) + (F.col("boot") - 1) * F.lit(per * interval + 600.0)
         + F.col("_dev_idx") * F.lit(0.001) + seq * F.lit(interval)).alias("sent_ts"),
        (F.lit(0.005) + u("lat", seq) * F.lit(0.08)).alias("_lat"),
        u("dup", seq).alias("_udup"),
        u("reorder", seq).alias("_ureo"),
        lost_at(seq + 1).alias("_next_lost"),
        u("temp", seq).alias("_ut"),
        u("hum", seq).alias("_uh"),
    )
    df = df.select(
        "*",
        (~F.col("lost") & (F.col("_udup") < F.lit(float(dup)))).alias("dup"),
        ((seq % 2 == 0) & (seq + 1 < F.lit(per)) & ~F.col("lost") & ~F.col("_next_lost")
         & (F.col("_ureo") < F.lit(float(reorder)))).alias("swap"),
    )
    return df, per


def landing_rows(msgs: DataFrame, *, collectors: int = 2, interval: float = 1.0, seed: int = 1
                 ) -> DataFrame:
    """Landing rows (plus ``date``/``hour``) for the delivered messages of :func:`messages_frame`."""
    seq = F.col("seq")
    d = msgs.filter(~F.col("lost")).select(
        "*", F.explode(F.when(F.col("dup"), F.array(F.lit(0), F.lit(1))).otherwise(F.array(F.lit(0))))
        .alias("_copy"))
    recv = (F.col("sent_ts") + F.col("_lat")
            + F.when(F.col("swap"), F.lit(1.5 * interval)).otherwise(F.lit(0.0))
            + F.col("_copy") * F.lit(0.25 * interval))
    temp = F.round(F.lit(20.0) + F.sin(seq / 50.0) * 5.0 + F.col("_ut"), 3)
    hum = F.round(F.lit(40.0) + F.col("_uh") * 10.0, 3)
    d = d.select(
        "device", "boot", "seq", "qos",
        F.concat(F.lit("tern/"), F.col("device"), F.lit("/q"), F.col("qos").cast("string"))
        .alias("topic"),
        "sent_ts", recv.alias("recv_ts"), "_copy",
        F.when(seq % 7 == 0, F.create_map(F.lit("temp"), temp))
        .otherwise(F.create_map(F.lit("temp"), temp, F.lit("hum"), hum)).alias("readings"),
    )
    # one collector per (device, boot, qos) stream: a reordering injected is one in a subscriber's own
    # stream, which is where the audit judges order
    coll = F.pmod(F.xxhash64(F.lit(seed), F.lit("collector"), "device", "boot", "qos"), F.lit(collectors))
    ts = F.timestamp_seconds(F.col("recv_ts"))
    return d.select(
        "device", "boot", "seq", "qos", "topic", "sent_ts", "recv_ts",
        # a per-collector arrival counter: strictly increasing in receive time, like a real collector's
        (F.col("recv_ts") * F.lit(1e6)).cast("long").alias("recv_idx"),
        F.concat(F.lit("col-"), coll.cast("string")).alias("collector"),
        "readings",
        F.lit(None).cast("binary").alias("payload_raw"),
        F.date_format(ts, "yyyy-MM-dd").alias("date"),
        F.date_format(ts, "HH").alias("hour"),
    )


def write_landing(df: DataFrame, root: str) -> None:
    """Write landing rows partitioned by ``date``/``hour`` (computed from ``recv_ts`` if absent)."""
    if "date" not in df.columns:
        ts = F.timestamp_seconds(F.col("recv_ts"))
        df = df.withColumn("date", F.date_format(ts, "yyyy-MM-dd")) \
               .withColumn("hour", F.date_format(ts, "HH"))
    cols = list(schema.LANDING_FIELDS) + ["date", "hour"]
    for c in schema.landing_schema():
        if c.name not in df.columns:
            df = df.withColumn(c.name, F.lit(None).cast(c.dataType))
    df = df.select(*[F.col(c.name).cast(c.dataType) for c in schema.landing_schema()], "date", "hour")
    df.select(*cols).write.mode("overwrite").partitionBy("date", "hour").parquet(root)


def landing_frame(spark: SparkSession, rows: list[dict]) -> DataFrame:
    """A landing DataFrame from a few hand-written rows (missing columns are null / defaults)."""
    full = []
    for r in rows:
        d = {f: None for f in schema.LANDING_FIELDS}
        d.update(r)
        full.append(d)
    s = schema.landing_schema()
    nullable = type(s)([type(f)(f.name, f.dataType, True) for f in s.fields])
    return spark.createDataFrame(full, nullable)


def write_quarantine(spark: SparkSession, root: str, n: int, ts: float = START_TS) -> None:
    rows = [(b"\xff not json %d" % i, "payload is not UTF-8", ts + i, "tern/bad", "col-0")
            for i in range(n)]
    s = schema.quarantine_schema()
    nullable = type(s)([type(f)(f.name, f.dataType, True) for f in s.fields])
    spark.createDataFrame(rows, nullable).write.mode("overwrite").parquet(
        join(root, schema.QUARANTINE_DIR))


def expected_counts(msgs: DataFrame, per: int) -> dict:
    """Fault counts per (device, qos), from the generator's own flags (not from the audit)."""
    stream = msgs.groupBy("device", "boot", "qos").agg(
        F.count(F.lit(1)).alias("n"),
        F.sum(F.col("lost").cast("long")).alias("lost"),
        F.sum(F.col("dup").cast("long")).alias("dup"),
        F.sum(F.col("swap").cast("long")).alias("swap"),
        F.max(F.when(~F.col("lost"), F.col("seq"))).alias("max_recv"),
    )
    # every seq after the last delivered one is lost; those are the invisible tail
    tail = F.lit(per - 1) - F.coalesce(F.col("max_recv"), F.lit(-1))
    per_dq = stream.groupBy("device", "qos").agg(
        F.sum("n").alias("expected"),
        F.sum("lost").alias("lost"),
        F.sum("dup").alias("duplicated"),
        F.sum("swap").alias("reordered"),
        F.sum(F.col("lost") - tail).alias("lost_inferred"),
        F.sum(F.col("n") - tail).alias("expected_inferred"),
    ).collect()
    out = {}
    for r in per_dq:
        d = {k: int(r[k]) for k in ("expected", "lost", "duplicated", "reordered", "lost_inferred",
                                    "expected_inferred")}
        d["unique"] = d["expected"] - d["lost"]
        d["received"] = d["unique"] + d["duplicated"]
        out[(r["device"], int(r["qos"]))] = d
    return out


def generate(spark: SparkSession, landing: str, *, n_messages: int = 10_000, devices: int = 4,
             boots: int = 2, qos_levels=(0, 1, 2), loss=0.0, dup=0.0, reorder=0.0, seed: int = 1,
             collectors: int = 2, ledger: str | None = None, ledger_format: str = "parquet",
             quarantine: int = 0, interval: float = 1.0, counts: bool = True,
             partitions: int | None = None) -> GeneratedSet:
    """Write a landing set to ``landing`` (and a ledger to ``ledger``); return what was injected.

    ``loss`` may be one rate or ``{qos: rate}``; ``dup`` and ``reorder`` are rates per message.
    ``n_messages`` is rounded up to fill every stream equally.
    """
    msgs, per = messages_frame(spark, n_messages=n_messages, devices=devices, boots=boots,
                               qos_levels=qos_levels, loss=loss, dup=dup, reorder=reorder, seed=seed,
                               interval=interval, partitions=partitions)
    write_landing(landing_rows(msgs, collectors=collectors, interval=interval, seed=seed), landing)
    if ledger:
        led = msgs.select(
            *[c for c in schema.LEDGER_FIELDS if c != "topic"],
            F.concat(F.lit("tern/"), F.col("device"), F.lit("/q"), F.col("qos").cast("string"))
            .alias("topic")).select(*schema.LEDGER_FIELDS)
        w = led.write.mode("overwrite")
        (w.json(ledger) if ledger_format == "json" else w.parquet(ledger))
    if quarantine:
        write_quarantine(spark, landing, quarantine)
    expected = expected_counts(msgs, per) if counts else {}
    total_msgs = devices * boots * len(tuple(qos_levels)) * per
    totals = {}
    for d in expected.values():
        for k, v in d.items():
            totals[k] = totals.get(k, 0) + v
    rows = totals["received"] if counts else spark.read.parquet(landing).count()
    return GeneratedSet(landing=landing, ledger=ledger, messages=total_msgs, rows=rows,
                        quarantined=quarantine, expected=expected, totals=totals)
