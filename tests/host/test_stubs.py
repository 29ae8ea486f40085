"""The device code (Tern's device set and the app, firmware/app) type-checked against the boards' own API
(issue 16): pyright (the `basedpyright` wheel, which carries pyright and its Node.js runtime, so it
runs offline) with the MicroPython stubs of the ESP32 and RP2 ports (`micropython-esp32-stubs`,
`micropython-rp2-stubs`, pinned to MicroPython 1.28, installed by `make setup` into .venv/stubs/PORT).

What is judged is the board's API: modules that do not exist on the port, attributes a module does
not have, calls with arguments the function does not take, and operators its types do not support
(`time.ticks_ms() + n`, which must be `ticks_add`). The library's own attribute typing (slots set to
None in __init__) is not annotated and not judged. A module of the other port (`rp2` when checking
the ESP32, `esp32` for the RP2) is imported only on its own platform and may be missing."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ternlab.devset import device_files
from ternlab.paths import device_dir, device_path

ROOT = Path(__file__).resolve().parents[2]
PYRIGHT = Path(sys.executable).with_name("basedpyright")
STUBS = Path(sys.prefix) / "stubs"
OTHER_PORT = {"esp32": {"rp2"}, "rp2": {"esp32"}}
RULES = ("reportMissingImports", "reportAttributeAccessIssue", "reportCallIssue", "reportOperatorIssue")


def device_sources():
    return [p for p, _ in device_files()] + [p for p in sorted(device_dir("app").glob("*.py"))
                                             if p.name != "manifest.py"]


def check(port, files, tmp_path):
    """[(file, line, rule, message)] the board's API objects to."""
    stubs = STUBS / port
    assert (stubs / "machine.pyi").is_file(), "no %s stubs in %s: run `make setup`" % (port, stubs)
    cfg = {"typeshedPath": str(stubs), "extraPaths": [str(stubs), str(ROOT / "lib")] + device_path("app", "unix-board"),
           "pythonVersion": "3.12", "typeCheckingMode": "off", "reportMissingModuleSource": "none",
           "include": [str(f) for f in files], **{r: "error" for r in RULES}}
    conf = tmp_path / ("pyright-%s.json" % port)
    conf.write_text(json.dumps(cfg))
    r = subprocess.run([PYRIGHT, "-p", conf, "--outputjson"], capture_output=True, text=True, timeout=300)
    out = json.loads(r.stdout)
    found = []
    for d in out["generalDiagnostics"]:
        msg, rule = d["message"].splitlines()[0], d.get("rule")
        if rule == "reportAttributeAccessIssue" and "of module" not in msg and "unknown import symbol" not in msg:
            continue  # the library's own attribute typing, not the board's API
        if rule == "reportMissingImports" and any('"%s"' % m in msg for m in OTHER_PORT[port]):
            continue
        found.append((str(Path(d["file"]).relative_to(tmp_path if "probe" in d["file"] else ROOT)),
                      d["range"]["start"]["line"] + 1, rule, msg))
    assert out["summary"]["filesAnalyzed"] >= len(files), out["summary"]
    return found


@pytest.mark.parametrize("port", ["esp32", "rp2"])
def test_the_device_code_uses_only_what_the_board_has(port, tmp_path):
    assert check(port, device_sources(), tmp_path) == []


def test_the_check_finds_calls_the_board_does_not_have(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import machine, time, esp32, nosuchmodule\n"
                     "machine.no_such_call()\n"
                     "deadline = time.ticks_ms() + 500\n"
                     "esp32.mcu_temperature()\n"
                     "machine.Pin(2, machine.Pin.OUT, machine.Pin.PULL_UP, 1, 2, 3, 4, 5)\n")
    found = {(line, rule) for _, line, rule, _ in check("esp32", [probe], tmp_path)}
    assert found == {(1, "reportMissingImports"), (2, "reportAttributeAccessIssue"), (3, "reportOperatorIssue"),
                     (4, "reportAttributeAccessIssue"), (5, "reportCallIssue")}, found
