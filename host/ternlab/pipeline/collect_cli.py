"""``tern collect``'s options, their checks and the command itself; the collector is in :mod:`.collect`.

The broker flags are those of ``tern pub`` / ``tern sub`` (:mod:`ternlab.mqttcli.flags`), with collect's own
defaults: host 127.0.0.1, MQTT 5 (session expiry and Receive Maximum), ``--id`` required; ``--password``
is kept as an alias of ``-P/--pw``.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..mqttcli.flags import add_broker_options, add_login_options, add_tls_options, default_port, login, tls_context
from ..mqttcli.errors import CLIError
from ..mqttcli.redact import add_secret, env_password
from .collect import EXIT_USAGE, Collector


def _size(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}
    t = text.strip().lower()
    num = t.rstrip("kmgib")
    unit = t[len(num):]
    try:
        n = int(float(num) * units[unit])
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"not a size like 8M or 512k: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte: {text!r}")
    return n


def _positive(kind):
    def conv(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0: {text!r}")
        return v
    return conv


def _parse_fault(text):
    """``kill-after-commit:N`` / ``kill-after-ack:N`` -> ("commit" | "ack", N); ``fail-on-payload:TEXT``
    / ``unwritable:TEXT`` -> ("message" | "unwritable", TEXT as bytes); empty -> None."""
    if not text:
        return None
    what, _, n = text.partition(":")
    if what in ("fail-on-payload", "unwritable") and n:
        return "message" if what == "fail-on-payload" else what, n.encode()
    if what not in ("kill-after-commit", "kill-after-ack") or not n.isdigit() or int(n) < 1:
        raise ValueError(f"TERN_COLLECT_FAULT must be kill-after-commit:N, kill-after-ack:N (N >= 1), "
                         f"fail-on-payload:TEXT or unwritable:TEXT, not {text!r}")
    return what.rsplit("-", 1)[1], int(n)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("landing", help="landing root directory (created if missing)")
    p.add_argument("-t", "--topic", default="tern/+/telemetry",
                   help="topic filter (default: tern/+/telemetry, where the telemetry firmware publishes)")
    p.add_argument("--group", default="tern", help="shared subscription group (default: tern)")
    p.add_argument("-q", "--qos", type=int, choices=(1, 2), default=2,
                   help="subscription QoS (default 2: each message keeps the QoS it was published with)")
    p.add_argument("--batch-size", type=_positive(int), default=1000,
                   help="write a batch once this many messages wait (default 1000)")
    p.add_argument("--batch-bytes", type=_size, default=8 << 20,
                   help="... or once their payloads reach this size (default 8M)")
    p.add_argument("--batch-time", type=_positive(float), default=1.0,
                   help="... or once the oldest has waited this many seconds (default 1.0)")
    p.add_argument("--receive-max", type=int, default=None,
                   help="MQTT 5 Receive Maximum: unacknowledged messages the broker may send at once "
                        "(default: twice --batch-size, at most 65535)")
    p.add_argument("--session-expiry", type=int, default=7 * 86400,
                   help="MQTT 5 session expiry in seconds: how long the broker keeps this collector's "
                        "messages while it is down (default 604800, a week)")
    p.add_argument("--keep-raw", action="store_true", help="also store each raw payload in payload_raw")
    p.add_argument("--max-packet", type=_size, default=16 << 20,
                   help="largest MQTT packet taken (default 16M; MQTT 5 tells the broker, which drops "
                        "larger messages for this collector: keep the broker's message_size_limit below "
                        "it, see docs/pipeline.md)")
    p.add_argument("--retire", action="store_true",
                   help="retire collector --id: unsubscribe its shared subscription, land and "
                        "acknowledge what the broker still holds for it, end its session, exit 0")
    p.add_argument("--drain-idle", type=_positive(float), default=1.0,
                   help="--retire: the broker has nothing more once nothing came for this many "
                        "seconds (default 1.0; then one round trip confirms it)")
    p.add_argument("--qos2-window", type=_positive(int), default=65536,
                   help="QoS 2 messages (the newest landed) recognised by what they are when they come "
                        "again, whatever their packet id or DUP flag (default 65536)")
    p.add_argument("--progress", type=float, default=10.0,
                   help="seconds between progress lines (default 10; 0: none)")
    # The broker flags of tern pub / tern sub (ternlab.mqttcli.flags), with collect's own defaults: host
    # 127.0.0.1, MQTT 5 (session expiry and Receive Maximum), -i/--id required; --password kept.
    g = p.add_argument_group("broker (the flags of tern pub / tern sub)")
    add_broker_options(g, host_default="127.0.0.1", host_help="127.0.0.1", version_default=5, id_dest="id",
                       id_required=True, id_help="client id of this collector; keep it stable across restarts "
                       "(the broker keeps unacknowledged messages for it)")
    add_login_options(g, old_spellings=True)
    add_tls_options(p)


def check_args(args) -> str | None:
    """One line saying what is wrong with the options, or None."""
    args.port = default_port(args)
    from tern.topic import validate_filter

    if not args.group or any(c in args.group for c in "/+#\0"):
        return f"--group must be non-empty without '/', '+', '#': {args.group!r}"
    if not args.id or "\0" in args.id or len(args.id.encode()) > 65535:
        return f"--id must be a non-empty client id: {args.id!r}"
    try:
        validate_filter(args.topic)
    except ValueError as e:
        return f"--topic {args.topic!r} is not a valid topic filter: {e}"
    if args.topic.startswith("$share/"):
        return "--topic is the plain filter; the collector adds $share/<group>/ itself"
    if args.receive_max is None:
        args.receive_max = min(65535, 2 * args.batch_size)
    if not 0 < args.receive_max <= 65535:
        return f"--receive-max must be 1..65535, not {args.receive_max}"
    if not 1024 <= args.max_packet <= 268435460:
        return f"--max-packet must be 1k..256M (MQTT's largest packet), not {args.max_packet}"
    if args.session_expiry < 0 or args.session_expiry > 0xFFFFFFFF:
        return f"--session-expiry must be 0..4294967295, not {args.session_expiry}"
    try:
        args.password_bytes = login(args, old_spellings=True)
        args.ssl = tls_context(args)
    except CLIError as e:  # a UsageError, or a CA file that cannot be loaded
        return str(e)
    if args.progress < 0:
        return f"--progress must be >= 0, not {args.progress}"
    try:
        args.fault = _parse_fault(os.environ.get("TERN_COLLECT_FAULT"))
    except ValueError as e:
        return str(e)
    return None


def run(args) -> int:
    if args.password is None and args.username is not None:
        args.password = env_password()  # a fleet's collectors get it here, never in argv
    add_secret(args.password)  # `tern collect` registers it before argparse (mqttcli.flags.register_passwords)
    problem = check_args(args)
    if problem:
        print(f"tern collect: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    return Collector(args).run()


def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser(
        "collect", add_help=False,
        help="land telemetry from a shared subscription as Parquet, acknowledging after fsync",
        description="Join the shared subscription $share/GROUP/TOPIC with a persistent session and "
                    "write what arrives as Parquet landing files (date=/hour= partitions, committed "
                    "atomically); each message is acknowledged only once its file is durable. "
                    "Malformed payloads go to LANDING/quarantine; QoS 2 messages land exactly once, "
                    "across restarts too. --retire lands what the broker still holds for --id and "
                    "ends its session. Exit status 1 when the landing directory cannot be written or "
                    "the broker refuses; 0 after SIGTERM/SIGINT or a completed --retire.")
    p.add_argument("--help", action="help", help="show this help and exit")
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tern", add_help=False)
    sub = parser.add_subparsers(dest="command", required=True)
    add_subcommands(sub)
    args = parser.parse_args(["collect", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
