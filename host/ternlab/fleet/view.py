"""The fleet on a terminal (rich): a line per fault as it happens, a progress row per board, a summary
table at the end. Built only on the runner's callbacks, as any other front end (the demo) would be."""

from __future__ import annotations

from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from ..term import print_table
from .runner import Callbacks

_STYLE = {"injected": "yellow", "armed": "yellow", "fired": "red", "restored": "green", "skipped": "dim",
          "unfired": "dim"}


class FleetView(Callbacks):
    """Rows: the run's clock (phase, seconds of `duration`), one per board (received / published), and
    with collectors one for the landing set (QoS >= 1 readings landed / published) and one per collector."""

    def __init__(self, console, live: bool = True):
        self.console = console
        self.live = live
        self.progress = None
        self.tasks = {}
        self.phase = "starting"
        self.duration = None

    def __enter__(self):
        if self.live:
            self.progress = Progress(TextColumn("{task.description:<12}"), BarColumn(bar_width=24),
                                     TextColumn("{task.fields[info]}"), console=self.console, transient=False)
            self.progress.start()
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def _print(self, text):
        (self.progress.console if self.progress else self.console).print(text, highlight=False, soft_wrap=True)

    def on_start(self, fleet):
        kinds = sorted({f.kind for f in fleet.schedule})
        self._print(f"{len(fleet.schedule)} faults scheduled ({', '.join(kinds) or 'none'})")
        self.duration = fleet.scenario.duration
        if self.progress is not None:
            self.tasks["_clock"] = self.progress.add_task("run", total=self.duration, info="starting")
            for name in fleet.board_names:
                self.tasks[name] = self.progress.add_task(name, total=None, info="booting")
            if fleet.collectors:
                self.tasks["_landing"] = self.progress.add_task("landing", total=None, info="")
                for c in fleet.collectors:
                    self.tasks["c:" + c.proc.id] = self.progress.add_task(c.proc.id, total=None, info="")

    def on_phase(self, name):
        self.phase = name
        if name in ("settling", "stopping"):
            self._print(f"[bold]{name}[/]")

    def on_fault(self, record):
        self._print(f"[{_STYLE.get(record.status, 'white')}]fault[/] {record.line()}")

    def on_tick(self, fleet):
        if self.progress is None:
            return
        for name, p in fleet.progress().items():
            task = self.tasks.get(name)
            if task is None:
                continue
            total = max(p["published"], 1)
            landed = "" if p.get("landed") is None else f"  landed {p['landed']}"
            self.progress.update(task, total=total, completed=p["received"],
                                 info=f"{p['state']:<9} boot {p['boot']}  published {p['published']}"
                                      f"  received {p['received']}{landed}  pending {p['pending']}")
        t = min(fleet.now(), self.duration or 0)
        self.progress.update(self.tasks["_clock"], completed=t,
                             info=f"{self.phase:<9} {fleet.now():6.1f} s of {self.duration:g} s under faults")
        if "_landing" in self.tasks:
            got, want = fleet.landing_progress()
            self.progress.update(self.tasks["_landing"], total=max(want, 1), completed=got,
                                 info=f"QoS>=1 readings landed {got} of {want}")
            for cid, c in fleet.collector_progress().items():
                self.progress.update(self.tasks["c:" + cid], total=1, completed=c["state"] == "running",
                                     info=f"{c['state']:<9} run {c['runs']}  rows written {c['landed']}")

    def summary(self, result, elapsed):
        t = Table(title=f"fleet seed={result.seed}: {len(result.boards)} boards, {elapsed:.1f} s")
        for col in ("board", "boots", "published", "acked", "received", "lost", "pwr cut", "net cut"):
            t.add_column(col, justify="right" if col != "board" else "left", no_wrap=True)
        for name, b in result.boards.items():
            t.add_row(name, str(b["boots"]), str(b["published"]), str(b["acked"]), str(b["received"]),
                      str(b["lost"]), str(b["power_cuts"]), str(b["network_cuts"]))
        print_table(self.console, t)
        dups = ", ".join(f"QoS {q}: {n}" for q, n in sorted(result.duplicates.items()) if n) or "none"
        self.console.print(f"ledger {result.ledger_rows} rows, duplicates {dups}; output in {result.out}")
        if result.landing is not None:
            ld = result.landing
            ldups = ", ".join(f"QoS {q}: {n}" for q, n in ld["duplicates"].items() if n) or "none"
            per = ", ".join(f"{cid} {c['landed']} rows in {c['runs']} run(s)" for cid, c in ld["collectors"].items())
            self.console.print(f"landing: {ld['rows']} rows in {ld['files']} files, {ld['lost']} QoS>=1 readings "
                               f"missing, duplicate copies {ldups} ({per})")
