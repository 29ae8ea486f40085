#!/usr/bin/env python3
"""`tern pub -l` beside libmosquitto's `mosquitto_pub -l`, side by side in one run against one
Mosquitto this tool starts (127.0.0.1), each with its own defaults (in flight: 20 for both, -M's
default, tern pub's taken from mosquitto_pub's; the library's own default window is 16, and an
older tern pub, without -M, used it; MQTT 3.1.1; no outbox).

Throughput: a file of `--n` lines of 64 bytes on standard input, one message a line, timed from
the process's start to its exit (what a user waits for: the interpreter's start-up counts; at QoS
1/2 both exit once the last message is acknowledged; at QoS 0 mosquitto_pub exits once it has
written the last one, tern pub once the broker has read its DISCONNECT, i.e. everything before it).
The two run alternately, `--rounds` times per QoS, the broker let go idle before each run; the
median, and the spread (min-max) of the rounds, are reported.

Latency at a light rate: `--lat-n` lines fed one every `--gap` ms through a pipe to a running
`pub -l` (QoS in rotation 0, 1, 2 are three processes for both clients: one QoS a process), each
carrying its send time; a subscriber in this process (Tern, QoS 2) takes the arrival time; p50 and
p99 per client. Beside each run's rate, the client process's CPU time (user + system) a message.
`--old-tern PATH` adds another `tern` (an older checkout) to both parts.

Usage: python tools/bench/pub_bench.py [--n 100000] [--rounds 5] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "host"))
sys.path.insert(0, str(ROOT / "lib"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ternlab.brokers.mosquitto import Broker  # noqa: E402

MARK = "pub_bench"
LINE = 64


def _idle(broker, settle=0.3, limit=10.0):
    """Wait until the broker's CPU time stops moving (it has read everything of the last run)."""
    tck = os.sysconf("SC_CLK_TCK")

    def cpu():
        f = Path(f"/proc/{broker.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])

    end = time.monotonic() + limit
    last = cpu()
    while time.monotonic() < end:
        time.sleep(settle)
        now = cpu()
        if now - last <= settle * tck * 0.02:
            return
        last = now


def _cmd(client, addr, qos, cid):
    base = ["mosquitto_pub"] if client == "mosquitto_pub" else [client, "pub"]
    return base + ["-h", addr[0], "-p", str(addr[1]), "-t", "bench/pub", "-q", str(qos), "-l", "-i", cid]


def _child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def rate(client, addr, qos, path, n):
    """msg/s of one run, and the client's CPU time (user + system) per message, µs."""
    with open(path, "rb") as f:
        c0 = _child_cpu()
        t0 = time.perf_counter()
        subprocess.run(_cmd(client, addr, qos, f"pb-{qos}-{os.getpid()}"), stdin=f, check=True, timeout=600)
        return n / (time.perf_counter() - t0), (_child_cpu() - c0) / n * 1e6


def latency(client, addr, n, gap_ms):
    """p50, p99 (ms) of n lines fed at gap_ms, QoS 0, 1, 2 in rotation (one process a QoS)."""
    from tern.client import Client

    arrived = {}
    sub = Client(f"pb-sub-{os.getpid()}", server=addr[0], port=addr[1])
    sub.on_message = lambda m: arrived.setdefault(bytes(m.payload)[:20], time.perf_counter_ns())
    sub.connect()
    sub.subscribe("bench/lat", 2)
    stop = threading.Event()

    def run_sub():
        while not stop.is_set():
            sub.loop(5)

    th = threading.Thread(target=run_sub, daemon=True)
    th.start()
    procs = []
    for q in range(3):
        cmd = _cmd(client, addr, q, f"pl-{q}-{os.getpid()}")
        cmd[cmd.index("bench/pub")] = "bench/lat"
        procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE))
    time.sleep(1.0)  # connected
    sent = {}
    for i in range(n):
        key = b"%020d" % i
        sent[key] = time.perf_counter_ns()
        p = procs[i % 3].stdin
        p.write(key + b"x" * (LINE - len(key)) + b"\n")
        p.flush()
        time.sleep(gap_ms / 1000)
    for p in procs:
        p.stdin.close()
    for p in procs:
        p.wait(60)
    end = time.monotonic() + 10
    while len(arrived) < n and time.monotonic() < end:
        time.sleep(0.05)
    stop.set()
    th.join()
    sub.disconnect()
    lat = sorted((arrived[k] - t) / 1e6 for k, t in sent.items() if k in arrived)
    if len(lat) < n:
        raise RuntimeError(f"{client}: {n - len(lat)} of {n} light-rate messages did not arrive")
    return lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100000, help="lines a throughput run (default 100000)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lat-n", type=int, default=300, help="light-rate messages (default 300)")
    ap.add_argument("--gap", type=float, default=20.0, help="ms between light-rate messages (default 20)")
    ap.add_argument("--tern", default=str(Path(sys.executable).with_name("tern")))
    ap.add_argument("--old-tern", help="another tern executable (an older checkout) measured beside")
    ap.add_argument("--write", type=Path, help="update this section of docs/benchmarks.md")
    a = ap.parse_args(argv)
    clients = ["mosquitto_pub", a.tern] + ([a.old_tern] if a.old_tern else [])
    names = {"mosquitto_pub": "mosquitto_pub -l (libmosquitto)", a.tern: "tern pub -l"}
    if a.old_tern:
        names[a.old_tern] = "tern pub -l, before (%s)" % a.old_tern
    rates = {(c, q): [] for c in clients for q in range(3)}
    cpu = {(c, q): [] for c in clients for q in range(3)}
    with tempfile.NamedTemporaryFile(suffix=".lines") as f, Broker() as broker:
        f.write((b"x" * LINE + b"\n") * a.n)
        f.flush()
        for r in range(a.rounds):
            for q in range(3):
                for c in clients if r % 2 == 0 else clients[::-1]:
                    _idle(broker)
                    got, used = rate(c, broker.address, q, f.name, a.n)
                    rates[(c, q)].append(got)
                    cpu[(c, q)].append(used)
                    print(f"round {r + 1} QoS {q} {names[c]}: {got:,.0f} msg/s, {used:.1f} µs CPU a message",
                          flush=True)
        lat = {}
        if a.lat_n:
            for c in clients:
                _idle(broker)
                lat[c] = latency(c, broker.address, a.lat_n, a.gap)
                print(f"latency {names[c]}: p50 {lat[c][0]:.2f} ms, p99 {lat[c][1]:.2f} ms", flush=True)
    text = report(a, clients, names, rates, cpu, lat)
    print(text)
    if a.write:
        from benchdoc import write_section

        write_section(a.write, MARK, text, heading="tern pub -l beside mosquitto_pub -l")


