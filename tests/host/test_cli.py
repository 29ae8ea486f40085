"""The `tern` command: skeleton, `tern pub` and `tern sub` against a real Mosquitto, with
mosquitto_pub / mosquitto_sub as the peers. Most runs are in-process (ternlab.cli.main with
capsys); a few run the installed console script as a real process."""

import fcntl
import io
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from ternlab import cli
from ternlab.brokers.mosquitto import Broker, free_port
from ternlab.brokers.chaos import B2C, C2B

TERN = str(Path(sys.executable).with_name("tern"))
MOSQ_PUB = "/usr/bin/mosquitto_pub"
MOSQ_SUB = "/usr/bin/mosquitto_sub"


def tern(capsys, *argv):
    """Run `tern argv...` in-process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def conn(broker):
    return ["-h", broker.host, "-p", broker.port]


def log_text(broker):
    return broker.log_path.read_text(errors="replace") if broker.log_path.exists() else ""


def wait_log(broker, needle, count=1, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log_text(broker).count(needle) >= count:
            return
        time.sleep(0.02)
    raise AssertionError("broker log never showed %r x%d:\n%s" % (needle, count, broker.log_tail()))


class MosqSub:
    """mosquitto_sub as the receiving peer, started and subscribed before use."""

    def __init__(self, broker, *args, client_id="peer", count=1, timeout=8):
        self.proc = subprocess.Popen(
            [MOSQ_SUB, "-h", broker.host, "-p", str(broker.port), "-i", client_id, "-C", str(count),
             "-W", str(timeout)] + [str(a) for a in args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_log(broker, "Sending SUBACK to " + client_id)

    def result(self):
        out, err = self.proc.communicate(timeout=15)
        assert self.proc.returncode == 0, err.decode()
        return out


def mosq_pub(broker, *args):
    subprocess.run([MOSQ_PUB, "-h", broker.host, "-p", str(broker.port)] + [str(a) for a in args],
                   check=True, timeout=10)


def publish_when_subscribed(broker, client_id, *pubs, subacks=1):
    """In the background: once `client_id` has its SUBACK (its `subacks`-th), run mosquitto_pub with
    each args list."""
    errors = []

    def run():
        try:
            wait_log(broker, "Sending SUBACK to " + client_id, subacks)
            for args in pubs:
                mosq_pub(broker, *args)
        except BaseException as e:  # reported by the test, not lost in the thread
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, errors


def one_line(err):
    lines = err.splitlines()
    assert len(lines) == 1, "expected one line on stderr, got %r" % err
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------- skeleton


def test_version_and_help(capsys):
    rc, out, _ = tern(capsys, "--version")
    from importlib.metadata import version

    # the harness's distribution is ternlab (it printed "tern unknown": no distribution is called tern)
    assert rc == 0 and out == "tern %s\n" % version("ternlab") and "unknown" not in out
    rc, out, _ = tern(capsys, "pub", "--help")
    assert rc == 0 and "-h HOST" in out and "--will-topic" in out
    rc, _, err = tern(capsys)
    assert rc == 2 and "pub" in one_line(err)


def test_no_help_text_of_any_command_shows_a_default_of_none(capsys):
    # `tern board run --help` said "--profile NAME  board profile (...; default None)": every option of
    # every command (subcommands of subcommands too) says what is used when it is not given, or nothing.
    import argparse
    import re

    def walk(parser, words):
        yield words, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, words + [name])

    seen = 0
    for words, parser in walk(cli.build_parser(["--help"]), []):
        if words and words[0] in dict.fromkeys(n for _, cmds, _ in cli.OPTIONAL for n in cmds):
            parser = next(p for w, p in walk(cli.build_parser(words), []) if w == words)  # its module loaded
        text = " ".join(parser.format_help().split())
        seen += 1
        assert not re.search(r"default:? None\b|\(None\)", text), (words, re.findall(r".{60}default:? None.{0,20}", text))
    assert seen >= 14, seen  # tern, its commands, board run, fleet run, firmware build ...
    rc, out, _ = tern(capsys, "board", "run", "--help")
    assert rc == 0 and "default the one the folder's board last ran, else unix-emulated" in " ".join(out.split())


def test_help_and_readme_say_what_differs_from_mosquitto_on_purpose(capsys):
    from ternlab.mqttcli import commands as mqtt_cli

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `tern pub`, `tern sub` |"))
    for tool in ("pub", "sub"):
        rc, out, _ = tern(capsys, tool, "--help")
        assert rc == 0 and "differs from mosquitto_%s on purpose:" % tool in out
        flat = " ".join(out.split())
        for d in mqtt_cli.DIFFERENCES["both"] + mqtt_cli.DIFFERENCES.get(tool, ()):
            assert " ".join(d.split()) in flat and d in row
        assert "not implemented: -A, --unix" in flat
    assert "Not implemented: " + mqtt_cli.NOT_IMPLEMENTED in row


def test_optional_modules_are_lazy_and_failures_are_one_line(capsys, tmp_path, monkeypatch, broker):
    (tmp_path / "tern_fake_pipeline.py").write_text(
        "import tern_dependency_that_is_not_installed\n"
        "def add_subcommands(subparsers):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "OPTIONAL", cli.OPTIONAL + (
        ("tern_fake_pipeline", {"fakeaudit": "audit things"}, "pip install 'ternlab[pipeline]'"),
        ("ternlab.no_such_module", {"ghost": "haunt"}, None),
    ))
    # pub works and does not import the optional modules
    rc, _, err = tern(capsys, "pub", *conn(broker), "-t", "lazy", "-m", "x")
    assert rc == 0, err
    assert "tern_fake_pipeline" not in sys.modules
    # their help lines are listed without importing them
    rc, out, _ = tern(capsys, "--help")
    assert rc == 0 and "fakeaudit" in out and "ghost" in out
    assert "tern_fake_pipeline" not in sys.modules
    # a missing dependency or module: one line, status 1
    rc, _, err = tern(capsys, "fakeaudit", "--out", "x")
    line = one_line(err)
    assert rc == 1 and "tern_dependency_that_is_not_installed" in line and "pip install" in line
    rc, _, err = tern(capsys, "ghost")
    assert rc == 1 and "ternlab.no_such_module is not installed" in one_line(err)


# ------------------------------------------------------------------- pub


@pytest.mark.parametrize("version,level", [("31", "p1"), ("311", "p2"), ("mqttv5", "p5")])
def test_pub_each_version_and_qos_reaches_mosquitto_sub(capsys, broker, version, level):
    peer = MosqSub(broker, "-t", "v/#", "-q", "2", "-F", "%t %q %r %p", count=3)
    for q in (0, 1, 2):
        rc, _, err = tern(capsys, "pub", *conn(broker), "-V", version, "-q", q, "-t", "v/%d" % q,
                          "-m", "hello %d" % q, "-i", "tp%s%d" % (version, q), "-k", 30)
        assert rc == 0, err
        assert err == ""
    lines = sorted(peer.result().decode().splitlines())
    assert lines == ["v/0 0 0 hello 0", "v/1 1 0 hello 1", "v/2 2 0 hello 2"]
    log = log_text(broker)
    for q in (0, 1, 2):  # the broker saw the asked-for protocol level and keepalive
        assert "as tp%s%d (%s, c1, k30)" % (version, q, level) in log


def test_pub_retained_null_and_file(capsys, broker, tmp_path):
    blob = bytes(range(256)) * 4
    f = tmp_path / "blob.bin"
    f.write_bytes(blob)
    live = MosqSub(broker, "-t", "r/#", "-F", "%t %r %l %x", count=2)
    rc, _, err = tern(capsys, "pub", *conn(broker), "-t", "r/file", "-f", f, "-r", "-q", 1)
    assert rc == 0, err
    rc, _, err = tern(capsys, "pub", *conn(broker), "-t", "r/null", "-n", "-q", 2)
    assert rc == 0, err
    # a live subscriber sees no retain flag (MQTT 3.1.1 3.3.1.3)
    assert live.result().decode().splitlines() == ["r/file 0 1024 " + blob.hex(), "r/null 0 0 "]
    # retained: a subscriber that comes later still gets it, with the flag
    got = MosqSub(broker, "-t", "r/#", "-F", "%t %r %l", client_id="late").result()
    assert got == b"r/file 1 1024\n"
    # -r -n clears it
    rc, _, err = tern(capsys, "pub", *conn(broker), "-t", "r/file", "-n", "-r")
    assert rc == 0, err
    rc, out, _ = tern(capsys, "sub", *conn(broker), "-t", "r/#", "-W", 0.5)
    assert rc == 27 and out == ""


def test_pub_lines_and_whole_stdin_in_process(capsys, broker, monkeypatch):
    peer = MosqSub(broker, "-t", "l", "-F", "[%p]", count=5)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a\n\nb\r\nc")))
    rc, _, err = tern(capsys, "pub", *conn(broker), "-t", "l", "-l", "-q", 1)
    assert rc == 0, err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"all\nof it\n")))
    rc, _, err = tern(capsys, "pub", *conn(broker), "-t", "l", "-s")
    assert rc == 0, err
    # as mosquitto_pub -l: an empty line is an empty message; only '\n' is stripped
    assert peer.result() == b"[a]\n[]\n[b\r]\n[c]\n[all\nof it\n]\n"


def test_pub_lines_as_a_real_process_keeps_streaming(broker):
    peer = MosqSub(broker, "-t", "stream", "-q", "1", count=3)
    p = subprocess.Popen([TERN, "pub", *map(str, conn(broker)), "-t", "stream", "-l", "-q", "1"],
                         stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdin.write(b"one\ntwo\n")
    p.stdin.flush()
    # each line goes out as it is read, while stdin is still open
    assert peer.proc.stdout.readline() == b"one\n"
    assert peer.proc.stdout.readline() == b"two\n"
    assert p.poll() is None
    p.stdin.write(b"three")  # the last line needs no newline
    p.stdin.close()
    assert p.wait(timeout=10) == 0, p.stderr.read().decode()
    assert peer.result() == b"three\n"


def test_pub_properties_reach_a_v5_subscriber(capsys, broker):
    peer = MosqSub(broker, "-V", "5", "-t", "p5", "-F", "%P|%C|%R|%D|%F|%E|%p")
    rc, _, err = tern(capsys, "pub", *conn(broker), "-V", "5", "-t", "p5", "-m", "hi", "-q", 1,
                      "-D", "publish", "user-property", "k", "v",
                      "-D", "publish", "user-property", "name with space", "-dash",
                      "-D", "publish", "content-type", "text/plain",
                      "-D", "publish", "response-topic", "reply/here",
                      "-D", "publish", "correlation-data", "abc",
                      "-D", "publish", "payload-format-indicator", "1",
                      "-D", "publish", "message-expiry-interval", "300",
                      "-D", "connect", "user-property", "who", "test")
    assert rc == 0, err
    fields = peer.result().decode().rstrip("\n").split("|")
    assert fields[:5] == ["k:v name with space:-dash", "text/plain", "reply/here", "abc", "1"]
    assert 298 <= int(fields[5]) <= 300 and fields[6] == "hi"


def test_pub_debug_trace_and_will(capsys, broker):
    # the will goes out when the connection drops without DISCONNECT: use tern sub's
    # connection (killed below) to carry it, and check it at a mosquitto_sub peer
    peer = MosqSub(broker, "-t", "will/#", "-v", "-V", "5", "-F", "%t %r %p %C", client_id="wpeer")
    p = subprocess.Popen([TERN, "sub", *map(str, conn(broker)), "-t", "nothing", "-i", "willer",
                          "-V", "5", "--will-topic", "will/x", "--will-payload", "gone", "--will-qos", "1",
                          "-D", "will", "content-type", "text/farewell"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_log(broker, "Sending SUBACK to willer")
    p.kill()
    p.wait()
    assert peer.result() == b"will/x 0 gone text/farewell\n"

    # -d: the trace goes to stdout, line for line as mosquitto_pub -d writes it
    for version in ("311", "5"):
        args = ["-t", "dbg", "-m", "12345", "-q", "2", "-d", "-u", "someone", "-P", "hunter2-password",
                "-i", "dbg1", "-V", version]
        rc, out, err = tern(capsys, "pub", *conn(broker), *args)
        assert rc == 0 and err == "", err
        assert "Client dbg1 sending CONNECT" in out
        assert "sending PUBLISH (d0, q2, r0, m1, 'dbg', ... (5 bytes))" in out
        mosq = subprocess.run([MOSQ_PUB, *map(str, conn(broker)), *args], capture_output=True, timeout=10)
        assert out == mosq.stdout.decode() and mosq.stderr == b""
        assert "hunter2" not in out


def test_sub_debug_trace_goes_to_stdout_as_mosquitto_sub(capsys, broker):
    pubs = (["-t", "dbg/1", "-m", "one", "-q", "1"], ["-t", "dbg/2", "-m", "two", "-q", "2"])
    args = ["-t", "dbg/#", "-q", "2", "-C", "2", "-d", "-W", "10"]
    t, errors = publish_when_subscribed(broker, "tdbg", *pubs)
    rc, out, err = tern(capsys, "sub", *conn(broker), *args, "-i", "tdbg")
    t.join(10)
    assert rc == 0 and err == "" and not errors, err
    t, errors = publish_when_subscribed(broker, "mdbg", *pubs)
    mosq = subprocess.run([MOSQ_SUB, *map(str, conn(broker)), *args, "-i", "mdbg"], capture_output=True, timeout=15)
    t.join(10)
    assert mosq.returncode == 0 and mosq.stderr == b"" and not errors
    ours, theirs = out.splitlines(), mosq.stdout.decode().replace("mdbg", "tdbg").splitlines()
    assert "Subscribed (mid: 1): 2" in ours and "Client tdbg sending PUBREC (m2, rc0)" in ours
    # the same lines: what is sent in the same order, what is received in the same order (how the
    # two interleave depends on how the bytes arrive: tern traces a read as it comes in)
    for word in (" sending ", " received "):
        assert [x for x in ours if word in x] == [x for x in theirs if word in x]
    assert sorted(ours) == sorted(theirs)
    # a message is printed before it is acknowledged (mosquitto_sub prints it after)
    assert ours.index("one") < ours.index("Client tdbg sending PUBACK (m1, rc0)")
    assert ours.index("two") < ours.index("Client tdbg sending PUBREC (m2, rc0)")


# ------------------------------------------------------------------- sub


def test_sub_prints_count_messages_verbosely(capsys, broker):
    t, errors = publish_when_subscribed(
        broker, "ts1",
        ["-t", "s/a", "-m", "first", "-q", "1"],
        ["-t", "s/b", "-m", "second", "-q", "2"],
        ["-t", "other", "-n"],
        ["-t", "s/c", "-m", "not printed"])
    rc, out, err = tern(capsys, "sub", *conn(broker), "-i", "ts1", "-t", "s/+", "-t", "other",
                        "-q", 2, "-C", 3, "-v", "-W", 10)
    t.join(10)
    assert not errors
    assert rc == 0, err
    assert out == "s/a first\ns/b second\nother (null)\n"


def test_sub_format_output(capsys, broker):
    mosq_pub(broker, "-V", "5", "-t", "f/1", "-m", "hé", "-r", "-q", "1",
             "-D", "publish", "user-property", "a", "b", "-D", "publish", "content-type", "text/x")
    rc, out, err = tern(capsys, "sub", *conn(broker), "-V", "5", "-q", 1, "-t", "f/#", "-C", 1,
                        "-F", r"%t|%p|%q|%r|%l|%m|%x|%X|%P|%C|%05l|%-5t|%5t|%.1t|%%|\t|%I|%U|%j")
    assert rc == 0, err
    fields = out.rstrip("\n").split("|")
    assert fields[:16] == ["f/1", "hé", "1", "1", "3", "1", "68c3a9", "68C3A9", "a:b", "text/x",
                           "00003", "f/1  ", "  f/1", "f", "%", "\t"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}", fields[16])
    assert abs(float(fields[17]) - time.time()) < 30
    j = json.loads(fields[18])
    assert (j["topic"], j["qos"], j["retain"], j["payload"], j["payloadlen"]) == ("f/1", 1, 1, "hé", 3)
    assert j["properties"] == {"user-properties": {"a": "b"}, "content-type": "text/x"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z[+-]\d{4}", j["tst"]), j["tst"]  # as mosquitto_sub 2.0
    # -N: no newline
    rc, out, _ = tern(capsys, "sub", *conn(broker), "-t", "f/1", "-C", 1, "-N", "-F", "<%p>")
    assert rc == 0 and out == "<hé>"


def test_sub_retained_handling(capsys, broker):
    mosq_pub(broker, "-t", "ret/a", "-m", "stale", "-r")
    # -R skips the retained message; the live one is printed
    t, errors = publish_when_subscribed(broker, "tr1", ["-t", "ret/a", "-m", "live"])
    rc, out, err = tern(capsys, "sub", *conn(broker), "-i", "tr1", "-t", "ret/#", "-R", "-C", 1, "-W", 10)
    t.join(10)
    assert rc == 0 and out == "live\n" and not errors, err
    # --retained-only prints the retained one and exits at the first live message
    t, errors = publish_when_subscribed(broker, "tr2", ["-t", "ret/a", "-m", "live again"])
    rc, out, err = tern(capsys, "sub", *conn(broker), "-i", "tr2", "-t", "ret/#", "--retained-only",
                        "-v", "-W", 10)
    t.join(10)
    assert rc == 0 and out == "ret/a stale\n" and not errors, err


def test_sub_timeout_and_exit_when_subscribed(capsys, broker):
    start = time.monotonic()
    rc, out, err = tern(capsys, "sub", *conn(broker), "-t", "quiet", "-W", 0.5)
    took = time.monotonic() - start
    assert rc == 27 and out == "" and "timed out" in one_line(err)
    assert 0.4 < took < 3
    rc, out, err = tern(capsys, "sub", *conn(broker), "-t", "quiet", "-E", "-i", "te")
    assert rc == 0 and out == "" and err == ""
    assert "Sending SUBACK to te" in log_text(broker)


@pytest.mark.parametrize("expiry_args,queued", [
    (["-D", "connect", "session-expiry-interval", "60"], True),
    (["-x", "0"], False),
])
def test_sub_persistent_session(capsys, broker, expiry_args, queued):
    rc, _, err = tern(capsys, "sub", *conn(broker), "-V", "5", "-c", "-i", "keeper", "-q", 1,
                      "-t", "persist", "-E", *expiry_args)
    assert rc == 0, err
    mosq_pub(broker, "-t", "persist", "-m", "while away", "-q", "1")
    rc, out, err = tern(capsys, "sub", *conn(broker), "-V", "5", "-c", "-i", "keeper", "-q", 1,
                        "-t", "persist", "-C", 1, "-W", 1.5, *expiry_args)
    if queued:
        assert (rc, out) == (0, "while away\n"), err
    else:
        assert (rc, out) == (27, ""), err


def test_session_expiry_is_ignored_under_mqtt_3_as_mosquitto_does(capsys, broker):
    # mosquitto_sub -x 10 on 3.1.1 connects and waits: -x is an MQTT 5 setting
    r = subprocess.run([MOSQ_SUB, *map(str, conn(broker)), "-t", "quiet", "-x", "10", "-W", "1"],
                       capture_output=True, timeout=10)
    rc, out, err = tern(capsys, "sub", *conn(broker), "-t", "quiet", "-x", 10, "-W", 1)
    assert (rc, out) == (r.returncode, "") == (27, ""), err


def test_shared_subscription_splits_between_two_tern_processes(broker, tmp_path):
    procs = []
    for name in ("shareA", "shareB"):
        f = open(tmp_path / name, "wb")
        procs.append((subprocess.Popen(
            [TERN, "sub", *map(str, conn(broker)), "-t", "$share/g/job/#", "-q", "1", "-i", name, "-v",
             "-W", "20"], stdout=f, stderr=subprocess.PIPE,
            # Ctrl-C as at a terminal: a suite started in the background (`make test &`) runs with SIGINT
            # ignored, which its children inherit, and Python then installs no KeyboardInterrupt handler
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)), f, tmp_path / name))
    try:
        wait_log(broker, "Sending SUBACK to shareA")
        wait_log(broker, "Sending SUBACK to shareB")
        n = 20
        subprocess.run([MOSQ_PUB, *map(str, conn(broker)), "-t", "job/x", "-l", "-q", "1"],
                       input=b"".join(b"m%d\n" % i for i in range(n)), check=True, timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if sum(len(path.read_bytes().splitlines()) for _, _, path in procs) >= n:
                break
            time.sleep(0.05)
        time.sleep(0.2)  # nothing more may arrive
    finally:
        for p, f, _ in procs:
            p.send_signal(signal.SIGINT)
        for p, f, _ in procs:
            assert p.wait(timeout=10) == 0, p.stderr.read().decode()
            f.close()
    a, b = (set(path.read_text().splitlines()) for _, _, path in procs)
    assert a and b, "both members of the share group get messages"
    assert not a & b, "each message goes to one member only"
    assert a | b == {"job/x m%d" % i for i in range(n)}
    assert sum(len(path.read_text().splitlines()) for _, _, path in procs) == n


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("argv,needle,mosquitto_agrees", [
    (["pub", "-t", "x", "-m", "a", "-q", "3"], "QoS must be 0, 1 or 2", True),
    (["pub", "-t", "x", "-m", "a", "-p", "70000"], "port must be 1..65535", True),
    (["pub", "-t", "x", "-m", "a", "-V", "4"], "protocol version must be 31, 311 or 5", True),
    (["pub", "-t", "x", "-m", "a", "-V", "5", "-D", "publish", "no-such-prop", "1"], "unknown property", True),
    # mosquitto sends these (and switches to MQTT 5 for -D): tern refuses them on purpose
    (["pub", "-t", "x", "-m", "a", "-V", "5", "-D", "publish", "payload-format-indicator", "2"], "0 or 1", False),
    (["pub", "-t", "x", "-m", "a", "-D", "publish", "content-type", "t"], "needs MQTT 5", False),
    (["pub", "-m", "a"], "-t/--topic", True),
    (["pub", "-t", "x", "-m", "a", "-f", "/etc/hostname"], "not allowed with", True),
    (["pub", "-t", "x"], "one of the arguments", True),
    (["pub", "-t", "a/#", "-m", "a"], "wildcard", True),
    (["pub", "-t", "x", "-m", "a", "-c"], "-c needs a client id", True),
    (["pub", "-t", "x", "-m", "a", "stray"], "unrecognized arguments: stray", True),
    (["pub", "-L", "http://h/t", "-m", "a"], "-L: unsupported URL scheme 'http'", True),
    (["pub", "-L", "mqtt://host", "-m", "a"], "-L: the URL has no topic", True),
    (["sub", "-t", "x", "-q", "3"], "QoS must be 0, 1 or 2", True),
    (["sub", "-q", "1"], "-t/--topic", True),
    (["sub", "-t", "x", "-F", "%Z"], "'%Z'", True),
    (["sub", "-t", "a/#/b"], "'#'", True),
    (["sub", "-t", "x", "-V", "5", "-D", "publish", "content-type", "x"], "unknown command", False),
    (["sub", "-t", "x", "--bogus"], "unrecognized arguments: --bogus", True),
    (["pub", "-t", "x", "-m", "a", "-k", "4"], "--keepalive must be 5..65535", True),
    (["sub", "-t", "x", "-k", "0"], "--keepalive must be 5..65535", True),
    # tern's own
    (["pub", "-t", "x", "-m", "a", "--outbox", "ob"], "--outbox needs -c and a client id (-i)", None),
    (["pub", "-t", "x", "-m", "a", "--outbox", "ob", "-c", "-I", "p"], "--outbox needs -c and a client id", None),
    (["sub", "-t", "x", "--outbox", "ob", "-i", "me"], "--outbox needs -c and a client id (-i)", None),
])
def test_usage_errors_are_one_line_and_status_1_as_mosquitto(capsys, argv, needle, mosquitto_agrees):
    rc, out, err = tern(capsys, *argv)
    assert rc == 1 and out == ""
    assert needle in one_line(err)
    assert one_line(err).startswith(("tern %s: " % argv[0], "tern: "))
    if mosquitto_agrees is not None:  # the same arguments to mosquitto_pub/sub, with a port nothing listens on
        r = subprocess.run([MOSQ_PUB if argv[0] == "pub" else MOSQ_SUB, "-h", "127.0.0.1", "-p", str(free_port()),
                            *argv[1:]], capture_output=True, timeout=10)
        assert r.returncode == 1
        assert (b"Connection refused" not in r.stderr) == mosquitto_agrees, r.stderr


def test_connection_refused_is_one_line(capsys):
    port = free_port()  # nothing listens there
    for cmd in (["pub", "-m", "x"], ["sub"]):
        rc, out, err = tern(capsys, *cmd, "-h", "127.0.0.1", "-p", port, "-t", "x")
        assert rc == 1 and out == ""
        assert one_line(err) == "tern %s: cannot connect to 127.0.0.1:%d: connection refused" % (cmd[0], port)


@pytest.fixture
def locked_broker(tmp_path):
    b = Broker(tmp_path / "locked", users={"alice": "correct-horse"}).start()
    yield b
    b.stop()


@pytest.mark.parametrize("version,reason,status", [("311", "not authorized", 5), ("5", "not authorized", 135)])
def test_refused_credentials_are_one_line_and_never_shown(capsys, locked_broker, version, reason, status):
    secret = "Wr0ng-Pa55word"
    for cmd in (["pub", "-m", "x"], ["sub"]):
        rc, out, err = tern(capsys, *cmd, *conn(locked_broker), "-t", "x", "-V", version, "-d",
                            "-u", "alice", "-P", secret)
        # the CONNACK's code, as mosquitto_pub / mosquitto_sub exit; unreachable is 1
        mosq = subprocess.run([MOSQ_PUB if cmd[0] == "pub" else MOSQ_SUB, *map(str, conn(locked_broker)),
                               "-t", "x", "-V", version, "-u", "alice", "-P", secret, *cmd[1:]],
                              capture_output=True, timeout=10)
        assert rc == mosq.returncode == status
        line = err.splitlines()[-1]
        assert line.startswith("tern %s: connection to " % cmd[0]) and "refused by the broker" in line
        assert reason in line or "bad user name or password" in line
        assert secret not in out + err and "correct-horse" not in out + err
    # the right password works, so the refusal above was about the password
    rc, _, err = tern(capsys, "pub", *conn(locked_broker), "-t", "x", "-m", "y", "-V", version,
                      "-u", "alice", "-P", "correct-horse")
    assert rc == 0, err


def test_refusal_as_a_real_process_and_password_in_argparse_errors(locked_broker):
    secret = "-dash-secret-value"
    r = subprocess.run([TERN, "pub", *map(str, conn(locked_broker)), "-t", "x", "-m", "y",
                        "-u", "alice", "-P", secret], capture_output=True, timeout=20)
    assert r.returncode == 5 and r.stdout == b""
    assert b"refused by the broker" in r.stderr and len(r.stderr.splitlines()) == 1
    assert secret.encode() not in r.stderr
    # even an argument error that echoes the command line does not show it
    r = subprocess.run([TERN, "pub", "-t", "x", "-m", "y", "-u", "alice", "-P", secret, "stray"],
                       capture_output=True, timeout=20)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1
    assert b"stray" in r.stderr and b"secret-value" not in r.stderr
    # ... nor a piece of it (argparse would quote 'ash-secret-value' as -d's argument)
    r = subprocess.run([TERN, "pub", "-t", "x", "-m", "y", "-u", "alice", "-P", secret, secret],
                       capture_output=True, timeout=20)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1
    assert b"secret" not in r.stderr


def test_a_short_password_is_masked_only_where_it_is_a_whole_value():
    """`-P p` turned `tern pub` into `tern ***ub` and `--help` into `--hel***`: each substring equal to
    the password was masked. Now only a whole word or value is (here `--password=e`, an unknown option)."""
    r = subprocess.run([TERN, "pub", "-t", "x", "-m", "y", "-P", "p", "-q", "7"], capture_output=True, timeout=20)
    assert r.returncode == 1  # a bad argument, as mosquitto_pub 2.0
    assert r.stderr == b"tern pub: argument -q/--qos: QoS must be 0, 1 or 2, not '7' (see tern pub --help)\n", r.stderr
    r = subprocess.run([TERN, "pub", "-t", "x", "-m", "y", "-P", "e", "--password=e", "stray"],
                       capture_output=True, timeout=20)
    assert r.returncode == 1
    assert r.stderr == b"tern: unrecognized arguments: --password=*** stray (see tern --help)\n", r.stderr


def test_publish_the_broker_refuses(capsys, tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite open/#\n")
    b = Broker(tmp_path / "acl-broker", extra=["acl_file %s" % acl]).start()
    try:
        rc, _, err = tern(capsys, "pub", *conn(b), "-V", "5", "-q", 1, "-t", "closed", "-m", "x")
        assert rc == 1 and one_line(err) == \
            "tern pub: the broker refused 1 message(s): not authorized (reason 0x87)"
        rc, _, err = tern(capsys, "pub", *conn(b), "-V", "5", "-q", 1, "-t", "open/x", "-m", "x")
        assert rc == 0, err
    finally:
        b.stop()


def test_tls_verifies_the_broker(capsys, tmp_path):
    from ternlab.brokers import certs
    from ternlab.brokers.mosquitto import Listener

    # a second TLS listener whose certificate names another host, to check host name checking
    ca2 = certs.make_ca(tmp_path / "ca2", "Elsewhere CA")
    elsewhere = certs.make_cert(ca2, tmp_path / "ca2", "elsewhere", hosts=("elsewhere.example",))
    b = Broker(tmp_path / "tls", tls=True, listeners=[Listener(options=[
        "cafile %s" % ca2.cert_path, "certfile %s" % elsewhere.cert_path,
        "keyfile %s" % elsewhere.key_path])]).start()
    try:
        tls = ["-h", b.host, "-p", b.tls_port]
        peer = MosqSub(b, "-t", "secure", count=2)
        rc, _, err = tern(capsys, "pub", *tls, "--cafile", b.ca_path, "-t", "secure", "-m", "over tls", "-q", 1)
        assert rc == 0, err
        # a CA that did not sign the broker's certificate: refused, one line
        rc, _, err = tern(capsys, "pub", *tls, "--cafile", ca2.cert_path, "-t", "secure", "-m", "no")
        assert rc == 1 and "failed verification" in one_line(err)
        # signed by the CA given, but for another host name: refused unless --insecure
        other = ["-h", b.host, "-p", b.listeners[0].port, "--cafile", ca2.cert_path]
        rc, _, err = tern(capsys, "pub", *other, "-t", "secure", "-m", "no")
        assert rc == 1 and "failed verification" in one_line(err)
        rc, _, err = tern(capsys, "pub", *other, "--insecure", "-t", "secure", "-m", "insecure ok")
        assert rc == 0, err
        assert peer.result() == b"over tls\ninsecure ok\n"
        # TLS flags without TLS are a usage error
        rc, _, err = tern(capsys, "pub", "--insecure", "-t", "x", "-m", "y")
        assert rc == 1 and "--insecure needs TLS" in one_line(err)
    finally:
        b.stop()


def test_arguments_that_are_not_utf8_or_too_long(capsys, broker):
    # Python hands argv bytes that are not UTF-8 over as surrogates: -m, --will-payload, -P and
    # -F text go out as the shell's bytes (as mosquitto does); -u and -i must be MQTT strings.
    peer = MosqSub(broker, "-t", "raw", "-F", "%x", count=1)
    rc, _, err = tern(capsys, "pub", *conn(broker), "-t", "raw", "-m", "a\udcffb", "-u", "u",
                      "-P", "p\udcfe", "--will-topic", "w", "--will-payload", "\udcff")
    assert rc == 0, err
    assert peer.result() == b"61ff62\n"
    r = subprocess.run([TERN, "sub", *map(str, conn(broker)), "-t", "raw", "-E", "-F", b"\xff%p"],
                       capture_output=True, timeout=20)
    assert r.returncode == 0 and r.stderr == b""
    long = "a" * 70000
    for args, needle in ((["-u", "\udcff"], "-u is not valid UTF-8"),
                         (["-i", "\udcff"], "-i is not valid UTF-8"),
                         (["-I", "\udcff"], "-I is not valid UTF-8"),
                         (["-u", long], "-u is longer than 65535 bytes (70000)"),
                         (["-i", long], "-i is longer than 65535 bytes (70000)"),
                         (["-u", "u", "-P", long], "-P is longer than 65535 bytes (70000)"),
                         (["--will-topic", "w", "--will-payload", long],
                          "--will-payload is longer than 65535 bytes (70000)")):
        rc, out, err = tern(capsys, "pub", *conn(broker), "-t", "raw", "-m", "x", *args)
        assert rc == 1 and out == "" and one_line(err) == "tern pub: " + needle


def test_sub_stops_on_sigterm_like_mosquitto_sub(broker):
    # kill / systemd / timeout send SIGTERM: a clean DISCONNECT (no will) and status 0
    peer = MosqSub(broker, "-t", "term/#", "-v", client_id="tpeer", count=1)
    for prog, cid in ((MOSQ_SUB, "mterm"), (TERN, "tterm")):
        p = subprocess.Popen([prog, "sub"][: 1 if prog == MOSQ_SUB else 2] +
                             [*map(str, conn(broker)), "-t", "x", "-i", cid,
                              "--will-topic", "term/" + cid, "--will-payload", "gone"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_log(broker, "Sending SUBACK to " + cid)
        p.terminate()
        assert p.wait(timeout=10) == 0, p.stderr.read().decode()
        wait_log(broker, "Received DISCONNECT from " + cid)
    mosq_pub(broker, "-t", "term/marker", "-m", "alive")
    assert peer.result() == b"term/marker alive\n"  # no will came before it


def test_sub_message_over_the_receive_limit_is_one_line(capsys, broker, monkeypatch):
    from ternlab.mqttcli import connect as mqtt_conn

    # The broker resends a retained (or queued) message after every reconnect: tern sub
    # reconnected for ever, printing nothing. MQTT 3.1.1 cannot announce the limit: the message is
    # dropped (and acknowledged), said in one line, and tern sub goes on; MQTT 5 announces it and a
    # broker that breaks it ends the run. The limit is lowered so the test stays small.
    monkeypatch.setattr(mqtt_conn, "RX_SIZE", 64 * 1024)
    mosq_pub(broker, "-t", "big", "-m", "b" * 100000, "-r")
    start = time.monotonic()
    rc, out, err = tern(capsys, "sub", *conn(broker), "-t", "big", "-W", 1)
    assert rc == 27 and out == "" and time.monotonic() - start < 3, (rc, err)
    assert err.splitlines() == ["tern sub: a message over the receive limit of 65536 bytes was dropped (1 so far)",
                                "tern sub: timed out after 1 s"], err


# ---------------------------------------------------------------- outbox


def start_until(argv, ready, timeout=10):
    """Start `tern argv...` (stdout piped) and return it once `ready()` holds, or once a stdout line
    equal to the string `ready` has been read; the lines read so far are in p.lines."""
    p = subprocess.Popen([TERN, *map(str, argv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.lines, p.rest = [], b""
    deadline = time.monotonic() + timeout
    while not (ready() if callable(ready) else ready in p.lines):
        left = deadline - time.monotonic()
        if left <= 0 or p.poll() is not None:
            p.kill()
            raise AssertionError("tern %s never got ready: %r %r" % (argv[0], p.lines, p.stderr.read()))
        if select.select([p.stdout], [], [], min(left, 0.05))[0]:  # the pipe itself: no buffered reader
            *whole, p.rest = (p.rest + os.read(p.stdout.fileno(), 65536)).split(b"\n")
            p.lines += [line.decode() for line in whole]
    return p


def kill_9(p):
    p.kill()  # SIGKILL: no handler, no DISCONNECT, nothing flushed but what was written
    p.wait(timeout=10)
    # what it wrote before it died
    p.lines = getattr(p, "lines", []) + (getattr(p, "rest", b"") + p.stdout.read()).decode().splitlines()
    for f in (p.stdin, p.stdout, p.stderr):
        if f is not None:
            f.close()


@pytest.mark.parametrize("qos,held,forward,last,resend", [
    # QoS 1: the PUBACK is held back; the resend is the PUBLISH with DUP and the same id
    (1, "PUBACK", False, "sending PUBLISH (d0, q1, r0, m1, 'ob', ... (3 bytes))",
     "sending PUBLISH (d1, q1, r0, m1, 'ob', ... (3 bytes))"),
    # QoS 2 before PUBREC: the PUBLISH again, DUP and same id; the broker delivers it once
    (2, "PUBREC", False, "sending PUBLISH (d0, q2, r0, m1, 'ob', ... (3 bytes))",
     "sending PUBLISH (d1, q2, r0, m1, 'ob', ... (3 bytes))"),
    # QoS 2 past PUBREC: the PUBREC reaches tern pub, its PUBREL is held back: PUBREL again
    (2, "PUBREC", True, "sending PUBREL (m1)", "sending PUBREL (m1)"),
])
def test_pub_outbox_resends_after_kill_9_before_new_messages(capsys, broker, chaos, tmp_path, qos, held,
                                                             forward, last, resend):
    outbox = tmp_path / "outbox"
    peer = MosqSub(broker, "-t", "ob", "-q", "2", count=3 if qos == 1 else 2, timeout=20)
    chaos.stall_at_packet(held, 1, B2C, 60, forward=forward, connections=1)
    args = ["-q", qos, "-t", "ob", "-c", "-i", "obk", "--outbox", outbox, "-d"]
    p = start_until(["pub", "-h", chaos.host, "-p", chaos.port, "-m", "one", *args], "Client obk " + last)
    kill_9(p)
    assert not any(("received " + held) in line for line in p.lines if not forward), p.lines
    # the next run with the same client id: what was pending goes first, as it was, then the new message
    rc, out, err = tern(capsys, "pub", *conn(broker), "-m", "two", *args)
    assert rc == 0 and err == "", err
    sent = [line.split(" ", 2)[2] for line in out.splitlines() if " sending " in line]
    assert sent[:3] == ["sending CONNECT", resend, "sending PUBLISH (d0, q%d, r0, m2, 'ob', ... (3 bytes))" % qos]
    # the broker saw the same: DUP and the same packet id (or the PUBREL) before the new message
    log = log_text(broker)
    new = log.index("Received PUBLISH from obk (d0, q%d, r0, m2, 'ob', ... (3 bytes))" % qos)
    again = ("Received PUBREL from obk (Mid: 1)" if forward else
             "Received PUBLISH from obk (d1, q%d, r0, m1, 'ob', ... (3 bytes))" % qos)
    assert -1 < log.rfind(again, 0, new)
    # nothing lost; QoS 2 delivered once, QoS 1 at least once (the resend is a second delivery)
    assert peer.result() == (b"one\none\ntwo\n" if qos == 1 else b"one\ntwo\n")


def test_pub_outbox_with_more_pending_than_the_window_resends_all_in_order(capsys, broker, chaos, tmp_path):
    # 40 lines at QoS 1, no PUBACK comes back: 16 go out (the in-flight window, -M 16), 24 wait in the
    # outbox; kill -9; the next run sends all 40 again in their order, then its own message
    from tern.filestore import FileStore

    outbox = tmp_path / "outbox"
    n = 40
    peer = MosqSub(broker, "-t", "many", "-q", "1", count=16 + n + 1, timeout=20)
    chaos.stall_at_packet("PUBACK", 1, B2C, 60, stall_direction=B2C, connections=1)
    args = ["-q", 1, "-M", 16, "-t", "many", "-c", "-i", "manyk", "--outbox", outbox]
    p = subprocess.Popen([TERN, "pub", *map(str, ["-h", chaos.host, "-p", chaos.port, "-l", *args])],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdin.write(b"".join(b"m%d\n" % i for i in range(n)))
    p.stdin.flush()
    assert chaos.wait_for(lambda: len(chaos.packets(C2B, "PUBLISH")) == 16, 10)
    # the rest is read and stored while the window is full: wait until stdin is drained and the
    # outbox's files stop growing (the store's own count, read after the kill, is what is checked)
    deadline, last, still = time.monotonic() + 10, None, 0
    while still < 5 and time.monotonic() < deadline:
        time.sleep(0.1)
        size = sum(f.stat().st_size for f in outbox.glob("*.seg"))
        queued = struct.unpack("i", fcntl.ioctl(p.stdin, termios.FIONREAD, b"\0\0\0\0"))[0]
        still = still + 1 if size == last and not queued else 0
        last = size
    kill_9(p)
    store = FileStore(str(outbox), verbose=False).open()
    assert store.count() == n
    store.close()
    rc, out, err = tern(capsys, "pub", *conn(broker), "-m", "last", *args, "-d")
    assert rc == 0 and err == "", err
    sent = [line.split(" (")[1].split(",")[:4] for line in out.splitlines() if " sending PUBLISH" in line]
    assert sent == [["d1", " q1", " r0", " m%d" % (i + 1)] for i in range(n)] + [["d0", " q1", " r0", " m%d" % (n + 1)]]
    got = peer.result().decode().split()
    # the 16 sent before the kill, then everything again in order, then the new one
    assert got == ["m%d" % i for i in range(16)] + ["m%d" % i for i in range(n)] + ["last"]


def test_pub_outbox_reports_a_damaged_record_and_exits_1(capsys, broker, chaos, tmp_path):
    # was: exit 0, stderr empty, 2 of 3 accepted messages sent (the CLI opened the FileStore with
    # verbose=False, which hid "fails its CRC: skipped")
    from tern.filestore import FileStore

    outbox = tmp_path / "outbox"
    peer = MosqSub(broker, "-t", "dmg", "-q", "1", count=6, timeout=20)
    chaos.stall_at_packet("PUBACK", 1, B2C, 60, stall_direction=B2C, connections=1)
    args = ["-q", 1, "-t", "dmg", "-c", "-i", "dmgk", "--outbox", outbox]
    p = subprocess.Popen([TERN, "pub", *map(str, ["-h", chaos.host, "-p", chaos.port, "-l", *args])],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdin.write(b"first-message\nsecond-message\nthird-message\n")
    p.stdin.flush()
    assert chaos.wait_for(lambda: len(chaos.packets(C2B, "PUBLISH")) == 3, 10)
    kill_9(p)
    store = FileStore(str(outbox), verbose=False).open()
    assert store.count() == 3
    store.close()
    seg = next(f for f in sorted(outbox.glob("*.seg")) if b"second-message" in f.read_bytes())
    data = bytearray(seg.read_bytes())
    data[data.index(b"second-message") + 3] ^= 0x01  # one flipped bit in the stored message
    seg.write_bytes(bytes(data))
    rc, out, err = tern(capsys, "pub", *conn(broker), "-m", "last", *args)
    assert rc == 1, err
    assert one_line(err).startswith("tern pub: --outbox %s: %s: record at " % (outbox, seg)), err
    assert "fails its CRC: skipped; what it held (a message accepted on an earlier run" in err
    # the first run's three, then what the store still had (resent), and the new message
    assert peer.result().split() == [b"first-message", b"second-message", b"third-message", b"first-message",
                                     b"third-message", b"last"]


def test_outbox_belongs_to_one_process_and_one_client(capsys, broker, chaos, tmp_path):
    outbox = tmp_path / "outbox"
    # a message left pending by a killed run of client "owner"
    chaos.stall_at_packet("PUBACK", 1, B2C, 60, connections=1)
    mine = ["-c", "-i", "owner", "--outbox", outbox]
    p = start_until(["pub", "-h", chaos.host, "-p", chaos.port, "-q", 1, "-t", "o", "-m", "kept", "-d", *mine],
                    "Client owner sending PUBLISH (d0, q1, r0, m1, 'o', ... (4 bytes))")
    kill_9(p)
    # another client id (or protocol version) would send it under the wrong session: refused, kept
    for other in (["-c", "-i", "intruder", "--outbox", outbox], [*mine, "-V", "5"]):
        rc, out, err = tern(capsys, "pub", *conn(broker), "-q", 1, "-t", "o", "-m", "new", *other)
        assert rc == 1 and out == ""
        assert one_line(err) == ("tern pub: --outbox %s holds 1 message(s) of client id 'owner' (MQTT 3.1.1): "
                                 "run with -i owner -V 311 to send them, or use another directory" % outbox)
    # while one tern process has the outbox, another one cannot open it
    holder = subprocess.Popen([TERN, "sub", *map(str, [*conn(broker), "-t", "o", "-q", 1, *mine])],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_log(broker, "Sending SUBACK to owner")
        rc, _, err = tern(capsys, "pub", *conn(broker), "-q", 1, "-t", "o", "-m", "new", *mine)
        assert rc == 1 and one_line(err) == "tern pub: --outbox %s is in use by another tern process" % outbox
    finally:
        holder.terminate()
        assert holder.wait(timeout=10) == 0, holder.stderr.read()
    holder.stdout.close()
    holder.stderr.close()
    # (the subscriber holds the same session: it sent the pending message on, as it was)
    assert "Received PUBLISH from owner (d1, q1, r0, m1, 'o', ... (4 bytes))" in log_text(broker)
    # the outbox is free again, and for another client once empty
    rc, _, err = tern(capsys, "pub", *conn(broker), "-q", 1, "-t", "o", "-m", "new", *mine)
    assert rc == 0, err
    rc, _, err = tern(capsys, "pub", *conn(broker), "-q", 1, "-t", "o", "-m", "new", "-c", "-i", "next",
                      "--outbox", outbox)
    assert rc == 0, err


@pytest.mark.parametrize("outbox", [True, False])
def test_sub_outbox_prints_a_qos2_message_once_across_kill_9(capsys, broker, chaos, tmp_path, outbox):
    # tern sub prints the message and sends PUBREC, which the proxy holds back: the broker sends
    # the message again (DUP) to the next run. With --outbox the next run knows it and does not
    # print it again; without, the persistent session alone prints it twice.
    args = ["-q", 2, "-t", "in", "-c", "-i", "obsub"] + (["--outbox", tmp_path / "ob"] if outbox else [])
    chaos.stall_at_packet("PUBREC", 1, C2B, 60, connections=1)
    t, errors = publish_when_subscribed(broker, "obsub", ["-t", "in", "-m", "first", "-q", "2"])
    p = start_until(["sub", "-h", chaos.host, "-p", chaos.port, *args],
                    lambda: any(e.kind == "stall_rule" for e in chaos.events))
    kill_9(p)
    t.join(10)
    assert not errors and p.lines == ["first"]
    t, errors = publish_when_subscribed(broker, "obsub", ["-t", "in", "-m", "second", "-q", "2"], subacks=2)
    rc, out, err = tern(capsys, "sub", *conn(broker), *args, "-C", 1, "-W", 10)
    t.join(10)
    assert rc == 0 and not errors, err
    assert out == ("second\n" if outbox else "first\n")
    assert "Sending PUBLISH to obsub (d1, q2, r0, m1, 'in', ... (5 bytes))" in log_text(broker)


# ------------------------------------------------------ protocol violations


def _violation_script(tool, version, bad):
    from tern.wire import CONNECT, PUBLISH, SUBSCRIBE

    v5 = version == "5"
    steps = [("recv_type", CONNECT), ("send", bytes([0x20, 3, 0, 0, 0]) if v5 else bytes([0x20, 2, 0, 0]))]
    if tool == "pub":
        steps += [("recv_type", PUBLISH)]
    else:
        steps += [("recv_type", SUBSCRIBE), ("send", bytes([0x90, 4, 0, 1, 0, 0]) if v5 else bytes([0x90, 3, 0, 1, 0]))]
    steps += [("send", bad)]
    # MQTT 5: DISCONNECT with the reason code, then nothing (no reconnect: this is the only connection)
    steps += [("recv", bytes([0xE0, 1, 0x81]))] if v5 else []
    return [steps + [("quiet", 2)]]


@pytest.mark.parametrize("version", ["311", "5"])
@pytest.mark.parametrize("tool", ["pub", "sub"])
def test_broker_that_breaks_the_protocol_ends_the_run_with_status_2(capsys, tool, version):
    # a PUBLISH whose topic runs past its end: malformed (0x81). tern sub used to reconnect for
    # ever; both commands now stop as mosquitto_pub/sub 2.0 do (status 2, MOSQ_ERR_PROTOCOL), and
    # under MQTT 5 tell the broker why first (DISCONNECT 0x81), which mosquitto does not.
    from ternlab.brokers.scripted import ScriptedBroker

    bad = bytes([0x30, 4, 0, 5, 0x61, 0]) if version == "5" else bytes([0x30, 3, 0, 5, 0x61])
    cmd = ["-q", 1, "-t", "x", "-V", version] + (["-m", "y"] if tool == "pub" else ["-W", 10])
    b = ScriptedBroker(_violation_script(tool, version, bad), version=int(version[0])).start()
    try:
        start = time.monotonic()
        rc, out, err = tern(capsys, tool, "-h", b.host, "-p", b.port, *cmd)
        took = time.monotonic() - start
    finally:
        b.stop()
    assert not b.errors and b.complete, b.errors
    assert rc == 2 and out == "" and took < 5, (rc, err)
    assert one_line(err) == "tern %s: the broker broke the protocol: malformed packet: truncated (reason 0x81); %s" % (
        tool, "sent DISCONNECT 0x81 and closed the connection" if version == "5" else "closed the connection")
    # mosquitto_pub / mosquitto_sub exit with the same status on the same bytes
    m = ScriptedBroker([_violation_script(tool, version, bad)[0][:-2 if version == "5" else -1]],
                       version=int(version[0])).start()
    try:
        r = subprocess.run([MOSQ_PUB if tool == "pub" else MOSQ_SUB, "-h", m.host, "-p", str(m.port),
                            *map(str, cmd)], capture_output=True, timeout=15)
    finally:
        m.stop()
    assert r.returncode == rc, r.stderr


# ------------------------------------------------------------------- -L URL


def test_url_gives_host_port_credentials_and_topic_as_mosquitto(capsys, locked_broker):
    b = locked_broker
    where = "%s:%d" % (b.host, b.port)
    peer = MosqSub(b, "-t", "url/#", "-v", "-u", "alice", "-P", "correct-horse", count=2)
    rc, out, err = tern(capsys, "pub", "-L", "mqtt://alice:correct-horse@%s/url/pub" % where, "-m", "by url", "-q", 1)
    assert rc == 0 and out == "" and err == "", err
    # -t given as well wins over the URL's topic for pub (tern sub adds both)
    rc, _, err = tern(capsys, "pub", "-L", "MQTT://alice:correct-horse@%s/url/pub" % where, "-t", "url/t", "-m", "t")
    assert rc == 0, err
    assert peer.result() == b"url/pub by url\nurl/t t\n"
    t, errors = publish_when_subscribed(b, "urlsub",
                                        ["-t", "url/sub", "-m", "got", "-u", "alice", "-P", "correct-horse"])
    rc, out, err = tern(capsys, "sub", "-L", "mqtt://alice:correct-horse@%s/url/sub" % where, "-i", "urlsub", "-C", 1,
                        "-W", 10, "-v")
    t.join(10)
    assert (rc, out, err) == (0, "url/sub got\n", "") and not errors
    # a wrong password in the URL: refused with mosquitto's status, and never shown, -d included
    secret = "wr0ng-url-pw"
    url = "mqtt://alice:%s@%s/url/x" % (secret, where)
    for tool, more in (("pub", ["-m", "x"]), ("sub", [])):
        rc, out, err = tern(capsys, tool, "-L", url, "-d", *more)
        mosq = subprocess.run([MOSQ_PUB if tool == "pub" else MOSQ_SUB, "-L", url, *more], capture_output=True,
                              timeout=10)
        assert rc == mosq.returncode == 5
        assert "refused by the broker" in one_line(err) and secret not in out + err
    # nor in an argument error, nor when the URL is wrong after the password
    for bad in (url + " -q 7", "mqtt://alice:%s@%s:99999/x" % (secret, b.host)):
        r = subprocess.run([TERN, "pub", "-m", "x", *("-L " + bad).split()], capture_output=True, timeout=20)
        assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
        assert secret.encode() not in r.stderr


def test_url_mqtts_turns_tls_on_and_verifies(capsys, tmp_path):
    b = Broker(tmp_path / "tls", tls=True).start()
    try:
        url = "mqtts://%s:%d/secure" % (b.host, b.tls_port)
        peer = MosqSub(b, "-t", "secure")
        # mqtts:// verifies with the system's CAs (as mosquitto's -L): the test CA is not one of them
        rc, _, err = tern(capsys, "pub", "-L", url, "-m", "no")
        assert rc == 1 and "failed verification" in one_line(err)
        rc, _, err = tern(capsys, "pub", "-L", url, "--cafile", b.ca_path, "-m", "over tls", "-q", 1)
        assert rc == 0, err
        assert peer.result() == b"over tls\n"
    finally:
        b.stop()


@pytest.mark.parametrize("where", ["suback", "connack after a reconnect"])
def test_sub_stops_at_a_violation_while_subscribing_or_reconnecting(capsys, where):
    # a SUBACK with reserved flags set (tern sub waits in subscribe() then), or a CONNACK whose
    # properties are cut short when tern sub comes back after a dropped connection: status 2, at once
    from tern.wire import CONNECT, SUBSCRIBE
    from ternlab.brokers.scripted import ScriptedBroker

    connack, suback = bytes([0x20, 3, 0, 0, 0]), bytes([0x90, 4, 0, 1, 0, 1])
    if where == "suback":
        script = [[("recv_type", CONNECT), ("send", connack), ("recv_type", SUBSCRIBE),
                   ("send", bytes([0x91, 4, 0, 1, 0, 1])), ("recv", bytes([0xE0, 1, 0x81])), ("quiet", 2)]]
        reason = "malformed packet: reserved flags of packet type 9 (reason 0x81); sent DISCONNECT 0x81"
    else:
        script = [[("recv_type", CONNECT), ("send", connack), ("recv_type", SUBSCRIBE), ("send", suback), ("close",)],
                  [("recv_type", CONNECT), ("send", bytes([0x20, 3, 0, 0, 5])), ("recv", bytes([0xE0, 1, 0x81])),
                   ("quiet", 2)]]
        reason = "sent DISCONNECT 0x81"
    b = ScriptedBroker(script, version=5).start()
    try:
        start = time.monotonic()
        rc, out, err = tern(capsys, "sub", "-h", b.host, "-p", b.port, "-V", 5, "-q", 1, "-t", "x", "-W", 20)
        took = time.monotonic() - start
    finally:
        b.stop()
    assert not b.errors and b.complete, b.errors
    assert rc == 2 and out == "" and took < 5, (rc, err)
    assert one_line(err).startswith("tern sub: the broker broke the protocol: ") and reason in err


# ---------------------------------------------------------------- beside mosquitto_pub/sub 2.0.11 (issue 29)


def test_will_options_without_a_will_topic_are_an_error(capsys, broker):
    # a will without a topic cannot be sent: an error, as mosquitto_pub's for --will-payload and
    # --will-retain; mosquitto_pub ignores --will-qos alone and exits 0 (DIFFERENCES)
    for opt, mosquitto in ((["--will-qos", "1"], 0), (["--will-payload", "gone"], 1), (["--will-retain"], 1)):
        rc, out, err = tern(capsys, "pub", *conn(broker), "-t", "w/x", "-m", "m", *opt)
        assert (rc, out) == (1, "") and "need --will-topic" in one_line(err), (opt, rc, err)
        r = subprocess.run([MOSQ_PUB, *map(str, conn(broker)), "-t", "w/x", "-m", "m", *opt], capture_output=True,
                           timeout=10)
        assert r.returncode == mosquitto and (b"no will topic given" in r.stderr) == bool(mosquitto), (opt, r)


def test_an_empty_topic_is_an_error_before_connecting(capsys, broker):
    # MQTT 4.7.3: a topic name or filter has at least one character. mosquitto_pub prints an error and
    # exits 0; mosquitto_sub sends the empty filter and waits (-W 1: 27)
    rc, out, err = tern(capsys, "pub", *conn(broker), "-t", "", "-m", "m")
    assert (rc, out) == (1, "") and one_line(err) == "tern pub: -t: the topic is empty (a topic name has at least one character)"
    rc, out, err = tern(capsys, "sub", *conn(broker), "-t", "", "-W", "1")
    assert (rc, out) == (1, "") and "-t: topic filter '' is empty" in one_line(err)
    r = subprocess.run([MOSQ_PUB, *map(str, conn(broker)), "-t", "", "-m", "m"], capture_output=True, timeout=10)
    assert r.returncode == 0 and b"Invalid input" in r.stderr, r
    r = subprocess.run([MOSQ_SUB, *map(str, conn(broker)), "-t", "", "-W", "1"], capture_output=True, timeout=10)
    assert r.returncode == 27, r


def test_sub_json_output_gives_a_binary_payload_back(capsys, broker, tmp_path):
    # -F %j wrote a byte that is not UTF-8 as the text \xff (JSON "\\xff"), which the payload's own text
    # "\xff" also gives. Now: the JSON escape \udcff, which surrogateescape turns back into the byte
    payload = b"a\xff\\xff\xc3\xa9\x00\"b"
    src = tmp_path / "payload.bin"
    src.write_bytes(payload)
    t, errors = publish_when_subscribed(broker, "tj", ["-t", "j/1", "-f", src])
    rc, out, err = tern(capsys, "sub", *conn(broker), "-t", "j/1", "-C", 1, "-F", "%j", "-i", "tj")
    t.join(10)
    assert rc == 0 and not errors, (err, errors)
    j = json.loads(out)
    assert j["payloadlen"] == len(payload) and j["payload"].encode("utf-8", "surrogateescape") == payload, out
    assert "\\udcff" in out and "\\\\xff" in out  # the byte and the text each as itself
    peer = MosqSub(broker, "-t", "j/1", "-F", "%j", client_id="mj")
    mosq_pub(broker, "-t", "j/1", "-f", src)
    line = peer.result()
    assert b"\xff" in line  # mosquitto_sub 2.0.11: the raw byte (DIFFERENCES)
    with pytest.raises(UnicodeDecodeError):
        line.decode("utf-8")


def test_sub_subscribes_again_within_a_second_of_a_broker_restart_as_mosquitto_sub(tmp_path):
    # tern sub had not subscribed again 3 s after a restart (it had by 8 s) where mosquitto_sub had: the first
    # try after a lost connection now goes at once, and tern sub retries at most a second apart (as
    # mosquitto_sub). The broker stays down for 4 s, so both have several failed attempts behind them
    b = Broker(tmp_path / "broker").start()
    procs = []
    try:
        procs.append(subprocess.Popen([TERN, "sub", *map(str, conn(b)), "-t", "r/x", "-C", "1", "-i", "tsub"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        procs.append(subprocess.Popen([MOSQ_SUB, *map(str, conn(b)), "-t", "r/x", "-C", "1", "-i", "msub"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        for cid in ("tsub", "msub"):
            wait_log(b, "Sending SUBACK to " + cid)
        b.stop()
        time.sleep(4.0)
        b.start()
        for cid in ("tsub", "msub"):  # the second SUBACK of each: subscribed again, within 2 s of the start
            wait_log(b, "Sending SUBACK to " + cid, count=2, timeout=2.0)
        mosq_pub(b, "-t", "r/x", "-m", "back", "-q", "1")
        for p in procs:
            out, err = p.communicate(timeout=10)
            assert p.returncode == 0 and out == b"back\n", (p.args[0], out, err)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        b.stop()
