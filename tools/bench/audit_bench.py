#!/usr/bin/env python3
"""Audit throughput benchmark: rows/s of `tern audit` on generated landing sets.

For each size, a landing set is generated with Spark (not timed), then the audit job runs on it
(timed: read, shuffle, ordering window, aggregation, Parquet + JSON output) and its totals are checked
against the faults the generator injected. Results are printed and written to the audit_bench section of
docs/benchmarks.md (only that section is rewritten).

    python tools/bench/audit_bench.py --sizes 1M,5M,20M
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = 500_000
COUNTS = ("expected", "received", "unique", "lost", "duplicated", "reordered")


def parse_size(s: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*", s)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size like 1M or 500k: {s!r}")
    return int(float(m.group(1)) * {"": 1, "k": 1_000, "m": 1_000_000}[m.group(2).lower()])


def write_section(path: str, text: str) -> None:
    from benchdoc import write_section as write

    write(path, "audit_bench", text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,5M,20M",
                    help="comma-separated landing sizes in messages (default 1M,5M,20M)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--devices", type=int, default=200)
    ap.add_argument("--workdir", default=None, help="where generated data goes (default: a temp dir)")
    ap.add_argument("--write", default=os.path.join(ROOT, "docs", "benchmarks.md"),
                    help="markdown file whose audit_bench section is rewritten")
    ap.add_argument("--repeat", type=int, default=2,
                    help="audit runs per size; the fastest counts (default 2: the host is shared)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    load0 = os.getloadavg()[0]  # what else was running when the measurement began
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))

    from ternlab.pipeline.audit import run_audit
    from ternlab.pipeline.generate import generate
    from ternlab.pipeline.spark import PipelineError, build_session, java_version, parse_confs, \
        check_java

    try:
        confs = {"spark.driver.memory": "3g", "spark.sql.shuffle.partitions": "16",
                 **parse_confs(args.conf)}
        spark = build_session("tern-audit-bench", args.master, confs)
    except PipelineError as e:
        print(f"audit_bench: error: {e}", file=sys.stderr)
        return 2
    import pyspark

    work = args.workdir or tempfile.mkdtemp(prefix="tern-audit-bench-")
    results = []
    try:
        # warm the JVM up (JIT, class loading) so the first measured size is not penalised
        generate(spark, os.path.join(work, "warm"), n_messages=200_000, devices=20,
                 loss=0.001, dup=0.001, reorder=0.001, counts=False)
        run_audit(spark, os.path.join(work, "warm"), os.path.join(work, "warm-out"))
        for n in sizes:
            land, out = os.path.join(work, f"land-{n}"), os.path.join(work, f"out-{n}")
            t = time.monotonic()
            g = generate(spark, land, n_messages=n, devices=args.devices, boots=2,
                         qos_levels=(0, 1, 2), loss=0.001, dup=0.001, reorder=0.001, seed=n)
            gen_s = time.monotonic() - t
            audit_s = float("inf")
            for _ in range(max(1, args.repeat)):
                t = time.monotonic()
                s = run_audit(spark, land, out)
                audit_s = min(audit_s, time.monotonic() - t)
            ok = all(s["totals"][c] == g.totals[k] for c, k in (
                ("received", "received"), ("unique", "unique"), ("duplicated", "duplicated"),
                ("reordered", "reordered"), ("lost", "lost_inferred"),
                ("expected", "expected_inferred")))
            rate = g.rows / audit_s
            results.append((n, g.rows, gen_s, audit_s, rate, ok))
            print(f"{n:>11,} messages  {g.rows:>11,} rows  generate {gen_s:7.1f} s  "
                  f"audit {audit_s:7.1f} s  {rate:>10,.0f} rows/s  counts {'ok' if ok else 'WRONG'}",
                  flush=True)
            shutil.rmtree(land, ignore_errors=True)
    finally:
        spark.stop()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    cmd = "python tools/bench/audit_bench.py --sizes " + args.sizes + (
        f" --master '{args.master}'" if args.master != "local[2]" else "")
    lines = [
        "## Audit throughput (Spark)",
        "",
        f"`{cmd}` on {dt.date.today().isoformat()}: {args.master}, "
        f"{os.cpu_count()} CPUs on the host (a shared machine; load average {load0:.1f} at the start), "
        f"PySpark {pyspark.__version__}, Java {java_version(check_java())}, "
        f"{platform.python_implementation()} {platform.python_version()}, driver memory 3g, "
        f"16 shuffle partitions, best of {args.repeat} runs per size. Landing sets from `ternlab.pipeline.generate` ({args.devices} devices "
        "x 2 boots x QoS 0/1/2, 0.1 % each of losses, duplicates, reorderings); generation is not "
        "timed. The audit time covers reading the Parquet landing set, the shuffle by stream, the "
        "ordering window, the aggregation and writing `devices/` and `summary.json`; its totals "
        "were checked against the injected faults.",
        "",
        "| messages | landing rows | audit (s) | rows/s | counts |",
        "|---:|---:|---:|---:|---|",
    ]
    for n, rows, _g, a, r, ok in results:
        lines.append(f"| {n:,} | {rows:,} | {a:.1f} | {r:,.0f} | {'match' if ok else 'WRONG'} |")
    if results:
        lines.append("")
        if len(results) > 1:
            steps = ", ".join(
                f"{r0:,} -> {r1:,} rows: {1e6 * (a1 - a0) / (r1 - r0):.2f} s per extra million"
                for (_, r0, _g0, a0, *_r0), (_, r1, _g1, a1, *_r1) in zip(results, results[1:]))
            lines.append(f"Growth: a fixed cost (Spark jobs, listing, writing the output) plus a linear "
                         f"part; marginal cost {steps}.")
        n_big, rate_big = results[-1][0], results[-1][4]
        lines.append(f"Target: {TARGET:,} rows/s with linear growth. At {n_big:,} messages "
                     f"{rate_big:,.0f} rows/s: {'met' if rate_big >= TARGET else 'not met'}; at the "
                     f"smaller sizes the fixed cost weighs more.")
    text = "\n".join(lines)
    if not args.no_write:
        write_section(args.write, text)
        print(f"written to {args.write}")
    return 0 if all(ok for *_x, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main())
