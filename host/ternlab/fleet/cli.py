"""`tern fleet run SCENARIO --seed N`: run a fleet of emulated boards under a scenario's faults.

Prints the seed first, one line per fault as it happens, live per-board progress, and a summary; the
output directory gets each board's console log, the fault log, the ledger and the observer's copies.
Any failure -- a check that does not hold, or the run breaking down -- ends with ``seed=N`` and the exact
command that replays it (same scenario, seed, boards and duration), exit status 1.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path


RELAY_HELP = ("each board talks to the broker through a chaos proxy that logs its packets "
              "(boards/<name>/packets.jsonl, for tools/bench/demo_latency.py): one more hop per packet")


def add_subcommands(sub) -> None:
    p = sub.add_parser("fleet", help="run a fleet of emulated boards under a fault scenario",
                       description="Fleets of emulated boards under seeded fault scenarios.")
    fs = p.add_subparsers(title="fleet commands", metavar="ACTION", dest="fleet_action",
                          parser_class=sub._parser_class)
    r = fs.add_parser("run", help="run a scenario (TOML) with a seed",
                      description="Run N emulated boards with the scenario's fault schedule (drawn from the "
                      "seed), then check the ledger against what reached the broker.")
    r.add_argument("scenario", help="scenario file (TOML), e.g. scenarios/smoke.toml, or the name of "
                   "a bundled one (smoke, demo, demo-short)")
    r.add_argument("--seed", type=seed_arg, default=None,
                   help="seed of the fault schedule (default: a random one, printed)")
    r.add_argument("--boards", type=int, default=None, help="number of boards (overrides the scenario)")
    r.add_argument("--duration", type=float, default=None, help="seconds under faults (overrides the scenario)")
    r.add_argument("--out", default=None, help="output directory (default: fleet-out/<name>-seed<N>)")
    r.add_argument("--quiet", action="store_true", help="no live progress, only faults and the summary")
    r.add_argument("--relay", action="store_true", help=RELAY_HELP)
    r.add_argument("--broker", type=broker_arg, default=None, metavar="HOST:PORT",
                   help="a broker the team runs: the fleet starts no Mosquitto, and its broker faults go to "
                        "--broker-fault-hook or are skipped (said in the fault log and the summary)")
    r.add_argument("--broker-fault-hook", default=None, metavar="CMD",
                   help="with --broker: shell command that restarts that broker (TERN_BROKER_FAULT=soft|hard, "
                        "TERN_BROKER=HOST:PORT in its environment), returning once it is back")
    login = r.add_argument_group("with --broker: TLS and login, as tern pub takes them")
    login.add_argument("--cafile", help="CA certificates (PEM) to verify the broker with: TLS on, for the "
                       "boards, the observer and the collectors")
    login.add_argument("-u", "--username", help="user name")
    login.add_argument("-P", "--pw", dest="password", help="password (never printed; needs -u)")
    spark = r.add_argument_group("across machines (docs/fleet.md)")
    spark.add_argument("--master", default=None, metavar="URL",
                       help="run the boards in slices as Spark barrier tasks on this cluster (spark://HOST:PORT, "
                            "local[N]); the driver keeps the broker, collectors and observer. Default: one process")
    spark.add_argument("--slices", type=int, default=None,
                       help="with --master: number of slices (default: the cluster's cores, at most one per board)")
    spark.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                       help="with --master: a Spark setting (repeatable)")
    r.set_defaults(func=run)
    p.set_defaults(func=lambda args: (p.print_usage(sys.stderr), 2)[1])


def seed_arg(text: str) -> int:
    """argparse type of --seed (the fleet's and the demo's)."""
    import argparse

    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, not {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, not {text!r}")
    return v


def broker_arg(text: str) -> tuple[str, int]:
    """argparse type of --broker: HOST:PORT (an IPv6 host in brackets)."""
    import argparse

    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"must be HOST:PORT with a port 1..65535, not {text!r}")
    return host, int(port)


def replay_command(source: str, seed: int, boards: int, duration: float, relay: bool = False,
                   broker: tuple | None = None, hook: str | None = None, master: str | None = None,
                   slices: int | None = None) -> str:
    """The command that replays a run; never its password (-P is left for the user to give again)."""
    extra = (" --relay" if relay else "") + (f" --broker {broker[0]}:{broker[1]}" if broker else "") + (
        f" --broker-fault-hook {shlex.quote(hook)}" if hook else "") + (
        f" --master {shlex.quote(master)}" if master else "") + (f" --slices {slices}" if slices else "")
    return "tern fleet run %s --seed %d --boards %d --duration %g%s" % (
        shlex.quote(source), seed, boards, duration, extra)


def run(args) -> int:
    from rich.console import Console

    from .scenario import ScenarioError, load_scenario

    console = Console(highlight=False, soft_wrap=True)
    err = sys.stderr  # plain lines: an error or a replay command must never be wrapped
    try:
        scenario = load_scenario(args.scenario).with_overrides(boards=args.boards, duration=args.duration)
    except ScenarioError as e:
        err.write(f"tern fleet run: {e}" + "\n")
        return 2
    if args.broker_fault_hook and not args.broker:
        err.write("tern fleet run: --broker-fault-hook needs --broker (the fleet restarts its own broker itself)\n")
        return 2
    given = [f for f, v in (("--cafile", args.cafile), ("-u", args.username), ("-P", args.password)) if v is not None]
    if given and not args.broker:
        err.write(f"tern fleet run: {given[0]} needs --broker (the fleet's own Mosquitto is plain MQTT without users)\n")
        return 2
    if (args.slices is not None or args.conf) and not args.master:
        err.write(f"tern fleet run: {'--slices' if args.slices is not None else '--conf'} needs --master\n")
        return 2
    if args.slices is not None and not 1 <= args.slices <= scenario.boards:
        err.write(f"tern fleet run: --slices must be 1..{scenario.boards} (one board a slice at least), "
                  f"not {args.slices}\n")
        return 2
    from ..pipeline.spark import PipelineError, check_master, parse_confs
    from .login import BrokerLogin, LoginError

    confs = {}
    try:
        login = BrokerLogin(args.cafile, args.username, args.password) if given else None
        if args.master:
            check_master(args.master)
            confs = parse_confs(args.conf)
    except (LoginError, PipelineError, ValueError) as e:
        err.write(f"tern fleet run: {e}\n")
        return 2
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "big")
    replay = replay_command(args.scenario, seed, scenario.boards, scenario.duration, args.relay,
                            args.broker, args.broker_fault_hook, args.master, args.slices)
    if login is not None:  # the replay names the TLS and user flags, never the password
        replay += (f" --cafile {shlex.quote(args.cafile)}" if args.cafile else "") + (
            f" -u {shlex.quote(args.username)} -P PASSWORD" if args.username else "")
    out = Path(args.out or Path("fleet-out") / f"{scenario.name}-seed{seed}")
    console.print(f"fleet [bold]{scenario.name}[/]: {scenario.boards} boards ({scenario.profile}), "
                  f"{scenario.duration:g} s, seed={seed}, output in {out}")
    from .runner import ExternalBroker, Fleet
    from .view import FleetView

    view = FleetView(console, live=not args.quiet)
    t0 = time.monotonic()
    try:
        external = ExternalBroker(*args.broker, hook=args.broker_fault_hook) if args.broker else None
        kw = dict(seed=seed, out=out, replay=replay, callbacks=view, relay=args.relay, broker=external, tls=login)
        if args.master:
            from .spread import DriverFleet, default_slices, spark_session

            out.mkdir(parents=True, exist_ok=True)
            spark = spark_session(args.master, confs, jvm_log=str(out / "spark.log"))
            slices = min(scenario.boards, args.slices or default_slices(spark))
            fleet = DriverFleet(scenario, spark=spark, slices=slices, **kw)
        else:
            fleet = Fleet(scenario, **kw)
        with view:
            result = fleet.run()
    except KeyboardInterrupt:
        err.write(f"interrupted; seed={seed}\nreplay: {replay}" + "\n")
        return 130
    except Exception as e:  # the run broke down: still say how to get here again
        err.write(f"tern fleet run: {e.__class__.__name__}: {e}" + "\n")
        err.write(f"seed={seed}\nreplay: {replay}" + "\n")
        return 1
    view.summary(result, time.monotonic() - t0)
    if not result.ok:
        for f in result.failures:
            err.write(f"FAILED: {f}" + "\n")
        err.write(f"seed={seed}\nreplay: {replay}" + "\n")
        return 1
    console.print(f"[bold green]fleet ok[/] seed={seed}")
    return 0
