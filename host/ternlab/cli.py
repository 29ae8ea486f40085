"""The `tern` command.

Each feature module registers its own subcommands with a function
`add_subcommands(subparsers)`; each subcommand sets `func(args) -> exit code`
with `set_defaults`. `ternlab.mqttcli.commands` (pub, sub) is always there. Optional
modules (the Spark pipeline, the demo) are imported only when one of their
commands is asked for, so `tern pub` never pays for PySpark, and a missing
module or dependency turns that command into a one-line error instead of
breaking the whole CLI.

Exit codes: 0 ok, 1 failure, 2 usage error (argparse's); a command may use
others (`tern pub` and `tern sub` exit as mosquitto_pub/sub 2.0: 1 for a
bad argument, 2 when the broker breaks the protocol, 27 for `-W`). Errors are one line on
stderr; values of secret options (passwords) are masked in every message the
CLI prints.
"""

import argparse
import importlib
import sys

from .mqttcli.redact import guard_streams, redact

# module, the commands it is expected to provide, one-line help for them
# (shown without importing the module), and what to install when it fails.
OPTIONAL = (
    ("ternlab.pipeline.cli", {
        "collect": "land telemetry from a shared subscription as Parquet, ack after fsync",
        "audit": "delivery audit of landed telemetry (Spark)",
        "rollup": "per-device, per-window rollups of telemetry (Spark)",
        "report": "HTML report with plots and a terminal summary (Spark)",
    }, "pip install 'ternlab[pipeline]'"),
    ("ternlab.demo", {"demo": "run the Tern demo"}, None),
    ("ternlab.fleet.cli", {"fleet": "run a fleet of emulated boards under a seeded fault scenario"}, None),
    ("ternlab.boards.cli", {
        "board": "run an emulated board in the foreground (tern board run)",
        "deploy": "compile lib/tern's device set and the telemetry app (firmware/app) with mpy-cross and copy them to a board",
        "flash": "write a MicroPython image and the profile's partition table to an ESP32 (esptool)",
        "repl": "a terminal on a board's REPL",
    }, None),
    ("ternlab.boards.firmware", {"firmware": "build the qemu boards' firmware (tern firmware build)"}, None),
)

def version():
    try:
        from importlib.metadata import version as _v

        return _v("ternlab")  # the harness's distribution (the library's is tern-mqtt)
    except Exception:
        return "unknown"


class _Version(argparse.Action):
    """--version, the distribution's metadata read only when asked (importlib.metadata is some
    20 ms of every command's start-up)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print("tern %s" % version())
        parser.exit()


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 2) and secrets masked."""

    def __init__(self, *a, **k):
        k.setdefault("allow_abbrev", False)
        super().__init__(*a, **k)

    def error(self, message):
        self.exit(2, "%s: %s (see %s --help)\n" % (self.prog, redact(message), self.prog))


def _command_word(argv):
    """The subcommand asked for: the first word that is not a top-level option."""
    for a in argv:
        if a == "--":
            return None
        if not a.startswith("-"):
            return a
    return None


def _unavailable(subparsers, name, help_text, message):
    p = subparsers.add_parser(name, help=help_text, add_help=False, prefix_chars="\0")
    p.add_argument("rest", nargs=argparse.REMAINDER)

    def run(args):
        sys.stderr.write("tern %s: %s\n" % (name, redact(message)))
        return 1

    p.set_defaults(func=run)


def _import_failure(modname, hint, e):
    if isinstance(e, ModuleNotFoundError) and e.name and (modname == e.name or modname.startswith(e.name + ".")):
        return "not available: %s is not installed" % modname
    why = "%s: %s" % (e.__class__.__name__, e)
    return "not available: %s%s" % (why, " (install with: %s)" % hint if hint else "")


def _add_optional(subparsers, modname, commands, hint, load):
    if not load:
        for name, help_text in commands.items():
            _unavailable(subparsers, name, help_text, "internal error: %s was not loaded" % modname)
        return
    try:
        mod = importlib.import_module(modname)
        before = set(subparsers.choices)
        try:
            mod.add_subcommands(subparsers)
        except Exception:
            added = set(subparsers.choices) - before  # drop a half registration
            for name in added:
                del subparsers.choices[name]
            subparsers._choices_actions[:] = [a for a in subparsers._choices_actions if a.dest not in added]
            raise
    except Exception as e:
        message = _import_failure(modname, hint, e)
        for name, help_text in commands.items():
            if name not in subparsers.choices:
                _unavailable(subparsers, name, help_text + " [unavailable]", message)


def build_parser(argv=()):
    parser = Parser(prog="tern", description="Tern: an MQTT client that does not lose messages, "
                    "its test harness and its delivery audit.")
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command", parser_class=Parser)
    from .mqttcli import commands as pubsub

    pubsub.add_subcommands(sub)
    word = _command_word(argv)
    known = {name for _, cmds, _ in OPTIONAL for name in cmds}
    for modname, commands, hint in OPTIONAL:
        # Import only for the command asked for (or an unknown word, which
        # may be a command the module adds); help lists the rest unloaded.
        load = word is not None and word not in sub.choices and (word in commands or word not in known)
        _add_optional(sub, modname, commands, hint, load)
    return parser


def main(argv=None):
    """Run `tern` with argv (default: sys.argv[1:]); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    guard_streams()  # every line this process prints goes through redact
    word = _command_word(argv)
    from .mqttcli import commands as pubsub
    from .mqttcli.flags import register_passwords

    # every command's passwords (-P, --pw, --password, -L URLs) are registered before argparse runs
    register_passwords(argv[argv.index(word) + 1 :] if word else argv)
    if word in ("pub", "sub"):
        k = argv.index(word) + 1
        argv = argv[:k] + pubsub.prepare_argv(argv[k:])
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        func = getattr(args, "func", None)
        if func is None:
            names = ", ".join(parser._subparsers._group_actions[0].choices)
            sys.stderr.write("tern: a command is needed: %s (see tern --help)\n" % names)
            return 2
        return int(func(args) or 0)
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            if code == 2 and word in ("pub", "sub"):
                return pubsub.EXIT_USAGE  # as mosquitto_pub/sub: a bad argument is status 1
            return code
        sys.stderr.write(redact("%s\n" % code))
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
