#!/usr/bin/env python3
"""What a fleet costs the host per board: N emulated boards under a scenario's fault mix (the
demo's by default), with every process of the run sampled from /proc (CPU time, peak RSS, the boards'
wake-ups -- context switches from /proc/PID/status, per board and second; PSS from
/proc/PID/smaps_rollup, which shares the pages of the unix port's binary and libraries out among the
processes that map them, so PSS x N is what N boards take; RSS counts those pages in every board).

Figures: the board processes (MicroPython unix port), the runner (this process: its fleet thread
and the boards' event loop, ternlab.boards.hub, apart, from /proc/self/task; its descriptors), the
collectors, the observer and Mosquitto; per board = the boards' and the runner's share divided by
N. CPU is counted in the kernel's clock ticks per process, not timed, but a busy machine still
shifts it (more context switches, more polling rounds): compare runs made on the same machine.

    python tools/bench/fleet_scale.py --boards 16 --duration 120 --seed 16
    python tools/bench/fleet_scale.py --boards 100 --duration 600 --seed 100 --json fleet100.json
    nice -n 10 python tools/bench/fleet_scale.py --scenario scenarios/thousand.toml --boards 1000 --duration 600 --seed 1000
    python tools/bench/fleet_scale.py --boards 16 --duration 60 --profile   # where the fleet thread spends

Exit status 1 when the run fails its checks (a reading lost, a QoS 2 reading landed twice ...).
"""

import argparse
import cProfile
import faulthandler
import json
import os
import pstats
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "lib")]

from ternlab.fleet import Callbacks, Fleet, load_scenario  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def pss(pid) -> int | None:
    """Proportional set size of a process in bytes (its share of every page it maps), or None."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def fd_count(pid="self") -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def proc_stat(path: str):
    """(RSS bytes or None, CPU seconds) of /proc/PID or /proc/PID/task/TID, None when it is gone."""
    try:
        with open(f"{path}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError):
        return None
    return rss, (int(fields[11]) + int(fields[12])) / TICK


def switches(pid) -> int | None:
    """Context switches of a process so far (voluntary + involuntary): about how often it woke up."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
    except (OSError, ValueError):
        return None


class Meter(Callbacks):
    """Samples every process of the run on the fleet's tick; CPU per pid is its last reading (a board
    process reborn after a power cut is a new pid, counted apart)."""

    def __init__(self, every=0.1, pss_every=10.0):
        self.rss = {}          # board name -> peak RSS
        self.pss = {}          # board name -> peak PSS
        self.cpu = {}          # (role, name, pid) -> CPU seconds
        self.wakes = {}        # (name, pid) of a board process -> its context switches
        self.peak = {}         # role -> peak RSS of one process
        self.fleet = None
        self.threads = 0       # most threads this process had at once
        self.fds = 0           # most descriptors this process had open at once
        self.every, self.pss_every = every, pss_every
        self._next = self._next_pss = 0.0

    def on_start(self, fleet):
        self.fleet = fleet

    def _take(self, role, name, pid):
        st = proc_stat(f"/proc/{pid}") if pid else None
        if st:
            self.cpu[(role, name, pid)] = st[1]
            self.peak[role] = max(self.peak.get(role, 0), st[0])
            if role == "board":
                self.rss[name] = max(self.rss.get(name, 0), st[0])
                w = switches(pid)
                if w is not None:
                    self.wakes[(name, pid)] = w

    def on_tick(self, fleet):
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every
        self.threads = max(self.threads, len(os.listdir("/proc/self/task")))
        self.fds = max(self.fds, fd_count())
        with_pss = now >= self._next_pss
        if with_pss:
            self._next_pss = now + self.pss_every
        for s in fleet.slots:
            if s.board is not None and s.board.is_on:
                self._take("board", s.name, s.board.pid)
                p = pss(s.board.pid) if with_pss and s.board.pid else None
                if p:
                    self.pss[s.name] = max(self.pss.get(s.name, 0), p)
        if getattr(fleet.broker, "proc", None) is not None:
            self._take("broker", "broker", fleet.broker.proc.pid)
        if fleet.observer is not None and fleet.observer.proc is not None:
            self._take("observer", "observer", fleet.observer.proc.pid)
        for c in fleet.collectors:
            if c.proc.proc is not None:
                self._take("collector", c.proc.id, c.proc.proc.pid)

    def total(self, role):
        return sum(v for k, v in self.cpu.items() if k[0] == role)


