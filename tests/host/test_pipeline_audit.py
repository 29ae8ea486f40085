"""The delivery audit on real PySpark: generated sets with known faults, hand-built ordering cases,
the verdict and the exit status of `audit`, and the Java check."""

import json
import os
import subprocess
import sys

import pytest

from ternlab.pipeline import audit, cli
from ternlab.pipeline.generate import generate, landing_frame

COUNTS = ("expected", "received", "unique", "lost", "duplicated", "reordered")


def device_rows(spark, out):
    return {(r["device"], r["qos"]): r.asDict()
            for r in spark.read.parquet(out + "/devices").collect()}


def test_generated_set_really_has_faults(fleet_set):
    t = fleet_set.totals
    assert t["lost"] > 0 and t["duplicated"] > 0 and t["reordered"] > 0
    # some QoS 0 losses sit at the tail of a boot, where only the ledger can see them
    assert t["lost"] > t["lost_inferred"] > 0
    assert len(fleet_set.expected) == 3 * 3


def test_audit_with_ledger_reports_exactly_the_injected_faults(spark, fleet_set, tmp_path):
    summary = audit.run_audit(spark, fleet_set.landing, str(tmp_path / "a"), ledger=fleet_set.ledger)
    got = device_rows(spark, str(tmp_path / "a"))
    assert set(got) == set(fleet_set.expected)
    for key, want in fleet_set.expected.items():
        assert {c: got[key][c] for c in COUNTS} == {c: want[c] for c in COUNTS}, key
        assert got[key]["unexpected"] == 0
    assert summary["expected_from"] == "ledger"
    assert summary["totals"]["lost"] == fleet_set.totals["lost"]
    assert summary["quarantined"] == fleet_set.quarantined


def test_audit_without_ledger_infers_expected_per_boot(spark, fleet_set, fleet_audit):
    out, summary = fleet_audit
    got = device_rows(spark, out)
    for key, want in fleet_set.expected.items():
        assert got[key]["expected"] == want["expected_inferred"], key
        assert got[key]["lost"] == want["lost_inferred"], key
        for c in ("received", "unique", "duplicated", "reordered"):
            assert got[key][c] == want[c], (key, c)
    assert summary["expected_from"] == "inferred" and "tail of a boot" in summary["note"]
    # the summary levels agree with the device rows
    for q in ("0", "1", "2"):
        for c in COUNTS:
            assert summary["per_qos"][q][c] == sum(r[c] for k, r in got.items() if k[1] == int(q))
    for c in COUNTS:
        assert summary["totals"][c] == sum(r[c] for r in got.values())
    assert summary["devices"] == 3
    # and what was written is what was returned
    with open(os.path.join(out, "summary.json")) as f:
        assert json.load(f)["totals"] == summary["totals"]


def test_latency_percentiles_are_those_of_first_arrivals(spark, fleet_set, fleet_audit):
    out, summary = fleet_audit
    first = {}
    for r in audit.read_landing(spark, fleet_set.landing).collect():
        k = (r["device"], r["boot"], r["qos"], r["seq"])
        first[k] = min(first.get(k, (float("inf"), 0)), (r["recv_ts"], r["sent_ts"]))
    lat = sorted((recv - sent) * 1000.0 for recv, sent in first.values())
    for p, col in ((0.5, "latency_p50_ms"), (0.95, "latency_p95_ms"), (0.99, "latency_p99_ms")):
        # the smallest value with at least p of the values at or below it
        want = next(v for i, v in enumerate(lat) if (i + 1) >= p * len(lat))
        assert summary["totals"][col] == pytest.approx(want, abs=1e-6)


def test_json_ledger_gives_the_same_result(spark, fleet_set, tmp_path):
    js = str(tmp_path / "ledger.jsonl")
    spark.read.parquet(fleet_set.ledger).coalesce(1).write.json(js)
    s = audit.run_audit(spark, fleet_set.landing, str(tmp_path / "a"), ledger=js)
    assert s["ledger_format"] == "json"
    assert {c: s["totals"][c] for c in COUNTS} == {c: fleet_set.totals[c] for c in COUNTS}


