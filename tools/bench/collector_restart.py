#!/usr/bin/env python3
"""Collector restart time against landing size: how long `tern collect` takes from its start to its
subscription on a landing that already holds N of its files.

For each N a landing is made with the collector's own writer (LandingWriter: the files and the QoS 2
window log a running collector leaves): one file a minute, 10 readings each, QoS 1 except one file in 50
(little QoS 2 traffic: a window that never fills). Then `tern collect` is started on it against a real
Mosquitto, and the time to its "subscribed" line is taken (median of --runs), with the part spent
rebuilding its QoS 2 state (window and record) measured in-process too. --baseline DIR runs the same
command from an older checkout (its host/ and lib/ first on PYTHONPATH) on the same landing, side by side.
The table goes to the collector_restart section of docs/pipeline.md.

    python tools/bench/collector_restart.py --baseline /tmp/main-78fd1db
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CID = "bench-restart"
T0 = 1767225600.0  # 2026-01-01T00:00Z


def make_landing(root: str, n: int) -> None:
    from ternlab.pipeline import qos2, schema
    from ternlab.pipeline.landing import LandingWriter

    w = LandingWriter(root, CID)
    w.check()
    w.window_keys()
    no_q = {k: [] for k in (*schema.QUARANTINE_FIELDS, "_idx", "_q2")}
    for k in range(n):
        qos = 2 if k % 50 == 0 else 1
        seqs = list(range(10 * k, 10 * k + 10))
        ts = T0 + 60 * k
        first = 1_000_000 * k + 1
        rows = {"device": ["d"] * 10, "boot": [1] * 10, "seq": seqs, "qos": [qos] * 10,
                "topic": ["tern/d/telemetry"] * 10, "sent_ts": [ts] * 10, "recv_ts": [ts] * 10,
                "recv_idx": list(range(first, first + 10)), "collector": [CID] * 10,
                "readings": [[("t", 21.5)]] * 10, "payload_raw": [None] * 10,
                "_q2": [(s % 65535 + 1, qos2.message_key("d", 1, 2, s)) if qos == 2 else None for s in seqs],
                "_win": [qos2.message_key("d", 1, 2, s) if qos == 2 else None for s in seqs]}
        rows["_idx"] = rows["recv_idx"]
        w.commit(rows, no_q)
    w.close()


def rebuild_seconds(root: str) -> float:
    """In-process: what a start spends on its QoS 2 state (window and record), this checkout."""
    from ternlab.pipeline.landing import LandingWriter

    t = time.perf_counter()
    w = LandingWriter(root, CID)
    w.window_keys()
    w.last_record()
    return time.perf_counter() - t


def start_seconds(root: str, port: int, pythonpath: str | None) -> float:
    """Seconds from `tern collect`'s start to its subscription."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    t = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "ternlab.cli", "collect", root, "--id", CID, "-p", str(port),
                          "--progress", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env)
    lines = []
    for line in p.stdout:
        lines.append(line)
        if "subscribed to" in line:
            took = time.monotonic() - t
            break
    else:
        raise SystemExit("collector_restart: the collector did not subscribe:\n" + "".join(lines[-10:]))
    p.terminate()
    p.communicate(timeout=60)
    return took


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", default="100,1000,10000", help="landing sizes in files (default 100,1000,10000)")
    ap.add_argument("--runs", type=int, default=3, help="starts per size, the median is kept (default 3)")
    ap.add_argument("--baseline", metavar="DIR", help="an older checkout to compare with (host/ and lib/ used)")
    ap.add_argument("--workdir", help="where the landings go (default: a temporary directory)")
    ap.add_argument("--write", default=os.path.join(ROOT, "docs", "pipeline.md"),
                    help="markdown file whose collector_restart section is rewritten")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.files.split(",") if x.strip()]
    base = None
    if args.baseline:
        base = os.pathsep.join(os.path.join(os.path.abspath(args.baseline), d) for d in ("host", "lib"))
    load0 = os.getloadavg()[0]
    from ternlab.brokers.mosquitto import Broker

    work = args.workdir or tempfile.mkdtemp(prefix="tern-restart-bench-")
    rows = []
    try:
        with Broker(os.path.join(work, "broker")) as broker:
            for n in sizes:
                land = os.path.join(work, f"land-{n}")
                t = time.monotonic()
                make_landing(land, n)
                made = time.monotonic() - t
                r = {"n": n, "rebuild": statistics.median(rebuild_seconds(land) for _ in range(args.runs))}
                if base:
                    r["base"] = statistics.median(start_seconds(land, broker.port, base) for _ in range(args.runs))
                r["new"] = statistics.median(start_seconds(land, broker.port, None) for _ in range(args.runs))
                rows.append(r)
                print(f"{n:>7} files (made in {made:.0f} s): start to subscription {r['new']:.2f} s"
                      + (f", baseline {r['base']:.2f} s" if base else "")
                      + f"; QoS 2 state rebuilt in {r['rebuild'] * 1000:.1f} ms", flush=True)
                shutil.rmtree(land, ignore_errors=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    import pyarrow

    cmd = "python tools/bench/collector_restart.py" + (f" --files {args.files}" if args.files != "100,1000,10000"
                                                       else "") + (" --baseline DIR" if base else "")
    head = "| landing files | start to subscription | QoS 2 state rebuilt (in-process) |"
    rule = "|---:|---:|---:|"
    if base:
        head = "| landing files | start to subscription, baseline | start to subscription | QoS 2 state rebuilt (in-process) |"
        rule = "|---:|---:|---:|---:|"
    lines = [
        f"`{cmd}` on {dt.date.today().isoformat()}: Mosquitto on loopback, {os.cpu_count()} CPUs (a shared "
        f"machine; load average {load0:.1f} at the start), {platform.python_implementation()} "
        f"{platform.python_version()}, pyarrow {pyarrow.__version__}. Each landing holds the collector's own "
        "files, one a minute (10 readings each, one file in 50 with QoS 2 readings), and the window log it "
        "keeps; times are the median of "
        f"{args.runs} starts." + (f" Baseline: the same command from {args.baseline}." if base else ""),
        "",
        head,
        rule,
    ]
    for r in rows:
        cells = [f"{r['n']:,}"] + ([f"{r['base']:.2f} s"] if base else []) + [
            f"{r['new']:.2f} s", f"{r['rebuild'] * 1000:.1f} ms"]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from benchdoc import write_section

        write_section(args.write, "collector_restart", text)
        print(f"written to {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
