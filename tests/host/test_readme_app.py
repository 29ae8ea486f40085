"""The README's device app, taken from README.md and run as written (only its `BROKER, PORT = ...` line
pointed at the test's Mosquitto), on the MicroPython unix port with `tern` on MICROPYPATH, on an
emulated board through `tern deploy --app` (issue 16), and on every qemu board (issue 37: both ISAs,
stock and frozen firmware, dialling through the boards' own sockets). Its FileStore outbox keeps what
it published while the broker was away across a kill -9 or a power cut, and the next run sends that
first, in order."""

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tern.client import Client
from ternlab.brokers.mosquitto import Broker
from ternlab.boards.emulated import EmulatedBoard, micropython_path

ROOT = Path(__file__).resolve().parents[2]
TERN = str(Path(sys.executable).with_name("tern"))
BROKER_LINE = 'BROKER, PORT = "127.0.0.1", 1883'


def readme_app(host, port):
    section = (ROOT / "README.md").read_text().split("## A device app", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert code.count(BROKER_LINE) == 1, "the README's app no longer names its broker in one line"
    return code.replace(BROKER_LINE, "BROKER, PORT = %r, %d" % (host, port))


def subscriber(broker, name, clean=True):
    got = []
    c = Client(name, server=broker.host, port=broker.port, reconnect=False, clean=clean)
    c.subscribe("tern/sensor-7/telemetry", qos=1, handler=lambda m: got.append(json.loads(bytes(m.payload))["n"]))
    c.connect()
    return c, got


def until(client, cond, what, timeout=30):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out waiting for " + what
        client.loop(100)


class Device:
    """The app on the unix port, its console collected by a thread."""

    def __init__(self, app, cwd):
        env = {"MICROPYPATH": ".frozen:%s" % (ROOT / "lib"), "PATH": "/usr/bin:/bin"}
        self.proc = subprocess.Popen([micropython_path(), str(app)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    def kill(self):
        self.proc.kill()
        self.proc.wait(10)


def test_the_readme_app_runs_on_the_unix_port_and_its_outbox_survives_a_kill(tmp_path, broker):
    app = tmp_path / "app.py"
    app.write_text(readme_app(broker.host, broker.port))
    sub, got = subscriber(broker, "readme-sub")
    dev = Device(app, tmp_path)
    try:
        until(sub, lambda: len(got) >= 2, "the app's first readings")
        assert got[:2] == [1, 2]
        sub.publish("cmd/sensor-7/led", b"on", qos=1)
        until(sub, lambda: "cmd/sensor-7/led b'on'\n" in dev.lines, "the command handler's line")
        # the broker goes away: the app goes on publishing into its outbox, then loses its power
        broker.stop()
        time.sleep(3.5)
        dev.kill()
        assert "Traceback" not in "".join(dev.lines), dev.lines
        seen = max(got)
        assert any((tmp_path / "outbox").iterdir())
        broker.restart()
        sub2, got2 = subscriber(broker, "readme-sub2")
        dev = Device(app, tmp_path)
        until(sub2, lambda: 1 in got2 and len(got2) > got2.index(1) + 1, "the second run's readings")
        resent = got2[: got2.index(1)]  # before the new run's first reading: the old run's outbox
        assert resent and resent == sorted(resent) and max(resent) > seen, (seen, got2)
        assert set(range(1, max(resent) + 1)) <= set(got) | set(resent)  # nothing published was lost
    finally:
        dev.kill()


def test_the_readme_app_started_with_its_broker_away_delivers_its_readings_in_order(tmp_path):
    # Its connect() raised ECONNREFUSED and the app stopped there, before its first reading (issue 38).
    # Now the FileStore outbox makes connect() return and loop() dial on: readings taken while the broker
    # is away wait on disk and go out first, in order, once it is up (5 s later here).
    broker = Broker(tmp_path / "broker", persistence=True).start()
    sub, got = subscriber(broker, "readme-late", clean=False)  # its session queues what comes while it is away
    sub.disconnect()
    broker.stop()
    app = tmp_path / "app.py"
    app.write_text(readme_app(broker.host, broker.port))
    dev = Device(app, tmp_path)
    try:
        time.sleep(5)
        assert dev.proc.poll() is None, "".join(dev.lines)  # still running, with no broker
        broker.start()
        sub, got = subscriber(broker, "readme-late", clean=False)
        until(sub, lambda: len(got) >= 8, "the readings taken while the broker was away, then more")
        assert got == list(range(1, len(got) + 1)), got  # every reading, in the order taken
        sub.publish("cmd/sensor-7/led", b"on", qos=1)  # its subscription, made offline, went out on the connect
        until(sub, lambda: "cmd/sensor-7/led b'on'\n" in dev.lines, "the command handler's line")
        assert "Traceback" not in "".join(dev.lines), dev.lines
    finally:
        dev.kill()
        broker.stop()


def test_tern_deploy_app_puts_the_readme_app_on_an_emulated_board(tmp_path, broker):
    appdir = tmp_path / "myapp"
    appdir.mkdir()
    (appdir / "main.py").write_text(readme_app(broker.host, broker.port))
    (appdir / "util.py").write_text("X = 1\n")
    r = subprocess.run([TERN, "deploy", "--emulated", tmp_path / "board", "--create", "--app", appdir], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "util.mpy" in r.stdout and "telemetry" not in r.stdout and "codec" not in r.stdout, r.stdout
    sub, got = subscriber(broker, "deploy-sub")
    board = EmulatedBoard("unix-emulated", workdir=tmp_path / "board")  # boots: main.py is the app
    try:
        until(sub, lambda: len(got) >= 2, "the deployed app's readings")
        assert got[:2] == [1, 2]
    finally:
        board.close()
    r = subprocess.run([TERN, "deploy", "--emulated", tmp_path / "b2", "--create", "--app", tmp_path / "none"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "app folder %s does not exist" % (tmp_path / "none") in r.stderr


def _qemu_board_with_the_readme_app(tmp_path, profile, host, port):
    """A qemu board whose main.py is the README's app as printed: a stock board gets Tern in its ROMFS
    partition (as `mpremote romfs deploy` puts it there), the frozen profile has it."""
    from ternlab.boards import firmware
    from ternlab.boards.qemu import QemuBoard

    from qemukit import romfs_with_tern

    board = QemuBoard(profile, workdir=tmp_path / "board")
    try:
        if not firmware.frozen(board.profile):
            board.write_romfs(romfs_with_tern(board.profile["arch"], workdir=tmp_path / "rom"))
        board.write_file("main.py", readme_app(host, port))
        board.power_cycle()  # boots into main.py: the app runs
    except BaseException:
        board.close()
        raise
    return board


@pytest.mark.parametrize("profile", ["qemu-m3-esp32", "qemu-m3-rp2", "qemu-m3-tight", "qemu-rv32-c3"])
def test_the_readme_app_runs_as_printed_on_every_qemu_board(tmp_path, broker, profile):
    # It died on every qemu board with "no module named 'socket'": the boards' sockets now reach the
    # host's loopback, and the app dials its broker as on an ESP32
    from ternlab.boards import firmware

    firmware.build(profile)  # (a build is not waited for by the subscriber: its keepalive would run out)
    sub, got = subscriber(broker, "readme-sub")
    board = _qemu_board_with_the_readme_app(tmp_path, profile, broker.host, broker.port)
    try:
        until(sub, lambda: len(got) >= 2, "the app's first readings")
        assert got[:2] == [1, 2]
        mark = board.log.mark()
        sub.publish("cmd/sensor-7/led", b"on", qos=1)
        board.wait_for(r"^cmd/sensor-7/led b'on'$", since=mark, timeout=30)
        assert "Traceback" not in board.console_text()
    finally:
        board.close()
        sub.disconnect()


def test_the_readme_apps_outbox_on_a_qemu_board_survives_a_power_cut(tmp_path, broker):
    # the broker goes away, the app goes on publishing into its FileStore on the board's LittleFS, the
    # board loses power; at the next power-on the outbox goes first, in order
    sub, got = subscriber(broker, "readme-sub")
    board = _qemu_board_with_the_readme_app(tmp_path, "qemu-rv32-c3", broker.host, broker.port)
    try:
        until(sub, lambda: len(got) >= 2, "the app's first readings")
        broker.stop()
        time.sleep(2.5)
        board.power_off()
        seen = max(got)
        broker.restart()
        sub2, got2 = subscriber(broker, "readme-sub2")
        board.power_on()
        until(sub2, lambda: 1 in got2 and len(got2) > got2.index(1) + 1, "the second boot's readings")
        resent = got2[: got2.index(1)]  # before the new boot's first reading: the old boot's outbox
        assert resent and resent == sorted(resent) and max(resent) > seen, (seen, got2)
        assert set(range(1, max(resent) + 1)) <= set(got) | set(resent)  # nothing published was lost
        sub2.disconnect()
    finally:
        board.close()