def _ordering_cases(spark):
    """Each device is one case: (device, [(seq, recv_ts, recv_idx), ...]) in boot 1, QoS 1."""
    cases = {
        # a duplicate of an earlier message arrives after a later one, but every final copy is in order
        "dup-of-earlier": [(0, 1.0, None), (1, 2.0, None), (2, 3.0, None), (1, 4.0, None),
                           (2, 5.0, None)],
        # the final copy of 1 arrives after the final copy of 2
        "late-final-copy": [(0, 1.0, None), (1, 2.0, None), (2, 3.0, None), (1, 4.0, None)],
        # an early first copy of 2 does not matter: its final copy comes after 1
        "early-first-copy": [(0, 1.0, None), (2, 2.0, None), (1, 3.0, None), (2, 4.0, None)],
        # equal receive times: recv_idx decides the arrival order
        "tie-idx-swapped": [(0, 1.0, 10), (1, 5.0, 12), (2, 5.0, 11)],
        "tie-idx-in-order": [(0, 1.0, 10), (1, 5.0, 11), (2, 5.0, 12)],
        # 3 and 1 both arrive after 4: two reordered messages, and seq 2 is a loss
        "two-late": [(0, 1.0, None), (4, 2.0, None), (3, 3.0, None), (1, 4.0, None)],
    }
    rows = [{"device": d, "boot": 1, "qos": 1, "seq": s, "recv_ts": 100.0 + t, "sent_ts": 100.0,
             "recv_idx": i} for d, arr in cases.items() for s, t, i in arr]
    # a second boot whose first message arrives late relative to boot 1 is not reordered:
    # streams are (device, boot, qos)
    rows += [{"device": "two-boots", "boot": b, "qos": 2, "seq": s, "recv_ts": t, "sent_ts": None}
             for b, s, t in ((2, 0, 1.0), (2, 1, 2.0), (1, 0, 3.0), (1, 1, 4.0))]
    return landing_frame(spark, rows)


def test_ordering_definition(spark):
    res = {r["device"]: r.asDict() for r in audit.audit_frame(_ordering_cases(spark))
           .filter("level = 'device'").collect()}
    assert res["dup-of-earlier"]["reordered"] == 0
    assert res["dup-of-earlier"]["duplicated"] == 2
    assert res["late-final-copy"]["reordered"] == 1
    assert res["late-final-copy"]["duplicated"] == 1
    assert res["early-first-copy"]["reordered"] == 0
    assert res["tie-idx-swapped"]["reordered"] == 1
    assert res["tie-idx-in-order"]["reordered"] == 0
    assert res["two-late"]["reordered"] == 2
    assert (res["two-late"]["expected"], res["two-late"]["lost"]) == (5, 1)
    assert res["two-boots"]["reordered"] == 0 and res["two-boots"]["streams"] == 2
    assert res["two-boots"]["latency_p50_ms"] is None  # no send times, no latency


