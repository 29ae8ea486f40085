"""The library's protocol edge cases (tests/lib/test_scripted.py) on the qemu-m3 board: the same test
functions and scripts, compiled for the Cortex-M3 and run through the REPL against the frozen client,
whose connection goes over the link UART to the scripted broker (ternlab.brokers.scripted) that checks every
byte. On the board the client's TCP dial is the link UART: closing it drops the line (the bridge hangs
up the far end), the far end closing reads as end of stream, as a socket's would."""

import sys
from pathlib import Path

import pytest

from ternlab.boards import load_profile
from ternlab.brokers.scripted import ScriptedBroker

HERE = Path(__file__).resolve().parent
LIB_TESTS = HERE.parent / "lib"
sys.path[:0] = [str(LIB_TESTS)]
import test_scripted  # noqa: E402  (the scripts; the host copy is only read for them)
from test_qemu_store import board_with  # noqa: E402

FILES = [LIB_TESTS / "check.py", LIB_TESTS / "pump.py", LIB_TESTS / "test_scripted.py"]
# The clients' dial is the link UART (no IP stack on the board): tern.client's as a socket, tern.aio's
# as the asyncio stream over it that its stream= makes (tern.aio._pair).
DIAL = ("import emuboard, tern.client, tern.aio\ntern.client.Client._dial = lambda self: emuboard.uart()\n"
        "async def _adial(self, t_ms):\n    return tern.aio._pair(emuboard.uart())\n"
        "tern.aio.Client._dial = _adial\n")
# Not here: the broker that stops reading (over a serial link the bridge, not the board, would block).
OFF_BOARD = {"test_a_broker_that_stops_reading_times_the_send_out"}
NAMES = [n for n in test_scripted.SCRIPTS if n not in OFF_BOARD]


# The scripts are written with the host codec (tern.codec), which is not in the device set frozen into
# the firmware (lib/tern/manifest.py): the board gets a copy as the top-level module `tern_codec`
# (its relative imports made absolute, onto the frozen tern) that the prelude names tern.codec.
CODEC = "import sys, tern_codec\nsys.modules['tern.codec'] = tern_codec\n"


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    d = tmp_path_factory.mktemp("qemu-scripted")
    src = (HERE.parents[1] / "lib" / "tern" / "codec.py").read_text()
    codec = d / "tern_codec.py"
    codec.write_text(src.replace("from . import ", "from tern import ").replace("from .", "from tern."))
    b = board_with(load_profile("qemu-m3-rp2"), FILES + [codec], d)
    yield b
    b.close()


@pytest.mark.parametrize("name", NAMES)
def test_scripted_on_the_board(request, board, name):
    from ternlab.pytest_plugin import attach, console_text

    mark = len(board.log.lines)
    attach(request, "board console (this test)", lambda: "".join(x.format() for x in board.log.lines[mark:]))
    script, version = test_scripted.SCRIPTS[name]
    broker = ScriptedBroker(script, version).start()
    try:
        board.link(broker.host, broker.port)
        out = board.exec(DIAL + CODEC + "import gc, test_scripted as t\ngc.collect()\nt.%s([%r, %d])\nprint('PASS')"
                         % (name, broker.host, broker.port), timeout=60)
        assert out.strip().endswith("PASS"), out
    finally:
        broker.stop()
    assert not broker.errors and broker.complete, "; ".join(broker.errors) or "script not finished"
