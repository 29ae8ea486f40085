"""Ctrl-C on the emulated board: a KeyboardInterrupt while code runs, a byte at a prompt, never a
dead process.

The unix port has a SIGINT handler only while it runs code; at a prompt a SIGINT kills it. The relay
used to read the handler from /proc and then signal: when the code ended in between (a loaded
machine), the SIGINT killed the process and the host saw "the board lost power" (PowerLost) at a
mere `write_file`. The relay now stops the process while it reads the handler and queues the SIGINT
(ternlab.boards.emulated_pty.Supervisor._interrupt). These tests drive real boards (the unix port on a
pty, through mpremote) and count deaths; the race itself is made deterministic by widening the
relay's window between reading and signalling.
"""

import os
import random
import subprocess
import sys
import time

import pytest

from ternlab.boards import BoardError
from ternlab.boards.emulated import EmulatedBoard

DEATH = r"crashed|power|failed to boot|reset"  # harness events that mean the process ended


@pytest.fixture
def emu(tmp_path):
    b = EmulatedBoard("unix-emulated", workdir=tmp_path / "board", board_id="ctrlc-1")
    yield b
    b.close()


def _deaths(b, since):
    return [t for t in b.log.texts(since, kind="event") if any(w in t for w in DEATH.split("|"))]


def test_ctrl_c_interrupts_running_code_and_the_board_keeps_its_state(emu):
    emu.exec("g = 6")
    pid, m = emu.pid, emu.log.mark()
    emu.exec_nowait("print('spinning')\nwhile True:\n pass")
    emu.wait_for(r"^spinning$", since=m)
    assert emu.exec("print(g * 7)").strip() == "42"  # mpremote's "\r\x03" interrupted the loop
    assert "KeyboardInterrupt:" in emu.log.texts(m)
    assert emu.pid == pid and _deaths(emu, m) == []


def test_ctrl_c_at_an_idle_prompt_is_a_byte_not_a_signal(emu):
    import serial

    emu.exec("g = 5")
    pid, m = emu.pid, emu.log.mark()
    emu.exec_nowait("pass")  # ends at once: the next call's "\r\x03" reaches an idle raw prompt
    time.sleep(0.2)
    assert emu.eval("g") == 5
    emu.disconnect()
    with serial.Serial(emu.port, 115200, timeout=0.2) as s:
        s.write(b"\r\x02")  # friendly REPL
        time.sleep(0.1)
        for _ in range(5):
            s.write(b"\x03")  # at the ">>> " prompt: the REPL just starts a new line
            time.sleep(0.02)
        s.write(b"print(g + 1)\r")
        deadline, seen = time.monotonic() + 5, b""
        while b"6\r\n" not in seen and time.monotonic() < deadline:
            seen += s.read(256)
    assert b"6\r\n" in seen, seen
    assert emu.eval("g") == 5 and emu.pid == pid and _deaths(emu, m) == []


def test_ctrl_c_as_the_code_ends_cannot_kill_the_board(emu):
    """The race, made deterministic: the relay is made to dawdle 0.5 s between reading the SIGINT
    handler and signalling, while the code has 0.2 s left to run. Before the fix the code ended in
    that gap and the SIGINT killed the process (PowerLost); now the process is stopped meanwhile,
    so the SIGINT finds the handler it was read with and becomes a KeyboardInterrupt."""
    sup = emu._sup
    real = sup._running_code

    def dawdling():
        running = real()
        time.sleep(0.5)  # the relay thread descheduled on a loaded machine, stretched
        return running

    emu.exec("g = 3")
    pid, m = emu.pid, emu.log.mark()
    sup._running_code = dawdling
    try:
        emu.exec_nowait("import time\nprint('started')\ntime.sleep_ms(200)\nprint('finished')")
        emu.wait_for(r"^started$", since=m)
        assert emu.eval("g") == 3  # enter_raw_repl's "\r\x03" lands while the code sleeps
    finally:
        sup._running_code = real
    texts = emu.log.texts(m)
    assert any(t.startswith("KeyboardInterrupt") for t in texts) and "finished" not in texts
    assert emu.pid == pid and _deaths(emu, m) == []


def _hogs():
    """One busy loop per core: the load under which the race showed (a CI run, other helpers)."""
    code = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(os.cpu_count() or 2)]


def _stress(b, cycles, seed):
    """Ctrl-C at random moments around the end of code, and right after power-on (write_file's
    enter_raw_repl as the boot shim finishes): every one must leave the board running."""
    rng = random.Random(seed)
    failures = []
    for i in range(cycles):
        try:
            if rng.random() < 0.7:
                ms = rng.choice([0, 1, 2, 3, 5])
                b.exec_nowait("import time\ntime.sleep_ms(%d)" % ms if ms else "x = 1")
                time.sleep(rng.uniform(0, 0.004))
                assert b.exec("print(6 * 7)").strip() == "42"
            else:
                b.power_cycle()
                b.write_file("f.txt", b"x" * rng.randrange(1, 300))
        except (BoardError, AssertionError) as e:
            failures.append((i, "%s: %s" % (e.__class__.__name__, e)))
            if not b.is_on:
                b.power_on()
    return failures


def _run_stress(emu, cycles, seed):
    hogs = _hogs()
    m = emu.log.mark()
    try:
        failures = _stress(emu, cycles, seed)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert failures == [] and [t for t in emu.log.texts(m, kind="event") if "crashed" in t] == []


def test_ctrl_c_under_load_seeded_sample(emu):
    _run_stress(emu, cycles=80, seed=11)


@pytest.mark.slow
def test_ctrl_c_under_load_stress(emu):
    _run_stress(emu, cycles=2000, seed=12)




HELD = """
from micropython import kbd_intr
import time
kbd_intr(-1)  # what emuboard does for a flash operation and for the boot's own file work
print('held')
t = time.ticks_ms()
while time.ticks_diff(time.ticks_ms(), t) < 600:
    pass
kbd_intr(3)
print('released')
while True:
    pass
"""


def test_a_ctrl_c_the_device_holds_waits_and_then_interrupts(emu):
    """This unix port raises KeyboardInterrupt wherever its SIGINT lands, LittleFS's C code included;
    LittleFS left torn in RAM loses the next file written (a fleet board's main.py, written right after
    mpremote's Ctrl-C met the board's boot). So emuboard holds Ctrl-C (no SIGINT handler) during flash
    operations and the boot's file work. The relay must then neither signal (SIG_DFL would kill the
    process) nor send the byte (code that runs does not read it: the Ctrl-C would be lost and mpremote
    would wait in vain): it waits until the device takes Ctrl-C again, and interrupts then."""
    emu.exec("g = 3")
    pid, m = emu.pid, emu.log.mark()
    emu.exec_nowait(HELD)
    emu.wait_for(r"^held$", since=m)
    assert emu.exec("print(g * 14)").strip() == "42"  # "\r\x03" waited for 'released', then interrupted
    texts = emu.log.texts(m)
    assert texts.index("released") < texts.index("KeyboardInterrupt:")
    assert emu.pid == pid and _deaths(emu, m) == []