def _subscriber_cases(spark):
    """Landing rows with their collector, and an order reference (the observer's copies): each device
    is one case, boot 1, QoS 2 (the resends: QoS 1). ``(collector, seq, recv_ts)``; ``ref``: ``(seq, recv_ts)``."""
    cases = {
        # a backlog the broker split between the two members of the shared subscription: each
        # collector's own stream is in order, across them it is not -- and the observer's is in order
        "split-backlog": ([("col-a", 0, 1.0), ("col-a", 3, 2.0), ("col-b", 1, 3.0), ("col-b", 2, 4.0)],
                          [(0, 1.0), (1, 1.1), (2, 1.2), (3, 1.3)]),
        # one collector got its copies out of order: a real reordering, whatever the other one saw
        "one-stream-out-of-order": ([("col-a", 0, 1.0), ("col-a", 2, 2.0), ("col-a", 1, 3.0),
                                     ("col-b", 3, 4.0)], []),
        # the collectors' streams are in order, the observer (one subscription, the whole stream) saw
        # 2 before 1: reordered once, though the landing alone could not show it
        "observer-out-of-order": ([("col-a", 0, 1.0), ("col-a", 1, 2.0), ("col-b", 2, 1.5)],
                                  [(0, 1.0), (2, 1.5), (1, 2.0)]),
        # a publisher's resend after a power cut, which the shared subscription routed otherwise than
        # the first copies: col-b holds 3's first copy, then 1's resend; 3's resend (its final copy)
        # went to col-a. Each member's final copies are in order: no reordering (fleet, 2026-11-28)
        "resend-split": ([("col-a", 0, 1.0), ("col-a", 1, 1.1), ("col-a", 2, 1.2), ("col-b", 3, 1.3),
                          ("col-b", 1, 2.0), ("col-a", 2, 2.1), ("col-a", 3, 2.2)], []),
        # the same, but col-a's final copies are out of order (3's resend before 2's): reordered once
        "resend-split-out-of-order": ([("col-a", 0, 1.0), ("col-a", 1, 1.1), ("col-a", 2, 1.2),
                                       ("col-b", 3, 1.3), ("col-b", 1, 2.0), ("col-a", 3, 2.1),
                                       ("col-a", 2, 2.2)], []),
        # col-a's own copies out of order (2 before 1), and 1 was later delivered again to col-b: the
        # resend does not hide col-a's reordering
        "resend-after-reorder": ([("col-a", 0, 1.0), ("col-a", 2, 1.1), ("col-a", 1, 1.2),
                                  ("col-b", 1, 2.0)], []),
        # both a collector and the observer saw it: still one reordered message
        "both-out-of-order": ([("col-a", 0, 1.0), ("col-a", 2, 2.0), ("col-a", 1, 3.0)],
                              [(0, 1.0), (2, 2.0), (1, 3.0)]),
    }
    rows = [{"device": d, "boot": 1, "qos": 1 if d.startswith("resend") else 2, "seq": s,  # resends: QoS 1
             "recv_ts": 100.0 + t, "sent_ts": 100.0, "collector": c}
            for d, (land, _) in cases.items() for c, s, t in land]
    ref = [(d, 1, 2, s, 100.0 + t) for d, (_, r) in cases.items() for s, t in r]
    return landing_frame(spark, rows), spark.createDataFrame(
        ref, "device string, boot int, qos int, seq long, recv_ts double")


def test_order_is_judged_per_subscriber_stream(spark):
    land, ref = _subscriber_cases(spark)
    res = {r["device"]: r.asDict() for r in audit.audit_frame(land, order_ref=ref)
           .filter("level = 'device'").collect()}
    assert res["split-backlog"]["reordered"] == 0
    assert res["one-stream-out-of-order"]["reordered"] == 1
    assert res["observer-out-of-order"]["reordered"] == 1
    assert res["both-out-of-order"]["reordered"] == 1
    assert res["resend-split"]["reordered"] == 0
    assert res["resend-split-out-of-order"]["reordered"] == 1
    assert res["resend-after-reorder"]["reordered"] == 1
    # the observer's copies are an order reference only: they are not landing copies
    assert {d: (r["received"], r["unique"], r["duplicated"]) for d, r in res.items()} == {
        "split-backlog": (4, 4, 0), "one-stream-out-of-order": (4, 4, 0),
        "observer-out-of-order": (3, 3, 0), "both-out-of-order": (3, 3, 0),
        "resend-split": (7, 4, 3), "resend-split-out-of-order": (7, 4, 3), "resend-after-reorder": (4, 3, 1)}
    # without the reference, only what the collectors' own streams show
    alone = {r["device"]: r["reordered"] for r in audit.audit_frame(land)
             .filter("level = 'device'").collect()}
    assert alone == {"split-backlog": 0, "one-stream-out-of-order": 1, "observer-out-of-order": 0,
                     "both-out-of-order": 1, "resend-split": 0, "resend-split-out-of-order": 1,
                     "resend-after-reorder": 1}


