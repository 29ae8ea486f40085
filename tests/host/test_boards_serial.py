"""One test body, two kinds of board: an EmulatedBoard driven directly, and a SerialBoard (mpremote's
transport over pyserial, what drives a real board) on an EmulatedBoard's pty. The only physical part
missing is the USB cable: the SerialBoard sees a serial port and a MicroPython raw REPL behind it."""

import pytest

from ternlab.boards import Board, BoardError, DeviceError
from ternlab.boards.emulated import EmulatedBoard
from ternlab.boards.serial import SerialBoard


@pytest.fixture(params=["emulated", "serial"])
def board(request, tmp_path):
    emu = EmulatedBoard("unix-emulated", workdir=tmp_path / "emu", board_id="hil-1")
    if request.param == "emulated":
        b = emu
    else:
        b = SerialBoard(emu.port, profile="unix-emulated", log_path=tmp_path / "serial.log")
    b.start()
    yield b
    b.stop()
    emu.close()


def test_same_body_on_emulated_and_serial_board(board):
    assert isinstance(board, Board) and board.profile["name"] == "unix-emulated"
    assert board.exec("print('hi', 1 + 2)") == "hi 3\n"
    assert board.eval("__import__('emuboard').unique_id()") == b"hil-1"
    with pytest.raises(DeviceError, match="ZeroDivisionError"):
        board.exec("1 / 0")

    board.write_file("main.py", "print('main.py up')\n")
    board.write_file("data.bin", bytes(range(256)) * 9)
    assert board.listdir() == ["data.bin", "main.py"]
    assert board.read_file("data.bin") == bytes(range(256)) * 9
    board.remove("data.bin")
    assert not board.exists("data.bin")

    m = board.log.mark()
    board.exec_nowait("import time\nfor i in range(3):\n print('step', i)\n time.sleep(0.05)")
    board.wait_for(r"step 2", since=m, timeout=10)
    assert [t for t in board.log.texts(m) if t.startswith("step")] == ["step 0", "step 1", "step 2"]

    m = board.log.mark()
    board.soft_reset()
    board.wait_for(r"main\.py up", since=m)

    m = board.log.mark()
    board.power_cycle()
    board.wait_for(r"main\.py up", since=m)  # a serial board: read from the port while waiting
    assert board.exec("print('back')") == "back\n"


def test_serial_board_names_what_is_wrong(tmp_path):
    b = SerialBoard(str(tmp_path / "no-such-port"), profile="esp32-generic")
    with pytest.raises(BoardError, match="cannot open .*no-such-port"):
        b.exec("print(1)")
    with pytest.raises(BoardError, match="power_cut"):
        b.cut_power()
    with pytest.raises(ValueError, match="unknown board profile"):
        SerialBoard("/dev/null", profile="esp99")
