"""The ``collect``, ``audit``, ``rollup`` and ``report`` subcommands of ``tern``.

``add_subcommands(subparsers)`` registers them on an argparse subparsers object; each parsed namespace
has ``func(args) -> exit status``. ``python -m ternlab.pipeline.cli`` runs them standalone.

Exit status: 0 success (audit: verdict PASS), 1 audit verdict FAIL, 2 bad usage or input (including
Java missing or too old, missing paths, a failed Spark job); errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import sys

from . import inputs
from .spark import PipelineError, SparkJob, check_master, parse_confs, spark_error_line

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def _spark_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Spark")
    g.add_argument("--master", default=None,
                   help="Spark master URL, e.g. spark://host:7077 or yarn (default: spark-defaults.conf's, else local[*])")
    g.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark configuration property (repeatable)")
    g.add_argument("--spark-log", metavar="FILE",
                   help="where the JVM's output and Spark's log go (appended; default: a temporary file, "
                        "removed after a successful run and named in the error line of a failed one)")


def _one_line(e: BaseException) -> str:
    """One line for an exception: Spark's error class and message (which name the file and column of
    a bad input) for a failed Spark call, else the first line of the message with the type."""
    if type(e).__name__ == "Py4JJavaError":  # its first line is "An error occurred while calling o12.x"
        return spark_error_line(e)
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _runner(name: str, job):
    """Wrap a job(spark, args) -> status with input checks, session handling and one-line errors.

    Everything Spark and its JVM print goes to a log file (SparkJob), so stderr holds Tern's lines only:
    one per error, naming what was wrong; a Spark failure's line also names the log."""

    def run(args) -> int:
        def fail(text: str, log: str | None = None) -> int:
            print(f"tern {name}: error: {text}" + (f" (Spark's log: {log})" if log else ""), file=sys.stderr)
            return EXIT_USAGE

        try:
            confs = parse_confs(args.conf)
            check_master(args.master)
            # what each path is, before Spark starts: a wrong folder is one line naming what it is
            for kind, path in getattr(args, "local_inputs", lambda a: [])(args):
                inputs.check(kind, path)
            sj = SparkJob(f"tern-{name}", args.master, confs, args.spark_log)
        except PipelineError as e:
            return fail(str(e))
        try:
            try:
                spark = sj.start()
            except PipelineError as e:
                return fail(str(e))
            except Exception as e:  # Spark could not start (an unreachable master, a bad --conf): not a FAIL
                sj.failed = True
                return fail(f"cannot start Spark: {_one_line(e)}", sj.jvm_log)
            try:
                return job(spark, args)
            except PipelineError as e:  # Tern's own check: its line says it all
                return fail(str(e))
            except Exception as e:  # Spark analysis / job failures: one line, not a JVM stack trace
                sj.failed = True
                return fail(_one_line(e), sj.jvm_log)
        finally:
            sj.stop()

    return run


def _audit(spark, args) -> int:
    from .audit import run_audit
    from .report import print_summary

    summary = run_audit(spark, args.landing, args.out, ledger=args.ledger,
                        ledger_fmt=args.ledger_format, order_ref=args.order_ref)
    if not args.quiet:
        print_summary(summary, problems=args.problems)
    return EXIT_OK if summary["verdict"]["ok"] else EXIT_FAIL


def _rollup(spark, args) -> int:
    from . import rollup

    if args.stream:
        rollup.run_stream(spark, args.landing, args.out, window=args.window, time_col=args.time,
                          watermark=args.watermark, checkpoint=args.checkpoint, once=args.once)
        print(f"streaming rollup {'finished' if args.once else 'stopped'}; output in {args.out}")
    else:
        if args.once or args.checkpoint:
            raise PipelineError("--once and --checkpoint only apply with --stream")
        n = rollup.run_rollup(spark, args.landing, args.out, window=args.window, time_col=args.time)
        print(f"{n} rollup rows written to {args.out}")
    return EXIT_OK


def _report(spark, args) -> int:
    from .report import run_report

    res = run_report(spark, args.audit, args.out, landing=args.landing, bucket=args.bucket,
                     faults=args.faults, observer=args.observer)
    print(f"report written to {res['index']}")
    return EXIT_OK


