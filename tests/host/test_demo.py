"""`tern demo` in its short form: its verdict is the assertion."""

import argparse

from ternlab import demo


def run_demo(*argv):
    p = argparse.ArgumentParser()
    demo.add_subcommands(p.add_subparsers())
    args = p.parse_args(["demo", *argv])
    return args.func(args)


def test_short_demo_loses_nothing_through_a_broker_kill(capsys):
    assert run_demo("--short") == 0
    out = capsys.readouterr().out
    assert "broker killed with SIGKILL" in out
    assert "VERDICT: no QoS 1 message lost" in out


def test_demo_rejects_bad_arguments(capsys):
    assert run_demo("--messages", "0") == 2
    assert "--messages must be >= 1" in capsys.readouterr().out
