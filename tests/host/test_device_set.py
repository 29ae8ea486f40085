"""Tern's device set (issue 16): lib/tern/manifest.py names what goes on a board, and the three ways
there agree with it: freezing (firmware/app/manifest.py through MicroPython's own manifest tool),
`mpremote mip install` (package.json at the repository's top, onto an emulated board, which then
publishes to Mosquitto) and `tern deploy` (tests/host/test_boards_cli.py). The host codec never goes."""

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ternlab.boards.emulated import EmulatedBoard
from ternlab.boards.deploy import mpy_version
from ternlab.devset import app_manifest, board_files, build_mpy, device_files, host_only
from ternlab.paths import device_dir

ROOT = Path(__file__).resolve().parents[2]
MPREMOTE = str(Path(sys.executable).with_name("mpremote"))
MOSQ_SUB = "/usr/bin/mosquitto_sub"
HOST_ONLY = {"codec.py", "manifest.py", "filestream.py"}  # the full codec (hosts, tests), the manifest itself, tern.aio's CPython file-stream adapter
MICROPYTHON_SRC = ROOT.parent / "shared" / "third_party" / "micropython-1.28.0-subset.tar.gz"


def test_the_device_set_is_every_module_but_the_host_codec_and_its_options_leave_theirs_out():
    names = [Path(r).name for _, r in device_files()]
    assert sorted(names) == sorted(p.name for p in (ROOT / "lib/tern").glob("*.py") if p.name not in HOST_ONLY)
    small = {Path(r).name for _, r in device_files(aio=False, flashstore=False)}
    assert small == set(names) - {"aio.py", "flashstore.py"}
    assert "logrec.py" not in {Path(r).name for _, r in device_files(flashstore=False, filestore=False)}


def test_package_json_installs_the_device_set_as_bytecode_and_package_src_json_as_sources():
    pkg = json.loads((ROOT / "package.json").read_text())
    assert pkg["urls"] == [[r[:-3] + ".mpy", "mpy/" + r[:-3] + ".mpy"] for _, r in device_files()]
    src = json.loads((ROOT / "package-src.json").read_text())
    assert src["urls"] == [[r, "lib/" + r] for _, r in device_files()]
    for p in (pkg, src):
        assert all((ROOT / url).is_file() for _, url in p["urls"])  # relative: github:OWNER/REPO and a path alike
    from mpremote.mip import _rewrite_url

    assert _rewrite_url("github:o/r/" + pkg["urls"][0][1]) == "https://raw.githubusercontent.com/o/r/HEAD/mpy/tern/__init__.mpy"


def test_the_committed_mpy_files_are_what_the_sources_compile_to_now(tmp_path):
    # mip installs the committed mpy/ as it is: a source changed without `python tools/build_mpy.py`
    # would put yesterday's library on the board
    built = build_mpy(tmp_path)
    committed = sorted(p.relative_to(ROOT / "mpy") for p in (ROOT / "mpy").rglob("*") if p.is_file())
    assert committed == sorted(p.relative_to(tmp_path) for p in built), "mpy/ holds other files than the device set"
    stale = [str(p.relative_to(tmp_path)) for p in built if p.read_bytes() != (ROOT / "mpy" / p.relative_to(tmp_path)).read_bytes()]
    assert not stale, "mpy/ is stale for %s: run python tools/build_mpy.py and commit" % stale
    for p in built:  # .mpy version 6, bytecode only (flags 0: no native code, so any v6 port reads it)
        assert mpy_version(p) == (6, 0), p


