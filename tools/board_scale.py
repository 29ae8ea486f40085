"""Memory and CPU per emulated board: start N boards, measure, print a Markdown table.

    python tools/board_scale.py [--boards 1 4 8] [--seconds 5] [--profile unix-emulated]

For each N: boot time per board; resident memory (RSS, and PSS where the kernel gives it: shared
pages split fairly) of each device process (the unix port inside its CPython launcher); CPU used by
the device processes and by the host's relay threads (this process), per board, while the boards
sit at the REPL ("idle") and while each runs a main.py that prints a line every 50 ms and writes a
256-byte record to its outbox partition every 200 ms ("busy").
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "host"))

from ternlab.boards.emulated import EmulatedBoard  # noqa: E402

BUSY = """import emuboard, time
p = emuboard.partition('outbox')
rec = bytearray(256)
n = 0
while True:
    n += 1
    print('reading', n, 21.5)
    if n % 4 == 0:
        k = (n // 4) % (16 * p.ioctl(4, 0))
        if k % 16 == 0:
            p.ioctl(6, k // 16)
        p.writeblocks(k // 16, rec, (k % 16) * 256)
    time.sleep_ms(50)
"""
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def mem_kib(pid):
    rss = pss = None
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


def measure(boards, seconds):
    pids = [b.pid for b in boards]
    me = os.getpid()
    dev0 = sum(cpu_seconds(p) for p in pids)
    host0 = cpu_seconds(me)
    t0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    dev = sum(cpu_seconds(p) for p in pids) - dev0
    host = cpu_seconds(me) - host0
    n = len(boards)
    return 100.0 * dev / wall / n, 100.0 * host / wall / n


def run(n, seconds, profile):
    with tempfile.TemporaryDirectory(prefix="tern-scale-") as tmp:
        boards = []
        t0 = time.monotonic()
        for i in range(n):
            boards.append(EmulatedBoard(profile, workdir=Path(tmp) / str(i), board_id="scale-%d" % i))
        boot = (time.monotonic() - t0) / n
        try:
            mems = [mem_kib(b.pid) for b in boards]
            idle = measure(boards, seconds)
            for b in boards:
                b.write_file("main.py", BUSY)
                b.disconnect()
            for b in boards:
                b.power_cycle()
            for b in boards:
                b.wait_for(r"reading 2 ", timeout=20)
            lines0 = sum(len(b.log.lines) for b in boards)
            busy = measure(boards, seconds)
            lines = (sum(len(b.log.lines) for b in boards) - lines0) / n / seconds
            busy_mems = [mem_kib(b.pid) for b in boards]
        finally:
            for b in boards:
                b.close()
    rss = sum(m[0] for m in busy_mems) / n / 1024
    pss = sum(m[1] or 0 for m in busy_mems) / n / 1024
    rss_idle = sum(m[0] for m in mems) / n / 1024
    return {"n": n, "boot_s": boot, "rss_idle_mib": rss_idle, "rss_mib": rss, "pss_mib": pss,
            "idle_dev_pct": idle[0], "idle_host_pct": idle[1], "busy_dev_pct": busy[0], "busy_host_pct": busy[1],
            "lines": lines}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--boards", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--profile", default="unix-emulated")
    a = ap.parse_args(argv)
    if any(n < 1 for n in a.boards) or a.seconds <= 0:
        ap.error("--boards must be >= 1 and --seconds > 0")
    print("| boards | boot s/board | RSS MiB/board idle | RSS MiB/board busy | PSS MiB/board busy | "
          "CPU %/board idle (device + relay) | CPU %/board busy (device + relay) | busy lines/s/board |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in a.boards:
        r = run(n, a.seconds, a.profile)
        print("| %d | %.2f | %.1f | %.1f | %.1f | %.2f + %.2f | %.2f + %.2f | %.1f |" % (
            n, r["boot_s"], r["rss_idle_mib"], r["rss_mib"], r["pss_mib"],
            r["idle_dev_pct"], r["idle_host_pct"], r["busy_dev_pct"], r["busy_host_pct"], r["lines"]))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
