"""Rollup on real PySpark, checked against a plain-Python computation over the same rows."""

import math
from collections import defaultdict

import pytest
from pyspark.sql import functions as F

from ternlab.pipeline import cli, rollup
from ternlab.pipeline.audit import read_landing
from ternlab.pipeline.generate import generate


@pytest.fixture(scope="module")
def small_set(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("rollup")
    g = generate(spark, str(root / "landing"), n_messages=600, devices=2, boots=1, qos_levels=(1,),
                 loss=0.02, dup=0.05, reorder=0.05, seed=3, counts=False)
    rows = [r.asDict() for r in read_landing(spark, g.landing).collect()]
    assert len(rows) > 600 - 30  # duplicates are in there (checked below), some rows were lost
    return root, g, rows


def python_rollup(rows, window_s, time_col="recv_ts"):
    """(device, window_start_epoch, reading) -> [count, min, max, mean], each message once."""
    seen, acc = set(), defaultdict(list)
    for r in sorted(rows, key=lambda r: r["recv_ts"]):
        key = (r["device"], r["boot"], r["qos"], r["seq"])
        if key in seen or r[time_col] is None:
            continue
        seen.add(key)
        start = math.floor(r[time_col] / window_s) * window_s
        for name, v in r["readings"].items():
            acc[(r["device"], int(start), name)].append(v)
    return {k: (len(v), min(v), max(v), sum(v) / len(v)) for k, v in acc.items()}


def spark_rollup(spark, path):
    df = spark.read.parquet(path).select(
        "device", F.unix_timestamp("window_start").alias("start"),
        (F.unix_timestamp("window_end") - F.unix_timestamp("window_start")).alias("len"),
        "reading", "count", "min", "max", "mean")
    return {(r["device"], r["start"], r["reading"]): (r["count"], r["min"], r["max"], r["mean"], r["len"])
            for r in df.collect()}


def assert_same(got, want):
    assert set(got) == set(want)
    for k, (n, lo, hi, mean) in want.items():
        g = got[k]
        assert (g[0], g[1], g[2]) == (n, lo, hi), k
        assert g[3] == pytest.approx(mean, rel=1e-12), k


def test_batch_rollup_matches_python(spark, small_set):
    root, g, rows = small_set
    keys = [(r["device"], r["boot"], r["qos"], r["seq"]) for r in rows]
    assert len(keys) > len(set(keys))  # duplicates present, and must be counted once
    n = rollup.run_rollup(spark, g.landing, str(root / "batch"), window="1 minute")
    got = spark_rollup(spark, str(root / "batch"))
    want = python_rollup(rows, 60)
    assert n == len(want)
    assert_same({k: v[:4] for k, v in got.items()}, want)
    assert {v[4] for v in got.values()} == {60}
    assert {k[2] for k in got} == {"temp", "hum"}


def test_rollup_cli_on_sent_ts_with_other_window(spark, small_set, capsys):
    root, g, rows = small_set
    out = str(root / "sent30")
    assert cli.main(["rollup", g.landing, "--out", out, "--window", "30 seconds",
                     "--time", "sent_ts"]) == 0
    got = spark_rollup(spark, out)
    assert_same({k: v[:4] for k, v in got.items()}, python_rollup(rows, 30, "sent_ts"))
    assert "rollup rows written" in capsys.readouterr().out


def test_streaming_once_matches_batch_inside_the_watermark(spark, small_set):
    root, g, rows = small_set
    out = str(root / "stream")
    assert cli.main(["rollup", g.landing, "--out", out, "--stream", "--once",
                     "--window", "1 minute", "--watermark", "2 minutes"]) == 0
    got = spark_rollup(spark, out)
    want = python_rollup(rows, 60)
    # append mode emits a window once the watermark (newest event - 2 minutes) has passed its end
    watermark = max(r["recv_ts"] for r in rows) - 120
    closed = {k: v for k, v in want.items() if k[1] + 60 <= watermark}
    assert closed and len(closed) < len(want)
    assert_same({k: v[:4] for k, v in got.items()}, closed)


@pytest.mark.parametrize("extra, needle", [
    (["--window", "banana"], "--window is not an interval such as"),
    (["--once"], "--once and --checkpoint only apply with --stream"),
])
def test_rollup_bad_arguments(spark, small_set, extra, needle, capsys):
    root, g, _ = small_set
    assert cli.main(["rollup", g.landing, "--out", str(root / "bad")] + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_rows_without_their_key_are_an_error_not_merged(spark, tmp_path, capsys):
    # a file without the seq column reads as seq null: the deduplication took all its rows for one
    # message and silently dropped the readings of the others
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ternlab.pipeline.landing import LANDING_ARROW

    rows = [{"device": "d", "boot": 1, "seq": s, "qos": 1, "recv_ts": 1.7e9 + s,
             "readings": [("temp", float(s))]} for s in range(3)]
    d = tmp_path / "date=2023-11-14" / "hour=22"
    d.mkdir(parents=True)
    bad = str(d / "part-c-1.parquet")
    pq.write_table(pa.Table.from_pylist(rows, schema=LANDING_ARROW).drop_columns(["seq"]), bad)
    assert cli.main(["rollup", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tern rollup: error: 3 landing row(s) are unusable: "
                                               "seq=null") and err[0].endswith(bad), err


def test_a_command_from_another_thread_leaves_the_running_session_running(spark, small_set):
    # The active session is per thread: a command run from a thread that did not make the process's
    # session took it for its own and stopped it at the end, under the test (or notebook) using it.
    import threading

    root, g, _ = small_set
    out, status = str(root / "threaded"), []
    t = threading.Thread(target=lambda: status.append(
        cli.main(["rollup", g.landing, "--out", out, "--window", "1 minute"])))
    t.start()
    t.join(300)
    assert status == [0]
    assert spark.read.parquet(out).count() == len(python_rollup(
        [r.asDict() for r in read_landing(spark, g.landing).collect()], 60))