def test_order_reference_from_the_cli(spark, tmp_path, capsys):
    """`tern audit --order-ref received.jsonl` (the fleet's observer copies): the reordering the
    observer saw is in the summary and the problem list; the verdict stays on losses and QoS 2
    duplicates."""
    land, ref = _subscriber_cases(spark)
    from ternlab.pipeline.generate import write_landing

    write_landing(land, str(tmp_path / "landing"))
    with open(tmp_path / "received.jsonl", "w") as f:
        for r in ref.collect():
            f.write(json.dumps(r.asDict()) + "\n")
    assert cli.main(["audit", str(tmp_path / "landing"), "--out", str(tmp_path / "a"), "--quiet",
                     "--order-ref", str(tmp_path / "received.jsonl")]) == 0
    with open(tmp_path / "a" / "summary.json") as f:
        s = json.load(f)
    assert s["totals"]["reordered"] == 5
    listed = {(r["device"], r["seq"]) for r in s["problems"]["reordered"]["listed"]}
    assert listed == {("one-stream-out-of-order", 1), ("observer-out-of-order", 1), ("both-out-of-order", 1),
                      ("resend-split-out-of-order", 2), ("resend-after-reorder", 1)}


@pytest.mark.parametrize("per_qos, ok", [
    ({"0": {"lost": 5, "duplicated": 3}, "1": {"lost": 0, "duplicated": 4},
      "2": {"lost": 0, "duplicated": 0}}, True),
    ({"0": {"lost": 0, "duplicated": 0}, "1": {"lost": 1, "duplicated": 0}}, False),
    ({"2": {"lost": 1, "duplicated": 0}}, False),
    ({"2": {"lost": 0, "duplicated": 1}}, False),
])
def test_verdict(per_qos, ok):
    v = audit.verdict(per_qos)
    assert v["ok"] is ok
    assert bool(v["reasons"]) is not ok


