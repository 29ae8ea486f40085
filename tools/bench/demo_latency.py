#!/usr/bin/env python3
"""Where a demo run's latency goes: each QoS's p50 split at the chaos proxy's packet log, beside what
one loopback hop between two processes costs on this machine, hot and after an idle gap.

The split needs a run with `--relay`: a chaos proxy between each board and the broker logs every
packet. The proxy is a process more on the path (one more hop each way, a Python thread woken per
packet), so a relayed run is slower than the demo's default, where the boards talk to the broker
directly (ternlab/fleet/custody.py); the stages say where the time goes, not what the default costs.

The audit's latency is a reading's timestamp (taken as the board builds its payload) to its first
landing at a collector. The proxy logs every packet just before it forwards it, so its log splits that
time into: the board's work up to its PUBLISH at the proxy (payload, publish(), the outbox record on
flash for QoS 1/2, one hop); for QoS 2 the broker's PUBREC back at the proxy and the board's PUBREL
(its flash mark, then the answer); and from the last packet the message needs at the proxy to its
landing (broker, collector). Only messages that went straight through count (PUBLISH at the proxy
within 5 ms of the reading): those sent during an outage wait for the link, not for the machine.

    tern demo --short --seed 5 --relay --out /tmp/demo
    python tools/bench/demo_latency.py /tmp/demo [--write docs/benchmarks.md]
"""

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HOP_PORT_ENV = "DEMO_LATENCY_ECHO"


def _p50(xs):
    return statistics.median(xs) * 1e3 if xs else float("nan")


def _jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _landings(out: Path) -> dict:
    import pyarrow.dataset as ds

    first = {}
    t = ds.dataset(out / "landing", format="parquet", partitioning="hive").to_table(
        columns=["device", "boot", "seq", "qos", "recv_ts"])
    for r in t.to_pylist():
        k = (r["device"], r["boot"], r["seq"], r["qos"])
        if r["recv_ts"] is not None and (k not in first or r["recv_ts"] < first[k]):
            first[k] = r["recv_ts"]
    return first


def stages(out: Path) -> dict:
    """{qos: {stage: [seconds]}} over the messages that went straight through."""
    off = json.loads((out / "summary.json").read_text())["wall_minus_monotonic"]
    land = _landings(out)
    res = {q: {"total": [], "publish": [], "pubrec": [], "pubrel": [], "to_landing": []} for q in (0, 1, 2)}
    packets = {log.parent.name: [p for p in _jsonl(log) if "direction" in p]  # each board's, events left out
               for log in (out / "boards").glob("*/packets.jsonl")}
    for r in _jsonl(out / "ledger.jsonl"):
        k = (r["device"], r["boot"], r["seq"], r["qos"])
        pk = packets.get(r["device"])
        if pk is None or k not in land or r.get("sent_ts") is None:
            continue
        sent = r["sent_ts"] - off
        pub = next((p for p in pk if p["t"] >= sent and p["direction"] == "c2b" and p["type"] == "PUBLISH"), None)
        if pub is None or pub["t"] - sent > 0.005:
            continue
        s = res[r["qos"]]
        last = pub["t"]
        if r["qos"] == 2:
            rec = next((p for p in pk if p["t"] >= pub["t"] and p["type"] == "PUBREC" and p["pid"] == pub["pid"]), None)
            rel = rec and next((p for p in pk if p["t"] >= rec["t"] and p["type"] == "PUBREL" and p["pid"] == pub["pid"]), None)
            if rel is None:
                continue
            s["pubrec"].append(rec["t"] - pub["t"])
            s["pubrel"].append(rel["t"] - rec["t"])
            last = rel["t"]
        s["publish"].append(pub["t"] - sent)
        s["to_landing"].append(land[k] - off - last)
        s["total"].append(land[k] - r["sent_ts"])
    return res



def _echo():
    ls = socket.create_server(("127.0.0.1", 0))
    print(ls.getsockname()[1], flush=True)
    c, _ = ls.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        d = c.recv(64)
        if not d:
            return
        c.sendall(d)


def hop(n=400, gap=0.0):
    """p50 round trip (ms) to an echo in another process over loopback TCP; gap: idle seconds between."""
    p = subprocess.Popen([sys.executable, __file__, "--echo"], stdout=subprocess.PIPE, text=True)
    s = None
    try:
        s = socket.create_connection(("127.0.0.1", int(p.stdout.readline())))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rt = []
        for _ in range(n):
            t = time.perf_counter()
            s.sendall(b"ping")
            got = 0
            while got < 4:
                got += len(s.recv(64))
            rt.append(time.perf_counter() - t)
            if gap:
                time.sleep(gap)
        return _p50(rt[n // 8:])
    finally:
        if s is not None:
            s.close()  # the echo ends at end of stream
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def report(out: Path) -> str:
    st = stages(out)
    hot, cold = hop(), hop(gap=0.01)
    run = json.loads((out / "summary.json").read_text()).get("replay", "tern demo")
    lines = [f"Command: `{run} --out OUT` then `python tools/bench/demo_latency.py OUT` "
             f"({time.strftime('%Y-%m-%d')}, this 2-core machine). p50 in ms over the messages that went "
             "straight through (PUBLISH at the proxy within 5 ms of the reading).",
             "",
             "| QoS | n | reading to landing | reading to PUBLISH at proxy | PUBLISH to PUBREC | PUBREC to PUBREL "
             "| last packet at proxy to landing |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for q in (0, 1, 2):
        s = st[q]
        dash = "-"
        lines.append(f"| {q} | {len(s['total'])} | {_p50(s['total']):.2f} | {_p50(s['publish']):.2f} | "
                     f"{_p50(s['pubrec']):.2f} | {_p50(s['pubrel']):.2f} | {_p50(s['to_landing']):.2f} |"
                     .replace("| nan ", f"| {dash} "))
    lines += ["", f"One loopback hop between two processes (round trip / 2, p50): {hot / 2:.3f} ms back to back, "
              f"{cold / 2:.3f} ms after 10 ms idle. Before it lands, a QoS 0 or 1 message crosses 3 hops between "
              "processes (board, proxy, broker, collector), a QoS 2 message 7 (board, proxy, broker, proxy, "
              "board, proxy, broker, collector), and each process does its own work in between."]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", type=Path, help="a demo's --out directory")
    ap.add_argument("--write", type=Path, help="replace this tool's section of docs/benchmarks.md")
    ap.add_argument("--echo", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.echo:
        return _echo()
    if a.out is None or not (a.out / "summary.json").exists():
        ap.error("give the --out directory of a finished demo run (it has summary.json)")
    if not list(a.out.glob("boards/*/packets.jsonl")):
        ap.error(f"{a.out} has no packet logs: run the demo with --relay")
    text = report(a.out)
    print(text)
    if a.write:
        sys.path.insert(0, str(Path(__file__).parent))
        from benchdoc import write_section as write

        write(a.write, "demo_latency", text, heading="Where the demo's latency goes (`tools/bench/demo_latency.py`)")


if __name__ == "__main__":
    sys.exit(main())
