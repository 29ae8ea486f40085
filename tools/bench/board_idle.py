#!/usr/bin/env python3
"""What an emulated board costs the host while it waits: CPU and wake-ups per board process in the
states a board of a large fleet spends its time in, each measured over the same number of seconds.

- `publishing`: connected, a reading every 10 s at QoS 1 and 2 (scenarios/thousand.toml's firmware);
- `idle`: connected, measuring stopped (the fleet's `cmd/interval` command): keepalive only;
- `link-down`: its Wi-Fi link down (what every board of a fleet sees while a broker restart holds
  the links): the app waits for the link in `step()`, as the client waits out its reconnect backoff.

Per state: CPU of the board processes from /proc/PID/stat (the kernel's clock ticks, user + system)
and context switches from /proc/PID/status (voluntary + involuntary: about how often the process
woke), per board, median and mean over the boards; and what a board process took from its power-on
to the first state (its boot: importing the app, opening the outbox, connecting; and `--warmup`
seconds of readings). No faults; the fleet's checks still judge the run.

    nice -n 10 python tools/bench/board_idle.py --boards 8 --phase 20
"""

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "lib"), str(ROOT / "tools" / "bench")]

from fleet_scale import TICK, switches  # noqa: E402
from ternlab.fleet import Callbacks, Fleet, load_scenario  # noqa: E402
from ternlab.fleet.parts import send_commands  # noqa: E402
from ternlab.fleet.runner import STOP_INTERVAL_MS  # noqa: E402

STATES = ("publishing", "idle", "link-down")


def sample(pid):
    """(CPU ticks, context switches) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    w = switches(pid)
    return None if w is None else (int(fields[11]) + int(fields[12]), w)


class Phases(Callbacks):
    """Walks the states on the fleet's tick, `phase` seconds each after `warmup`, and samples every
    board at each state's start and end."""

    def __init__(self, warmup, phase):
        self.warmup, self.phase = warmup, phase
        self.k = -1          # the state under way (-1: warming up)
        self.start = None    # (fleet time, {pid: sample}) at the state's start
        self.rows = {}       # state -> {"cpu_pct": [...], "wakeups_per_s": [...]} per board
        self.boot_cpu = []   # CPU seconds of each board process from its start to the first state

    def _snap(self, fleet):
        return fleet.now(), {s.board.pid: sample(s.board.pid) for s in fleet.slots if s.board.pid}

    def _enter(self, fleet, k):
        if k == 1:  # idle: no more readings
            base = fleet.firmware.get("cmd_topic", "tern/{id}/cmd")
            send_commands(fleet.broker.address, [(base.replace("{id}", s.name) + "/interval", str(STOP_INTERVAL_MS))
                                                 for s in fleet.slots], name="board-idle-commander")
        elif k == 2:
            for s in fleet.slots:
                s.board.set_link(False)
        elif k == 3:
            for s in fleet.slots:
                s.board.set_link(True)

    def on_tick(self, fleet):
        now = fleet.now()
        k = int((now - self.warmup) // self.phase) if now >= self.warmup else -1
        if k == self.k or self.k >= len(STATES):
            return
        if self.start is not None and 0 <= self.k < len(STATES):
            t1, end = self._snap(fleet)
            t0, begin = self.start
            cpu, wakes = [], []
            for pid, a in begin.items():
                b = end.get(pid)
                if a and b:
                    cpu.append(100 * (b[0] - a[0]) / TICK / (t1 - t0))
                    wakes.append((b[1] - a[1]) / (t1 - t0))
            self.rows[STATES[self.k]] = {"boards": len(cpu), "seconds": round(t1 - t0, 1), "cpu_pct": cpu,
                                         "wakeups_per_s": wakes}
        self.k = k
        if k >= 0:
            self._enter(fleet, k)
            self.start = self._snap(fleet) if k < len(STATES) else None
            if k == 0:  # what each process took from its start: the boot, the connect, a reading or two
                self.boot_cpu = [a[0] / TICK for a in self.start[1].values() if a]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "thousand.toml"))
    ap.add_argument("--boards", type=int, default=8)
    ap.add_argument("--phase", type=float, default=20.0, help="seconds in each state")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds after the boot before the first state")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    a = ap.parse_args(argv)
    duration = a.warmup + a.phase * len(STATES) + 2
    sc = dataclasses.replace(load_scenario(a.scenario), faults=(), warmup=a.warmup, settle=60.0)
    sc = sc.with_overrides(boards=a.boards, duration=duration)
    phases = Phases(a.warmup, a.phase)
    with tempfile.TemporaryDirectory(prefix="board-idle-") as out:
        result = Fleet(sc, seed=a.seed, out=Path(out), callbacks=phases,
                       replay=f"python tools/bench/board_idle.py --boards {a.boards} --phase {a.phase:g}").run()
    fig = {"boards": a.boards, "phase_s": a.phase, "ok": result.ok, "failures": result.failures[:5],
           "load_avg": os.getloadavg(),
           "cpu_s_from_power_on_median": round(statistics.median(phases.boot_cpu), 3) if phases.boot_cpu else None}
    for state in STATES:
        r = phases.rows.get(state)
        if not r or not r["boards"]:
            fig[state] = None
            continue
        fig[state] = {"boards": r["boards"], "seconds": r["seconds"],
                      "cpu_pct_median": round(statistics.median(r["cpu_pct"]), 3),
                      "cpu_pct_mean": round(statistics.mean(r["cpu_pct"]), 3),
                      "wakeups_per_s_median": round(statistics.median(r["wakeups_per_s"]), 1),
                      "wakeups_per_s_mean": round(statistics.mean(r["wakeups_per_s"]), 1)}
    print(json.dumps(fig, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(fig, indent=1) + "\n")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