def add_subcommands(subparsers) -> None:
    """Register ``collect``, ``audit``, ``rollup`` and ``report`` on an argparse subparsers object."""
    from . import collect_cli

    collect_cli.add_subcommands(subparsers)
    p = subparsers.add_parser(
        "audit", help="delivery audit of a landing set (exit 1 when a guarantee is broken)",
        description="Per device and QoS: expected, received, unique, lost, duplicated, reordered and "
                    "latency percentiles. Writes OUT/devices (Parquet) and OUT/summary.json. Exit "
                    "status 1 when a QoS>=1 message was lost or a QoS 2 message duplicated.")
    p.add_argument("landing", help="landing root (date=*/hour=* Parquet partitions); any Hadoop path")
    p.add_argument("--out", required=True, help="output directory (any Hadoop path)")
    p.add_argument("--ledger", help="what devices published (Parquet or JSON lines); without it, "
                                    "expected is inferred from the highest seq received per boot")
    p.add_argument("--ledger-format", choices=("auto", "parquet", "json"), default="auto")
    p.add_argument("--order-ref", help="copies seen by a subscriber of its own (JSON lines or Parquet: "
                                       "device, boot, qos, seq, recv_ts; e.g. a fleet's received.jsonl): "
                                       "its order is judged too (order is judged per subscriber stream)")
    p.add_argument("--quiet", action="store_true", help="no summary table on stdout")
    p.add_argument("--problems", action="store_true",
                   help="also list which (device, boot, seq) were lost, duplicated or reordered (the "
                        "first 200 of each kind; all of them are in OUT/problems)")
    _spark_options(p)
    p.set_defaults(func=_runner("audit", _audit), local_inputs=lambda a: [
        ("landing", a.landing), *([("ledger", a.ledger)] if a.ledger else []),
        *([("order reference", a.order_ref)] if a.order_ref else [])])

    p = subparsers.add_parser(
        "rollup", help="per device and time window count/min/max/mean of each reading",
        description="Batch (default) or Structured Streaming rollup of the readings.")
    p.add_argument("landing", help="landing root; any Hadoop path")
    p.add_argument("--out", required=True, help="output directory (Parquet)")
    p.add_argument("--window", default="1 minute", help="tumbling window length (default: 1 minute)")
    p.add_argument("--time", choices=("recv_ts", "sent_ts"), default="recv_ts",
                   help="time column the window is taken on (default: recv_ts)")
    p.add_argument("--stream", action="store_true", help="run as Structured Streaming")
    p.add_argument("--watermark", default="2 minutes",
                   help="how late data may arrive in --stream mode (default: 2 minutes)")
    p.add_argument("--once", action="store_true",
                   help="with --stream: process what is there now and stop (availableNow trigger)")
    p.add_argument("--checkpoint", help="with --stream: checkpoint location (default OUT/_checkpoint)")
    _spark_options(p)
    p.set_defaults(func=_runner("rollup", _rollup), local_inputs=lambda a: [("landing", a.landing)])

    p = subparsers.add_parser(
        "report", help="HTML report with plots, and the terminal summary",
        description="Reads an audit output directory (and the landing data) and writes OUT/index.html, "
                    "one self-contained page (inline SVG plots): delivery over time with the faults, "
                    "latency per QoS, which messages were lost (and where: before the broker or between "
                    "broker and landing, with the fault that overlapped each one's flight), duplicated or "
                    "reordered, every fault of the run, each board's reboots, links to the run's logs.")
    p.add_argument("--audit", required=True, help="audit output directory (from tern audit --out)")
    p.add_argument("--out", required=True, help="report directory")
    p.add_argument("--landing", help="landing root (default: the one recorded by the audit)")
    p.add_argument("--faults", help="the run's faults.jsonl, drawn over the time plots (default: "
                                    "faults.jsonl beside the landing directory, if there is one)")
    p.add_argument("--observer", help="copies a subscriber of its own received (JSON lines or Parquet: device, boot, "
                                      "qos, seq, recv_ts), which say whether a loss happened before the broker or "
                                      "after it (default: the audit's --order-ref, else received.jsonl beside the "
                                      "landing directory, if there is one)")
    p.add_argument("--bucket", type=float, default=None,
                   help="time bucket in seconds for the time plots (default: about 60 buckets)")
    _spark_options(p)
    p.set_defaults(func=_runner("report", _report), local_inputs=lambda a: [
        ("audit", a.audit), *([("landing", a.landing)] if a.landing else []),
        *([("fault log", a.faults)] if a.faults else []),
        *([("observer's copies", a.observer)] if a.observer else [])])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tern", description="Tern data pipeline (Apache Spark)")
    sub = parser.add_subparsers(dest="command", required=True)
    add_subcommands(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