def report(a, clients, names, rates, cpu, lat):
    cmd = "nice python tools/bench/pub_bench.py --n %d --rounds %d --lat-n %d --gap %g%s --write docs/benchmarks.md" % (
        a.n, a.rounds, a.lat_n, a.gap, " --old-tern OLD" if a.old_tern else "")
    out = subprocess.run(["mosquitto_pub", "--help"], capture_output=True, text=True).stdout.split("\n")
    ver = next((x.strip().rstrip(".") for x in out if " version " in x), "mosquitto_pub")
    lines = [
        f"Command: `{cmd}` — {datetime.date.today()}, this 2-core machine shared with other jobs "
        f"(figures move from run to run: the spread is min-max of the rounds), {ver.strip()}, "
        f"Mosquitto on 127.0.0.1, {a.n:,} lines of {LINE} bytes on standard input from a file, one message "
        "a line, MQTT 3.1.1, each client with its defaults (in flight, -M: 20 for both, tern pub's default "
        "taken from mosquitto_pub's; the library's default window, 16, is what a tern pub without -M used). Time: from "
        "the process's start to its exit, start-up included; QoS 1/2: both exit once everything is "
        "acknowledged; QoS 0: mosquitto_pub once it has written the last message (the broker may still be "
        "reading), tern pub once the broker has read its DISCONNECT. Median of the rounds, run alternately.",
        "",
        "| QoS | " + " | ".join(names[c] + " msg/s (spread)" for c in clients) + " | tern / C |",
        "|---|" + "---:|" * (len(clients) + 1),
    ]
    for q in range(3):
        med = {c: statistics.median(rates[(c, q)]) for c in clients}
        cells = [f"{med[c]:,.0f} ({min(rates[(c, q)]):,.0f}-{max(rates[(c, q)]):,.0f})" for c in clients]
        ratios = [t / c for t, c in zip(rates[(a.tern, q)], rates[("mosquitto_pub", q)])]
        lines.append(f"| {q} | " + " | ".join(cells) + f" | {med[a.tern] / med['mosquitto_pub']:.2f} "
                     f"({min(ratios):.2f}-{max(ratios):.2f} by round) |")
    lines += ["", "The client's own CPU time a message (user + system, start-up included; median of the rounds), µs:",
              "", "| QoS | " + " | ".join(names[c] for c in clients) + " |", "|---|" + "---:|" * len(clients)]
    for q in range(3):
        lines.append(f"| {q} | " + " | ".join(f"{statistics.median(cpu[(c, q)]):.1f}" for c in clients) + " |")
    if lat:
        lines += ["", f"Latency at a light rate: {a.lat_n} lines, one every {a.gap:g} ms, QoS 0, 1, 2 in rotation "
                  "(three `pub -l` processes a client, one a QoS), from the write into the pipe to a Tern "
                  "subscriber (QoS 2) in the bench's process:", "",
                  "| client | p50 ms | p99 ms |", "|---|---:|---:|"]
        for c in clients:
            lines.append(f"| {names[c]} | {lat[c][0]:.2f} | {lat[c][1]:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
