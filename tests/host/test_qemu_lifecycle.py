"""Emulators die with their host: `tern board run` killed with SIGKILL, or hung up on (SIGHUP, its
terminal closing), and a pytest run using the board fixture killed with SIGKILL, leave no
qemu-system-* process behind (they used to run on with PPID 1 at most of a core, holding the
board's flash); and a board folder whose flash a live emulator holds is refused, naming its PID."""

import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TERN = str(Path(sys.executable).with_name("tern"))


def _gone(pid):
    """The process has ended (a zombie nobody reaped has ended too)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _emulator(folder, timeout=60):
    """The PID of the emulator the board folder's lock names, once it runs."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            pid = json.loads((folder / ".lock").read_text() or "{}").get("emulator")
        except (OSError, ValueError):
            pid = None
        if pid and not _gone(pid):
            return pid
        time.sleep(0.05)
    raise AssertionError("no emulator started for %s" % folder)


def _qemus_of(folder):
    """Live qemu-system-* processes running in the folder (QEMU's working directory is the board's)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")[0]
            cwd = os.readlink(p / "cwd")
        except OSError:
            continue
        if b"qemu-system-" in cmd and cwd == str(folder) and not _gone(int(p.name)):
            out.append(int(p.name))
    return out


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP], ids=["SIGKILL", "SIGHUP"])
def test_killing_tern_board_run_leaves_no_emulator(tmp_path, sig):
    folder = (tmp_path / "board").resolve()
    master, slave = pty.openpty()  # its terminal, as a user's: SIGHUP is that terminal closing
    p = subprocess.Popen([TERN, "board", "run", "--profile", "qemu-m3-esp32", "--dir", str(folder), "--create"],
                         stdin=slave, stdout=slave, stderr=subprocess.PIPE, start_new_session=True)
    os.close(slave)
    try:
        qemu = _emulator(folder)
        # a second board on the same folder is refused, naming who holds its flash
        r = subprocess.run([TERN, "board", "run", "--dir", str(folder), "--headless"], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 1 and "qemu-system-arm (PID %d)" % qemu in r.stderr, r.stderr
        assert "(PID %d)" % p.pid in r.stderr, r.stderr  # and the tern that started it
        os.kill(p.pid, sig)
        p.wait(30)
        end = time.monotonic() + 10
        while not _gone(qemu) and time.monotonic() < end:
            time.sleep(0.05)
        assert _gone(qemu), "qemu-system-arm (PID %d) outlived tern board run (%s)" % (qemu, sig.name)
        assert not _qemus_of(folder)
        # the folder is free again: the same board runs
        r = subprocess.run([TERN, "repl", "--emulated", str(folder)], input=b"print(6 * 7)\r\n", capture_output=True,
                           timeout=60)
        assert r.returncode == 0 and b"42" in r.stdout, r
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)


def test_killing_a_pytest_run_that_uses_the_board_fixture_leaves_no_emulator(tmp_path):
    (tmp_path / "test_hang.py").write_text(
        "import time\n\n"
        "def test_hangs(board):\n"
        "    print('BOARD', board.workdir, flush=True)\n"
        "    time.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "--board-profile",
                          "qemu-rv32-c3", str(tmp_path / "test_hang.py")], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        folder = None
        for line in p.stdout:
            if line.startswith("BOARD "):
                folder = Path(line.split(None, 1)[1].strip())
                break
        assert folder is not None, "the inner test never started"
        qemu = _emulator(folder)
        p.kill()
        p.wait(30)
        end = time.monotonic() + 10
        while not _gone(qemu) and time.monotonic() < end:
            time.sleep(0.05)
        assert _gone(qemu), "qemu-system-riscv32 (PID %d) outlived pytest (SIGKILL)" % qemu
    finally:
        if p.poll() is None:
            p.kill()
