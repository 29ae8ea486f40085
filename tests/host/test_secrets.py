"""No output of any `tern` command run with a password shows it: every way a password arrives (-P, --pw,
--password, -L URLs however malformed, a config file, the environment), through success, refusal, bad
arguments and -d traces; stdout, stderr and every file the command wrote (landing, outbox, logs) are
grepped for the password and for any long piece of it. Real processes against a real Mosquitto with a
password file. (A whole fleet run against a broker with a password: test_fleet_external.)"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ternlab.brokers.mosquitto import Broker

TERN = str(Path(sys.executable).with_name("tern"))
GOOD = "Corr3ct-Horse-Battery"
BAD = "Sup3rS3cretPass"


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    b = Broker(tmp_path_factory.mktemp("locked"), users={"alice": GOOD}).start()
    yield b
    b.stop()


def pieces(secret):
    """The secret and every piece of it of 8 characters or more (a parser may quote part of one)."""
    return {secret[i:i + n] for n in range(8, len(secret) + 1) for i in range(len(secret) - n + 1)}


def leaks(text, secret):
    return sorted(p for p in pieces(secret) if p in text)


def files_text(*roots):
    out = []
    for root in roots:
        for p in Path(root).rglob("*"):
            if p.is_file():
                out.append(f"{p}\n" + p.read_bytes().decode("utf-8", "replace"))
    return "\n".join(out)


def run(tmp_path, *argv, env=None, timeout=60, stdin=None):
    r = subprocess.run([TERN, *map(str, argv)], capture_output=True, cwd=tmp_path, timeout=timeout,
                       env=dict(os.environ, **(env or {})), input=stdin)
    return r.returncode, (r.stdout + r.stderr).decode("utf-8", "replace")


def test_pub_and_sub_never_print_a_password(locked, tmp_path):
    h, p = locked.host, locked.port
    at = f"{h}:{p}"
    outbox = tmp_path / "outbox"
    cases = [
        # the URL: a '/' in the password makes its first part the "port"
        (1, BAD, ["pub", "-L", f"mqtt://alice:{BAD}/x9@host/t", "-m", "x"]),
        (1, BAD, ["sub", "-L", f"mqtt://alice:{BAD}/x9@host/t", "-W", "1"]),
        (1, BAD, ["pub", f"-Lmqtt://alice:{BAD}@{h}:99999/t", "-m", "x"]),
        (1, BAD, ["pub", "--url", f"mqtt://alice:{BAD}@/t", "-m", "x"]),
        (1, BAD, ["pub", "-L", f"mqtt://alice:{BAD}@{at}/t", "-q", "7", "-m", "x"]),
        (5, BAD, ["pub", "-L", f"mqtt://alice:{BAD}@{at}/t", "-m", "x", "-d"]),
        (5, BAD, ["pub", "-h", h, "-p", p, "-u", "alice", "-P", BAD, "-t", "t", "-m", "x", "-d"]),
        (5, BAD, ["pub", "-h", h, "-p", p, "-u", "alice", f"--pw={BAD}", "-t", "t", "-m", "x"]),
        (1, BAD, ["pub", "-h", h, "-p", p, "-P", BAD, "-t", "t", "-m", "x"]),  # no -u
        (1, BAD, ["pub", "-h", h, "-p", p, "-u", "alice", "-P", BAD, BAD]),  # a stray argument
        (5, BAD, ["sub", "-h", h, "-p", p, "-u", "alice", "-P", BAD, "-t", "t", "-d"]),
        (0, GOOD, ["pub", "-h", h, "-p", p, "-u", "alice", "-P", GOOD, "-t", "t", "-m", "x", "-q", "2", "-d"]),
        (0, GOOD, ["pub", "-L", f"mqtt://alice:{GOOD}@{at}/t", "-m", "y", "-q", "1", "-c", "-i", "ob",
                   "--outbox", outbox, "-d"]),
        (27, GOOD, ["sub", "-L", f"mqtt://alice:{GOOD}@{at}/t", "-W", "1", "-d", "-v"]),
    ]
    for status, secret, argv in cases:
        rc, out = run(tmp_path, *argv)
        assert rc == status, (argv, out)
        assert not leaks(out, secret), (argv, out)
    assert not leaks(files_text(tmp_path), GOOD) and not leaks(files_text(tmp_path), BAD)


def test_collect_never_prints_a_password(locked, tmp_path):
    land = tmp_path / "landing"
    base = ["collect", land, "--id", "col-s", "-h", locked.host, "-p", locked.port, "--progress", "0.2"]
    for argv, env in (
            ([*base, "-u", "alice", "-P", BAD], None),
            ([*base, "-u", "alice", f"--password={BAD}"], None),
            ([*base, "-u", "alice"], {"TERN_FLEET_PASSWORD": BAD}),          # a fleet's collector
            ([*base, "-P", BAD], None),                                       # no -u
            ([*base, "-u", "alice", "--pw", BAD, "--batch-size", "0"], None),  # argparse's error
    ):
        rc, out = run(tmp_path, *argv, env=env)
        assert rc in (1, 2) and out, (argv, out)
        assert not leaks(out, BAD), (argv, out)
    # a run that lands something, and stops on SIGTERM
    p = subprocess.Popen([TERN, *map(str, base), "-u", "alice", "-P", GOOD, "--batch-time", "0.2"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    time.sleep(3)
    rc, out = run(tmp_path, "pub", "-h", locked.host, "-p", locked.port, "-u", "alice", "-P", GOOD, "-q", "1",
                  "-t", "tern/d/telemetry", "-m", json.dumps({"d": "d", "b": 1, "s": 0, "q": 1}))
    assert rc == 0, out
    time.sleep(1.5)
    p.send_signal(signal.SIGTERM)
    out = p.communicate(timeout=30)[0].decode()
    assert p.returncode == 0 and "landed=1" in out, out
    assert not leaks(out, GOOD) and not leaks(files_text(tmp_path), GOOD)


def test_a_config_file_and_a_fleet_command_line_never_print_a_password(tmp_path):
    cfg = tmp_path / "config.json"
    for text in (json.dumps({"host": "b", "user": "u", "password": BAD, "wifi_password": BAD + "-wifi",
                             "hots": "typo"}),
                 # JSON MicroPython reads otherwise than other tools: refused, showing what the board would read
                 '{"host": "b", "user": "u", "password": "%s" "count": 1}' % BAD):
        cfg.write_text(text)
        rc, out = run(tmp_path, "deploy", "--emulated", tmp_path / "b", "--create", "--config", cfg)
        assert rc == 1 and "tern deploy: " in out, out
        assert not leaks(out, BAD), out
    for argv in (["fleet", "run", "smoke", "--broker", "127.0.0.1:1", "-P", BAD],
                 ["fleet", "run", "smoke", "--broker", "127.0.0.1:1", "-u", "u", "--pw", BAD, "--cafile", "none.pem"],
                 ["fleet", "run", "smoke", "-u", "u", f"--pw={BAD}", "--bogus"]):
        rc, out = run(tmp_path, *argv)
        assert rc == 2 and out, (argv, out)
        assert not leaks(out, BAD), (argv, out)
    # a config that deploys: the board keeps the password in its own config.json, and nothing else shows it
    cfg.write_text(json.dumps({"host": "127.0.0.1", "user": "u", "password": GOOD, "count": 1}))
    d = tmp_path / "board"
    rc, out = run(tmp_path, "deploy", "--emulated", d, "--create", "--profile", "unix-emulated", "--config", cfg,
                  timeout=300)
    assert rc == 0 and "config.json" in out, out
    assert not leaks(out, GOOD), out
    assert not leaks((d / "console.log").read_text(errors="replace"), GOOD)