def classify(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    if "micropython" in cmd:
        return "board"
    if "mosquitto" in cmd:
        return "broker"
    if "fleet.observer" in cmd:
        return "observer"
    if "ternlab.cli collect" in cmd:
        return "collector"
    if "java" in cmd.split(" ")[0]:
        return "spark-jvm"
    return "slice-runner"  # a pyspark worker running a slice's boards (with --master)


class TreeSampler(threading.Thread):
    """Every process under this one, sampled twice a second: CPU per pid (its last reading), peak RSS
    per role. With --master the slices' runners and boards are children of Spark's workers, which are
    children of this process's JVM, so the whole tree is walked."""

    def __init__(self, every=0.5):
        super().__init__(daemon=True)
        self.every = every
        self.cpu, self.rss, self.peak, self.stop_ = {}, {}, {}, threading.Event()
        self.pss = {}  # role -> peak PSS of one process (not the boards': the Meter's)

    def _tree(self):
        kids = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                kids.setdefault(ppid, []).append(int(d))
        out, todo = [], [os.getpid()]
        while todo:
            p = todo.pop()
            for c in kids.get(p, ()):
                out.append(c)
                todo.append(c)
        return out

    def run(self):
        n = 0
        while not self.stop_.wait(self.every):
            n += 1
            for pid in self._tree():
                role = self.cpu.get(pid, (None,))[0] or classify(pid)
                st = proc_stat(f"/proc/{pid}")
                if role and role != "board" and n % 10 == 1:
                    p = pss(pid)
                    if p:
                        self.pss[role] = max(self.pss.get(role, 0), p)
                if role and st:
                    self.cpu[pid] = (role, st[1])
                    self.rss[pid] = (role, max(self.rss.get(pid, (role, 0))[1], st[0]))
                    self.peak[role] = max(self.peak.get(role, 0), st[0])

    def total(self, role):
        return sum(c for r, c in self.cpu.values() if r == role)

    def rss_of(self, role):
        return sorted(v for r, v in self.rss.values() if r == role)


def thread_cpu(tid: int) -> float:
    st = proc_stat(f"/proc/self/task/{tid}")
    return st[1] if st else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "demo.toml"))
    ap.add_argument("--boards", type=int, required=True)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--out", default=None, help="output directory (default: a temporary one, removed)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--no-faults", action="store_true", help="the scenario without its [[faults]]: the steady cost "
                    "of the boards at their reading rate (a run with faults adds the boots of its power cuts)")
    ap.add_argument("--profile", action="store_true", help="cProfile the fleet's thread; print the top 25")
    ap.add_argument("--master", default=None, help="run the boards in slices on this Spark master (e.g. local[2]: "
                    "two slice processes on this machine; docs/fleet.md says what one runner process holds)")
    a = ap.parse_args(argv)
    # a shorter run keeps its faults in their place in the run (windows scaled with the duration)
    sc = load_scenario(a.scenario).with_overrides(boards=a.boards, duration=a.duration, stretch=True)
    if a.no_faults:
        import dataclasses

        sc = dataclasses.replace(sc, faults=())
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1 PID: every thread's stack on stderr
    tmp = None if a.out else tempfile.TemporaryDirectory(prefix="fleet-scale-")
    out = Path(a.out or tmp.name)
    # sampling 1,000 boards ten times a second would be a cost of its own: once every N/100 seconds;
    # PSS (smaps_rollup, about 1 ms a board, on the fleet's thread) once every N/10 seconds, at least 10
    every = max(0.1, a.boards / 100)
    meter = Meter(every=every, pss_every=max(10.0, a.boards / 10))
    replay = (f"python tools/bench/fleet_scale.py --scenario {a.scenario} --boards {a.boards} "
              f"--duration {a.duration:g} --seed {a.seed}" + (" --no-faults" if a.no_faults else ""))
    if a.master:
        from ternlab.fleet.spread import DriverFleet, default_slices, spark_session

        out.mkdir(parents=True, exist_ok=True)
        spark = spark_session(a.master, jvm_log=str(out / "spark.log"))
        fleet = DriverFleet(sc, seed=a.seed, out=out, callbacks=meter, replay=replay + f" --master {a.master}",
                            spark=spark, slices=min(a.boards, default_slices(spark)))
    else:
        fleet = Fleet(sc, seed=a.seed, out=out, callbacks=meter, replay=replay)
    tree = TreeSampler(every=max(0.5, a.boards / 200))
    tree.start()
    prof = cProfile.Profile() if a.profile else None
    t0, c0, main0 = time.monotonic(), os.times(), thread_cpu(threading.get_native_id())
    if prof:
        prof.enable()
    try:
        result = fleet.run()
    finally:
        if prof:
            prof.disable()
    wall = time.monotonic() - t0
    c1 = os.times()
    tree.stop_.set()
    tree.join()
    runner = (c1.user - c0.user) + (c1.system - c0.system)
    main_cpu = thread_cpu(threading.get_native_id()) - main0
    other_cpu = runner - main_cpu
    rss = tree.rss_of("board")
    n = a.boards
    boards_cpu = tree.total("board")
    psss = sorted(meter.pss.values())
    hub_tid = next((t.native_id for t in threading.enumerate() if t.name == "board-hub"), None)
    hub_cpu = thread_cpu(hub_tid) if hub_tid else 0.0
    from ternlab.boards import hub as board_hub
    hub_events = board_hub._shared.events if board_hub._shared is not None else None
    hub_late = round(board_hub._shared.late_max, 3) if board_hub._shared is not None else None
    fig = {
        "boards": n, "duration_s": a.duration, "no_faults": a.no_faults, "seed": a.seed, "wall_s": round(wall, 1), "ok": result.ok,
        "ledger_rows": result.ledger_rows, "lost": len(result.lost),
        "landing_lost": (result.landing or {}).get("lost"), "landing_duplicates": (result.landing or {}).get("duplicates"),
        "faults": len(result.faults), "boots": sum(b.get("boots", 0) for b in result.boards.values()),
        "board_rss_median_mib": round(rss[len(rss) // 2] / 2**20, 1) if rss else None,
        "board_rss_max_mib": round(rss[-1] / 2**20, 1) if rss else None,
        "board_rss_n_times_median_mib": round(n * rss[len(rss) // 2] / 2**20, 1) if rss else None,
        "board_pss_median_mib": round(psss[len(psss) // 2] / 2**20, 2) if psss else None,
        "board_pss_max_mib": round(psss[-1] / 2**20, 2) if psss else None,
        "board_pss_n_times_median_mib": round(n * psss[len(psss) // 2] / 2**20, 1) if psss else None,
        "board_wakeups_per_s_per_board": round(sum(meter.wakes.values()) / wall / n, 1),
        "board_cpu_s": round(boards_cpu, 1), "board_cpu_pct_per_board": round(100 * boards_cpu / wall / n, 2),
        "runner_cpu_s": round(runner, 1), "runner_fleet_thread_s": round(main_cpu, 1),
        "runner_other_threads_s": round(other_cpu, 1), "runner_threads_max": meter.threads,
        "runner_hub_thread_s": round(hub_cpu, 1), "hub_events": hub_events, "hub_late_max_s": hub_late,
        "runner_fds_max": meter.fds, "runner_fds_per_board": round(meter.fds / n, 2),
        "runner_cpu_pct_per_board": round(100 * (runner + tree.total("slice-runner")) / wall / n, 2),
        "runner_peak_rss_mib": round(proc_stat("/proc/self")[0] / 2**20, 1),
        "runner_rss_per_board_mib": round(proc_stat("/proc/self")[0] / 2**20 / n, 2),
        "collectors_pss_max_mib": round(tree.pss.get("collector", 0) / 2**20, 1),
        "observer_pss_mib": round(tree.pss.get("observer", 0) / 2**20, 1),
        "broker_pss_mib": round(tree.pss.get("broker", 0) / 2**20, 1),
        "collectors_cpu_s": round(tree.total("collector"), 1), "observer_cpu_s": round(tree.total("observer"), 1),
        "broker_cpu_s": round(tree.total("broker"), 1),
        "broker_rss_mib": round(tree.peak.get("broker", 0) / 2**20, 1),
        "slice_runners_cpu_s": round(tree.total("slice-runner"), 1),
        "slice_runner_peak_rss_mib": round(tree.peak.get("slice-runner", 0) / 2**20, 1),
        "spark_jvm_cpu_s": round(tree.total("spark-jvm"), 1),
        "master": a.master,
        "failures": result.failures[:10],
    }
    print(json.dumps(fig, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(fig, indent=1) + "\n")
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    if tmp:
        tmp.cleanup()
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
