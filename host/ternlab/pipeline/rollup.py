"""Rollup: per device and tumbling time window, count / min / max / mean of each reading.

The readings map is exploded into ``(reading, value)`` rows; the window is taken on ``recv_ts`` (default)
or ``sent_ts`` (seconds, UTC). Each message counts once: duplicate deliveries of the same
``(device, boot, qos, seq)`` are dropped first (in streaming mode, within the watermark).

Batch mode overwrites a Parquet directory. Streaming mode (:func:`start_stream`) runs the same
aggregation as Structured Streaming over the landing directory with an event-time watermark, appending
each window to a Parquet directory once the watermark has passed its end. With ``once`` (the
availableNow trigger) it processes what is there and stops; windows still open at the end (within the
watermark of the newest event) stay in the checkpointed state until a later run.

Output columns: device, window_start, window_end (timestamps, UTC), reading, count, min, max, mean.
"""

from __future__ import annotations

import re

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from . import schema
from .audit import KEY, LANDING_CHECKED, check_rows, read_landing
from .spark import PipelineError, glob_paths, join, path_exists

TIME_COLUMNS = ("recv_ts", "sent_ts")
OUTPUT_COLS = ["device", "window_start", "window_end", "reading", "count", "min", "max", "mean"]


_UNIT = r"(?:microsecond|millisecond|second|minute|hour|day|week)s?"
_INTERVAL = re.compile(rf"^\s*(?:\d+(?:\.\d+)?\s+{_UNIT}\s*)+$", re.IGNORECASE)


def _check(window: str, time_col: str, watermark: str | None = None) -> None:
    """Validate arguments before any Spark work (Spark would log a stack trace for a bad interval)."""
    if time_col not in TIME_COLUMNS:
        raise PipelineError(f"--time must be one of {', '.join(TIME_COLUMNS)}, got {time_col!r}")
    for name, val in (("--window", window), ("--watermark", watermark)):
        if val is not None and not _INTERVAL.match(val):
            raise PipelineError(f"{name} is not an interval such as '1 minute' or '30 seconds': "
                                f"{val!r}")


def _events(df: DataFrame, time_col: str) -> DataFrame:
    return df.filter(F.col(time_col).isNotNull()).select(
        *KEY, F.col("readings"), F.timestamp_seconds(F.col(time_col)).alias("event_time"))


def _aggregate(events: DataFrame, window: str) -> DataFrame:
    exploded = events.select("device", "event_time",
                             F.explode("readings").alias("reading", "value"))
    g = exploded.groupBy("device", F.window("event_time", window).alias("w"), "reading").agg(
        F.count("value").alias("count"),
        F.min("value").alias("min"),
        F.max("value").alias("max"),
        F.avg("value").alias("mean"),
    )
    return g.select("device", F.col("w.start").alias("window_start"),
                    F.col("w.end").alias("window_end"), "reading", "count", "min", "max", "mean")


def rollup_frame(landing: DataFrame, window: str = "1 minute", time_col: str = "recv_ts"
                 ) -> DataFrame:
    """The batch rollup of a landing DataFrame."""
    return _aggregate(_events(landing, time_col).dropDuplicates(KEY), window)


def run_rollup(spark: SparkSession, landing: str, out: str, window: str = "1 minute",
               time_col: str = "recv_ts") -> int:
    """Batch rollup of ``landing`` into ``out`` (Parquet, overwritten); returns the rows written."""
    _check(window, time_col)
    land = read_landing(spark, landing)
    # rows without their key would all be taken for one message by the deduplication: an error
    check_rows(land, "landing", LANDING_CHECKED)
    df = rollup_frame(land, window, time_col)
    df.write.mode("overwrite").parquet(out)
    return spark.read.parquet(out).count()


def stream_source(spark: SparkSession, landing: str) -> DataFrame:
    """The landing directory as a streaming source (new files under ``date=*/hour=*``)."""
    if not path_exists(spark, landing):
        raise PipelineError(f"landing path not found: {landing}")
    reader = spark.readStream.schema(schema.landing_schema())
    if glob_paths(spark, join(landing, "date=*")):
        return reader.option("basePath", landing).parquet(join(landing, "date=*", "hour=*"))
    return reader.parquet(landing)


def start_stream(spark: SparkSession, landing: str, out: str, window: str = "1 minute",
                 time_col: str = "recv_ts", watermark: str = "2 minutes",
                 checkpoint: str | None = None, once: bool = False):
    """Start the streaming rollup; returns the StreamingQuery (call ``awaitTermination()``)."""
    _check(window, time_col, watermark)
    src = stream_source(spark, landing)
    events = (_events(src, time_col).withWatermark("event_time", watermark)
              .dropDuplicatesWithinWatermark(KEY))
    q = (_aggregate(events, window).writeStream.format("parquet").outputMode("append")
         .option("path", out)
         .option("checkpointLocation", checkpoint or join(out, "_checkpoint")))
    q = q.trigger(availableNow=True) if once else q.trigger(processingTime="10 seconds")
    return q.start()


def run_stream(spark: SparkSession, landing: str, out: str, **kw) -> None:
    """Run the streaming rollup until it stops (with ``once=True``: until the input is processed)."""
    query = start_stream(spark, landing, out, **kw)
    query.awaitTermination()
    if query.exception() is not None:
        raise PipelineError(f"streaming rollup failed: {str(query.exception()).splitlines()[0]}")