def test_audit_exit_status(spark, fleet_set, tmp_path, capsys):
    # the generated fleet loses QoS 1/2 messages and duplicates QoS 2 ones: status 1
    assert cli.main(["audit", fleet_set.landing, "--out", str(tmp_path / "bad"), "--quiet"]) == 1
    # losses only at QoS 0, duplicates and reorderings allowed at QoS 1: status 0
    clean = generate(spark, str(tmp_path / "clean"), n_messages=600, devices=2, boots=1,
                     qos_levels=(0, 1), loss={0: 0.1}, dup=0.05, reorder=0.05, seed=5,
                     counts=False)
    assert cli.main(["audit", clean.landing, "--out", str(tmp_path / "ok")]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out
    with open(tmp_path / "ok" / "summary.json") as f:
        s = json.load(f)
    assert s["verdict"]["ok"] and s["per_qos"]["0"]["lost"] > 0 and s["per_qos"]["1"]["duplicated"] > 0


@pytest.mark.parametrize("argv, needle", [
    (["audit", "/nonexistent/landing", "--out", "/tmp/x"], "landing path not found: /nonexistent"),
    (["audit", "LANDING", "--out", "/tmp/x", "--ledger", "/nonexistent/ledger"], "ledger path not found"),
    (["audit", "LANDING", "--out", "/tmp/x", "--conf", "spark.foo"], "--conf expects key=value"),
    # Spark's own failure here is a Python traceback about the Java gateway, and status 1 (= FAIL)
    (["audit", "LANDING", "--out", "/tmp/x", "--master", "banana"],
     "--master 'banana' is not a Spark master URL"),
])
def test_bad_input_is_one_clear_line(argv, needle, capsys, tmp_path):
    (tmp_path / "landing" / ".tern").mkdir(parents=True)  # a collector's landing, nothing landed yet
    argv = [str(tmp_path / "landing") if a == "LANDING" else a for a in argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and err[0].startswith("tern audit: error:")


def _run_cli_without_java(tmp_path, env_update):
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env.update(env_update)
    (tmp_path / "landing" / ".tern").mkdir(parents=True, exist_ok=True)  # a collector's landing
    return subprocess.run([sys.executable, "-m", "ternlab.pipeline.cli", "audit", str(tmp_path / "landing"),
                           "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("how", ["empty-path", "empty-java-home", "java-11"])
def test_java_missing_or_old_is_one_clear_line(tmp_path, how):
    empty = tmp_path / "empty"
    empty.mkdir()
    if how == "empty-path":
        env = {"PATH": str(empty)}
    elif how == "empty-java-home":
        env = {"PATH": str(empty), "JAVA_HOME": str(empty)}
    else:
        (empty / "bin").mkdir()
        fake = empty / "bin" / "java"
        fake.write_text('#!/bin/sh\necho \'openjdk version "11.0.22" 2024-01-16\' >&2\n')
        fake.chmod(0o755)
        env = {"PATH": f"{empty / 'bin'}:/usr/bin:/bin", "JAVA_HOME": str(empty)}
    r = _run_cli_without_java(tmp_path, env)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Java 17 or newer is needed for PySpark; found" in lines[0]
    if how == "java-11":
        assert "found Java 11" in lines[0]
    assert not (tmp_path / "out").exists()


# --- malformed and empty landing sets (real Parquet files, as a copy or another tool could leave) ---

def _land(root, name, rows, drop=(), nullable=False, sub="date=2024-05-01/hour=00"):
    """Write one landing file with pyarrow: ``rows`` of QoS 1 seqs, ``drop``: columns left out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ternlab.pipeline.landing import LANDING_ARROW

    sch = pa.schema([f.with_nullable(True) for f in LANDING_ARROW]) if nullable else LANDING_ARROW
    full = [{"device": "d", "boot": 1, "seq": s, "qos": 1, "topic": "t", "sent_ts": 1.7e9,
             "recv_ts": 1.7e9 + 1 + (s or 0), "recv_idx": s, "collector": "c", "readings": [],
             "payload_raw": None, **extra} for s, extra in rows]
    t = pa.Table.from_pylist(full, schema=sch).drop_columns(list(drop))
    d = root / sub
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, str(d / name))
    return str(d / name)


@pytest.mark.parametrize("case", ["file-without-seq", "null-qos", "negative-seq"])
def test_unusable_landing_rows_are_an_error_not_a_hidden_loss(spark, tmp_path, case):
    # seq 2 is lost. The bad rows used to make a "message" of their own (null or -1 seq) that made
    # unique == expected: a false "0 lost", verdict PASS (a file without the column reads as null).
    _land(tmp_path, "part-c-1.parquet", [(0, {}), (1, {}), (3, {}), (4, {})])
    if case == "file-without-seq":
        bad = _land(tmp_path, "part-c-2.parquet", [(7, {})], drop=["seq"])
        why = "seq=null"
    elif case == "null-qos":
        bad = _land(tmp_path, "part-c-2.parquet", [(5, {"qos": None})], nullable=True)
        why = "qos=null"
    else:
        bad = _land(tmp_path, "part-c-2.parquet", [(-1, {})])
        why = "seq=-1"
    with pytest.raises(audit.PipelineError) as e:
        audit.run_audit(spark, str(tmp_path), str(tmp_path / "out"))
    msg = str(e.value)
    assert msg.startswith("1 landing row(s) are unusable: " + why), msg
    assert msg.endswith(bad), msg
    assert not (tmp_path / "out").exists()


def test_a_seq_past_what_the_collector_lands_is_named_not_an_overflow(spark, tmp_path, capsys):
    # was: exit 2 with Spark's ARITHMETIC_OVERFLOW (max seq + 1), naming neither file nor column
    _land(tmp_path, "part-c-1.parquet", [(0, {}), (1, {})])
    bad = _land(tmp_path, "part-c-2.parquet", [(2**63 - 1, {"recv_ts": 1.7e9 + 3})])
    assert cli.main(["audit", str(tmp_path), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tern audit: error: 1 landing row(s) are unusable: "
                                               "seq=9223372036854775807 ("), err
    assert err[0].endswith(f"); first in file://{bad}") and "seq at most 9007199254740991" in err[0]


def test_counts_summed_over_many_streams_do_not_overflow(spark, tmp_path):
    # the largest seq the collector lands, in 1,100 streams: their expected counts add up past a long
    from decimal import Decimal

    top = 2**53 - 1
    _land(tmp_path, "part-c-1.parquet", [(top, {"device": f"d{i}", "recv_ts": 1.7e9 + 1}) for i in range(1100)])
    s = audit.run_audit(spark, str(tmp_path), str(tmp_path / "o"))
    assert s["totals"]["expected"] == 1100 * (top + 1) > 2**63
    assert s["totals"]["lost"] == 1100 * top and s["problems"]["lost"]["messages"] == 1100 * top
    d = spark.read.parquet(str(tmp_path / "o" / "devices")).filter("device = 'd7'").first()
    assert (d["expected"], d["lost"]) == (Decimal(top + 1), Decimal(top))


def test_a_landing_file_spark_cannot_read_is_one_line_on_stderr(tmp_path):
    # was: the right status and last line, after 89 lines (9.3 KB) of JVM warnings and Spark's log
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ternlab.pipeline.landing import LANDING_ARROW

    bad = tmp_path / "land" / "date=2024-05-01" / "hour=00" / "part-c-1.parquet"
    bad.parent.mkdir(parents=True)
    sch = pa.schema([pa.field("qos", pa.string()) if f.name == "qos" else f for f in LANDING_ARROW])
    rows = [{"device": "d", "boot": 1, "seq": s, "qos": "1", "topic": "t", "sent_ts": 1.7e9, "recv_ts": 1.7e9 + s,
             "recv_idx": s, "collector": "c", "readings": [], "payload_raw": None} for s in range(3)]
    pq.write_table(pa.Table.from_pylist(rows, schema=sch), str(bad))
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_LOCAL_IP", "PYSPARK_SUBMIT_ARGS")}
    env["TMPDIR"] = str(tmp_path)  # where the default log goes
    r = subprocess.run([sys.executable, "-m", "ternlab.cli", "audit", str(tmp_path / "land"), "--out",
                        str(tmp_path / "o"), "--master", "local[1]", "--conf", "spark.ui.enabled=false"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("tern audit: error: [FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH]"), lines
    assert f"{bad}" in lines[0] and "[qos]" in lines[0] and r.stdout == ""
    log = lines[0].rsplit("(Spark's log: ", 1)[1].rstrip(")")
    assert log.startswith(str(tmp_path)) and "WARN" in open(log).read()  # kept: the run failed


def test_unusable_ledger_row_is_one_clear_line(spark, tmp_path, capsys):
    _land(tmp_path / "land", "part-c-1.parquet", [(0, {}), (1, {})])
    led = tmp_path / "ledger.jsonl"
    led.write_text('{"device": "d", "boot": 1, "seq": 0, "qos": 1}\n{"device": "d", "boot": 1, "seq": 1}\n')
    assert cli.main(["audit", str(tmp_path / "land"), "--out", str(tmp_path / "o"),
                     "--ledger", str(led)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"tern audit: error: 1 ledger row(s) are unusable: qos=null ({audit.RULES}); first in "
                   f"file://{led}"]


def test_a_file_spark_cannot_read_is_named_in_one_line(spark, tmp_path, capsys):
    _land(tmp_path, "part-c-1.parquet", [(0, {})])
    junk = tmp_path / "date=2024-05-01" / "hour=00" / "part-c-2.parquet"
    junk.write_bytes(b"garbage")
    assert cli.main(["audit", str(tmp_path), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tern audit: error: "), err
    # was "Py4JJavaError: An error occurred while calling o1132.parquet."
    assert f"{junk} is not a Parquet file" in err[0] and "FAILED_READ_FILE" in err[0], err


def test_empty_landing_is_an_error_not_a_pass(spark, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    # only quarantined payloads, no partitions yet: these were read as landing rows (a crash)
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ternlab.pipeline.landing import QUARANTINE_ARROW

    q = tmp_path / "qonly" / "quarantine" / "date=2024-05-01" / "hour=00"
    q.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{"payload_raw": b"x", "reason": "payload is not JSON",
                                          "recv_ts": 1.7e9, "topic": "t", "collector": "c"}],
                                        schema=QUARANTINE_ARROW), str(q / "q-c-1.parquet"))
    # an empty folder is not a landing (said before Spark starts, tests/host/test_pipeline_inputs.py)
    assert cli.main(["audit", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"tern audit: error: {tmp_path / 'empty'} is empty: pass the folder the collectors wrote "
                   "(tern collect LANDING: date=*/hour=*/part-*.parquet)"], err
    for name in ("qonly",):
        assert cli.main(["audit", str(tmp_path / name), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"tern audit: error: no landing rows under {tmp_path / name}: nothing to audit "
                       "(give --ledger to count everything as lost)"], err
    # with a ledger, an empty landing set is a loss of everything the ledger lists
    led = tmp_path / "ledger.jsonl"
    led.write_text('{"device": "d", "boot": 1, "seq": 0, "qos": 1}\n')
    s = audit.run_audit(spark, str(tmp_path / "qonly"), str(tmp_path / "o"), ledger=str(led))
    assert (s["totals"]["lost"], s["totals"]["received"], s["quarantined"]) == (1, 0, 1)
    assert not s["verdict"]["ok"]


def _landed_and_ledger(fleet_set):
    """(copies per message key, ledger keys with their send time) read with pyarrow, not Spark."""
    import glob

    import pyarrow.parquet as pq
    from collections import Counter

    copies = Counter()
    for f in glob.glob(fleet_set.landing + "/date=*/hour=*/*.parquet"):
        for r in pq.read_table(f, columns=["device", "boot", "qos", "seq"]).to_pylist():
            copies[(r["device"], r["boot"], r["qos"], r["seq"])] += 1
    ledger = {}
    for f in glob.glob(fleet_set.ledger + "/*.parquet"):
        for r in pq.read_table(f, columns=["device", "boot", "qos", "seq", "sent_ts"]).to_pylist():
            ledger[(r["device"], r["boot"], r["qos"], r["seq"])] = r["sent_ts"]
    return copies, ledger


def test_problem_list_names_each_lost_duplicated_and_reordered_message(spark, fleet_set, tmp_path):
    # the audit used to give only counts: which (device, boot, seq) to look for in a console was left
    # to the reader; now <out>/problems lists them all and summary.json the first MAX_LISTED of each
    out = str(tmp_path / "a")
    summary = audit.run_audit(spark, fleet_set.landing, out, ledger=fleet_set.ledger)
    assert summary["spark"]["master"] == spark.sparkContext.master  # the summary says where it ran
    copies, ledger = _landed_and_ledger(fleet_set)
    rows = [r.asDict() for r in spark.read.parquet(out + "/problems").collect()]
    lost = {(r["device"], r["boot"], r["qos"], s) for r in rows if r["kind"] == "lost"
            for s in range(r["seq"], r["seq_to"] + 1)}
    assert lost == set(ledger) - set(copies)
    for r in rows:  # a lost row is a run of consecutive seqs, dated by the first one's send time
        if r["kind"] == "lost":
            assert r["count"] == r["seq_to"] - r["seq"] + 1
            assert r["ts"] == ledger[(r["device"], r["boot"], r["qos"], r["seq"])]
            assert (r["device"], r["boot"], r["qos"], r["seq"] - 1) not in lost
    dups = {(r["device"], r["boot"], r["qos"], r["seq"]): r["count"] for r in rows if r["kind"] == "duplicated"}
    assert dups == {k: n - 1 for k, n in copies.items() if n > 1}
    reordered = [r for r in rows if r["kind"] == "reordered"]
    assert all(copies[(r["device"], r["boot"], r["qos"], r["seq"])] for r in reordered)
    for kind in audit.PROBLEM_KINDS:
        got = summary["problems"][kind]
        assert got["messages"] == summary["totals"][kind] > 0, kind
        assert got["rows"] == sum(r["kind"] == kind for r in rows)
        assert len(got["listed"]) == min(got["rows"], audit.MAX_LISTED)
        # QoS >= 1 first: the guarantee's breaches are never pushed out of the list by QoS 0 losses
        qos0 = [p["qos"] == 0 for p in got["listed"]]
        assert qos0 == sorted(qos0)
    assert summary["problems"]["path"] == out + "/problems"


def test_problem_list_without_ledger_is_the_gaps_inside_each_boot(spark, fleet_set, fleet_audit):
    out, summary = fleet_audit
    copies, _ = _landed_and_ledger(fleet_set)
    top = {}
    for d, b, q, s in copies:
        top[(d, b, q)] = max(top.get((d, b, q), -1), s)
    gaps = {(d, b, q, s) for (d, b, q), m in top.items() for s in range(m) if (d, b, q, s) not in copies}
    rows = spark.read.parquet(out + "/problems").filter("kind = 'lost'").collect()
    assert {(r["device"], r["boot"], r["qos"], s) for r in rows for s in range(r["seq"], r["seq_to"] + 1)} == gaps
    assert summary["problems"]["lost"]["messages"] == summary["totals"]["lost"] == len(gaps)


def test_audit_problems_flag_lists_them_and_piped_tables_keep_every_column(spark, fleet_set, tmp_path, capsys):
    # piped (capsys is not a terminal), rich used to shrink the table to 80 columns: "┃ Q… ┃ expect… ┃"
    assert cli.main(["audit", fleet_set.landing, "--out", str(tmp_path / "a"), "--ledger",
                     fleet_set.ledger, "--problems"]) == 1
    out = capsys.readouterr().out
    assert "┃ QoS ┃ expected ┃ received ┃ unique ┃ lost ┃ dup ┃ reord ┃ p50 ms ┃ p95 ms ┃ p99 ms ┃" in out
    assert "…" not in out
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    for kind in audit.PROBLEM_KINDS:
        got = summary["problems"][kind]
        assert f"{kind}: {got['messages']} message(s) in {got['rows']} row(s)" in out
    first = summary["problems"]["lost"]["listed"][0]
    line = next(ln for ln in out.splitlines() if f" {first['device']} " in ln and ln.split("│")[4].strip()
                == (str(first["seq"]) if first["seq"] == first["seq_to"] else f"{first['seq']}-{first['seq_to']}"))
    assert line.split("│")[2].strip() == str(first["boot"]) and line.split("│")[3].strip() == str(first["qos"])
    assert f"complete list: {tmp_path / 'a' / 'problems'} (Parquet)" in out


_LISTENING = r'''
import json, os, sys
from ternlab.pipeline.spark import build_session
s = build_session("t", sys.argv[1] if len(sys.argv) > 1 else None, {"spark.ui.enabled": "false"},
                  jvm_log=os.environ["JVM_LOG"])
s.range(3).count()
from pyspark import SparkContext
pid = SparkContext._gateway.proc.pid
inodes = set()
for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
        link = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        continue
    if link.startswith("socket:["):
        inodes.add(link[8:-1])
addrs = []
for table in ("tcp", "tcp6"):
    for line in open(f"/proc/{pid}/net/{table}").read().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and f[9] in inodes:  # LISTEN
            addrs.append(f[1].split(":")[0])
print(json.dumps({"listen": addrs, "host": s.conf.get("spark.driver.host"), "master": s.sparkContext.master,
                  "bind": s.conf.get("spark.driver.bindAddress", None)}))
'''
LOOPBACK_HEX = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1 in /proc/net/tcp and tcp6


@pytest.mark.parametrize("master", ["local[1]", None])
def test_a_local_driver_listens_on_loopback_only_and_its_jvm_lines_go_to_the_log(tmp_path, master):
    # without SPARK_LOCAL_IP the driver bound to the host's external interface, and the JVM warned
    # on the terminal that it used eth0's address ("Set SPARK_LOCAL_IP if you need to bind...")
    log = tmp_path / "jvm.log"
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_LOCAL_IP", "PYSPARK_SUBMIT_ARGS")}
    env.update(JVM_LOG=str(log), SPARK_CONF_DIR=str(tmp_path))
    # --master used to be set to local[*] whenever it was not given, overriding a cluster's
    # spark-defaults.conf (and spark-submit --master): without one, the defaults decide
    (tmp_path / "spark-defaults.conf").write_text("spark.master local[2]\n")
    r = subprocess.run([sys.executable, "-c", _LISTENING, *([master] if master else [])], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["master"] == (master or "local[2]"), got
    assert got["host"] == got["bind"] == "127.0.0.1"
    assert got["listen"] and set(got["listen"]) <= LOOPBACK_HEX, got
    assert "log4j" in log.read_text()
    for noise in ("log4j", "WARN", "SPARK_LOCAL_IP", "incubator"):
        assert noise not in r.stderr, r.stderr[-2000:]


def test_a_cluster_master_gets_no_loopback_driver():
    # the executors of a cluster must reach the driver: spark.driver.host is the user's (docs/pipeline.md)
    from ternlab.pipeline.spark import loopback_confs

    assert loopback_confs("spark://10.0.0.5:7077") == {} and loopback_confs("yarn") == {}
    assert loopback_confs("local[2]") == {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}
