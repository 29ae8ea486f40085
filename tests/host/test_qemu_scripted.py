"""The library's protocol edge cases (tests/lib/test_scripted.py) on the qemu boards of both ISAs
(Cortex-M3 and RISC-V RV32, stock firmware): the same test functions and scripts, compiled for the
board and run through the REPL against Tern in its ROMFS partition, whose clients dial the scripted
broker (ternlab.brokers.scripted) that checks every byte through the board's own `socket` module,
as on a board with an IP stack. The host does not import that test module: its tests are named from
its source (the functions that take the scripted broker), and each script is the board's own copy."""

import ast
from pathlib import Path

import pytest

from ternlab.boards import load_profile
from ternlab.brokers.scripted import ScriptedBroker

from qemukit import ISAS, stock_board

HERE = Path(__file__).resolve().parent
LIB_TESTS = HERE.parent / "lib"
NAMES = [f.name for f in ast.parse((LIB_TESTS / "test_scripted.py").read_text()).body
         if isinstance(f, ast.FunctionDef) and f.name.startswith("test_") and
         any(a.arg == "scripted_addr" for a in f.args.args)]

# The scripts are written with the host codec (tern.codec), which is not in the device set
# (lib/tern/manifest.py): the board gets a copy as the top-level module `tern_codec` (its relative
# imports made absolute, onto the board's tern) that the prelude names tern.codec.
CODEC = "import sys, tern_codec\nsys.modules['tern.codec'] = tern_codec\n"


@pytest.fixture(scope="module", params=list(ISAS), ids=list(ISAS.values()))
def board(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("qemu-scripted")
    src = (HERE.parents[1] / "lib" / "tern" / "codec.py").read_text()
    codec = d / "tern_codec.py"
    codec.write_text(src.replace("from . import ", "from tern import ").replace("from .", "from tern."))
    files = [LIB_TESTS / "check.py", LIB_TESTS / "pump.py", LIB_TESTS / "test_scripted.py", codec]
    # a roomy heap: the scripts' own objects are on it, and one sends 32 KiB publishes
    b = stock_board(dict(load_profile(request.param), heap_bytes=393216), d, files)
    yield b
    b.close()


@pytest.mark.parametrize("name", NAMES)
def test_scripted_on_the_board(request, board, name):
    from ternlab.pytest_plugin import attach

    mark = len(board.log.lines)
    attach(request, "board console (this test)", lambda: "".join(x.format() for x in board.log.lines[mark:]))
    script, version = ast.literal_eval(board.exec(CODEC + "import test_scripted as t\nprint(repr(t.SCRIPTS[%r]))"
                                                   % name, timeout=60).strip())
    broker = ScriptedBroker(script, version).start()
    try:
        out = board.exec(CODEC + "import gc, test_scripted as t\ngc.collect()\nt.%s([%r, %d])\nprint('PASS')"
                         % (name, broker.host, broker.port), timeout=60)
        assert out.strip().endswith("PASS"), out
    finally:
        broker.stop()
    assert not broker.errors and broker.complete, "; ".join(broker.errors) or "script not finished"