def test_the_firmware_manifest_freezes_the_device_set_with_micropythons_tool(tmp_path):
    if not MICROPYTHON_SRC.is_file():
        pytest.skip("MicroPython's sources (../shared/third_party) are not on this machine")
    with tarfile.open(MICROPYTHON_SRC) as t:
        t.extract("micropython-1.28.0/tools/manifestfile.py", tmp_path, filter="data")
    port = tmp_path / "port"
    (port / "boards").mkdir(parents=True)
    (port / "boards" / "manifest.py").write_text("")  # the port's own manifest, empty here
    r = subprocess.run([sys.executable, tmp_path / "micropython-1.28.0/tools/manifestfile.py", "--freeze", "--port",
                        port, device_dir("app") / "manifest.py"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    frozen = [ln.split("target_path='")[1].split("'")[0] for ln in r.stdout.splitlines() if "target_path='" in ln]
    assert frozen == [r for _, r in device_files(app_manifest())]  # what devset reads is what gets frozen
    assert frozen == [r for _, r in device_files()] + ["hal.py", "tconfig.py", "telemetry.py"]


def test_every_way_onto_a_board_ships_the_device_set_and_the_app_and_no_host_module(tmp_path):
    """deploy, the fleet's and tests' compiled folders and the ROMFS image carry the same files: the
    device set under lib/, the app's modules at the top; the host codec and tern.aio's CPython
    file-stream adapter reach none of them (the fleet's boards got both before)."""
    from ternlab.boards.deploy import plan
    from ternlab.devset import compile_mpy

    lib = ["lib/" + r for _, r in device_files()]
    want = lib + ["hal.py", "tconfig.py", "telemetry.py"]
    assert [r for _, r in board_files()] == want
    assert [(r, comp) for _, r, comp in plan()] == [(r, True) for r in want] + [("main.py", False)]
    mpy = compile_mpy(tmp_path / "mpy")
    shipped = sorted(p.relative_to(mpy).as_posix() for p in mpy.rglob("*") if p.is_file())
    assert shipped == sorted(r[4:-3] + ".mpy" if r.startswith("lib/") else r[:-3] + ".mpy" for r in want)
    assert {p.name for p in host_only()} == {"codec.py", "filestream.py"} == HOST_ONLY - {"manifest.py"}
    for name in ("codec", "filestream"):
        assert not [r for r in shipped if name in r]
    assert not [r for _, r, _ in plan(app=tmp_path / "mpy") if r.startswith("lib/") and ("codec" in r or "filestream" in r)]


@pytest.mark.parametrize("package, ext", [("package.json", ".mpy"), ("package-src.json", ".py")])
def test_mip_install_from_a_path_onto_an_emulated_board_then_publish(tmp_path, broker, package, ext):
    board = EmulatedBoard("unix-emulated", workdir=tmp_path / "board")
    try:
        assert board.eval("__import__('sys').path")[-1:] == ["/lib"] and not board.exists("lib/tern")
        board.disconnect()  # the port is mpremote's now
        r = subprocess.run([MPREMOTE, "connect", board.port, "mip", "install", str(ROOT / package)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        on_board = board.listdir("lib/tern")
        assert on_board == sorted(Path(r).stem + ext for _, r in device_files()) and "codec" + ext not in on_board
        board.exec("from tern.client import Client\n"
                   "c = Client('mip-board', server=%r, port=%d)\n"
                   "c.connect()\n"
                   "c.wait_published(c.publish('mip/board', b'installed by mip', qos=1, retain=True))\n"
                   "c.disconnect()\n" % (broker.host, broker.port), timeout=30)
        assert board.eval("__import__('tern.client').client.__file__") == "/lib/tern/client" + ext
    finally:
        board.close()
    got = subprocess.run([MOSQ_SUB, "-h", broker.host, "-p", str(broker.port), "-t", "mip/board", "-C", "1",
                          "-W", "10"], capture_output=True, text=True, timeout=30)
    assert got.stdout == "installed by mip\n", got.stderr


# The heap of an ESP32 without PSRAM (qemu-m3-esp32: 110,000 bytes) must leave an app this much once
# the mip-installed client has imported, connected and published (on the C3's 140,000 bytes, more).
APP_ROOM = 40_000

MIP_APP = """import gc, sys
from tern.client import Client
c = Client('mip-%s', server=%r, port=%d)
c.connect()
c.wait_published(c.publish('mip/%s', b'mip on a stock board', qos=1, retain=True))
gc.collect()
print('FREE', gc.mem_free(), __import__('tern.session').session.__file__, sys.path)
c.disconnect()
"""


@pytest.mark.parametrize("profile", ["qemu-m3-esp32", "qemu-rv32-c3"], ids=["cortex-m3", "rv32"])
def test_mip_install_onto_a_stock_qemu_board_imports_connects_and_publishes_with_room_to_spare(tmp_path, broker,
                                                                                              profile):
    # the microcontroller's own firmware (qemu port, stock: nothing of Tern frozen) with an ESP32's or a
    # C3's heap: package.json's bytecode, installed by mpremote as a user would, is what imports (the
    # board's own sys.path untouched), without compiling anything on the board, and dials the broker
    # through the board's sockets as on a board
    from ternlab.boards.qemu import QemuBoard

    board = QemuBoard(profile, workdir=tmp_path / "board")
    heap = board.profile["heap_bytes"]
    try:
        assert board.eval("__import__('gc').mem_free() + __import__('gc').mem_alloc()") <= heap
        board.disconnect()
        r = subprocess.run([MPREMOTE, "connect", board.port, "mip", "install", str(ROOT / "package.json")],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert board.listdir("lib/tern") == sorted(Path(r).stem + ".mpy" for _, r in device_files())
        out = board.exec(MIP_APP % (profile, broker.host, broker.port, profile), timeout=60)
        line = [ln for ln in out.splitlines() if ln.startswith("FREE")][0]
        free, where = line.split()[1:3]
        print("%s, mip's .mpy after import + connect + publish: %s bytes free" % (profile, free))
        assert where == "/lib/tern/session.mpy" and line.endswith("['', '.frozen', '/lib']"), line
        assert int(free) >= APP_ROOM, "only %s bytes of the heap left for the app" % free
    finally:
        board.close()
    got = subprocess.run([MOSQ_SUB, "-h", broker.host, "-p", str(broker.port), "-t", "mip/" + profile, "-C", "1",
                          "-W", "10"], capture_output=True, text=True, timeout=30)
    assert got.stdout == "mip on a stock board\n", got.stderr
