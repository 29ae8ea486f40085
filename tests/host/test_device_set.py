"""Tern's device set (issue 16): lib/tern/manifest.py names what goes on a board, and the three ways
there agree with it: freezing (firmware/manifest.py through MicroPython's own manifest tool),
`mpremote mip install` (package.json at the repository's top, onto an emulated board, which then
publishes to Mosquitto) and `tern deploy` (tests/host/test_boards_cli.py). The host codec never goes."""

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ternlab.boards.emulated import EmulatedBoard
from ternlab.devset import device_files

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


def test_package_json_installs_the_device_set():
    pkg = json.loads((ROOT / "package.json").read_text())
    assert pkg["urls"] == [[r, "lib/" + r] for _, r in device_files()]
    assert all((ROOT / url).is_file() for _, url in pkg["urls"])  # relative: github:OWNER/REPO and a path alike
    from mpremote.mip import _rewrite_url

    assert _rewrite_url("github:o/r/" + pkg["urls"][0][1]) == "https://raw.githubusercontent.com/o/r/HEAD/lib/tern/__init__.py"


def test_the_firmware_manifest_freezes_the_device_set_with_micropythons_tool(tmp_path):
    if not MICROPYTHON_SRC.is_file():
        pytest.skip("MicroPython's sources (../shared/third_party) are not on this machine")
    with tarfile.open(MICROPYTHON_SRC) as t:
        t.extract("micropython-1.28.0/tools/manifestfile.py", tmp_path, filter="data")
    port = tmp_path / "port"
    (port / "boards").mkdir(parents=True)
    (port / "boards" / "manifest.py").write_text("")  # the port's own manifest, empty here
    r = subprocess.run([sys.executable, tmp_path / "micropython-1.28.0/tools/manifestfile.py", "--freeze", "--port",
                        port, ROOT / "firmware/manifest.py"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    frozen = [ln.split("target_path='")[1].split("'")[0] for ln in r.stdout.splitlines() if "target_path='" in ln]
    assert frozen == [r for _, r in device_files()] + ["hal.py", "tconfig.py", "telemetry.py"]


def test_mip_install_from_a_path_onto_an_emulated_board_then_publish(tmp_path, broker):
    board = EmulatedBoard("unix-emulated", workdir=tmp_path / "board")
    try:
        assert board.eval("__import__('sys').path")[-1:] == ["/lib"] and not board.exists("lib/tern")
        board.disconnect()  # the port is mpremote's now
        r = subprocess.run([MPREMOTE, "connect", board.port, "mip", "install", str(ROOT / "package.json")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        on_board = board.listdir("lib/tern")
        assert on_board == sorted(Path(r).name for _, r in device_files()) and "codec.py" not in on_board
        board.exec("from tern.client import Client\n"
                   "c = Client('mip-board', server=%r, port=%d)\n"
                   "c.connect()\n"
                   "c.wait_published(c.publish('mip/board', b'installed by mip', qos=1, retain=True))\n"
                   "c.disconnect()\n" % (broker.host, broker.port), timeout=30)
        assert board.eval("__import__('tern.client').client.__file__") == "/lib/tern/client.py"
    finally:
        board.close()
    got = subprocess.run([MOSQ_SUB, "-h", broker.host, "-p", str(broker.port), "-t", "mip/board", "-C", "1",
                          "-W", "10"], capture_output=True, text=True, timeout=30)
    assert got.stdout == "installed by mip\n", got.stderr
