"""The README's hardware-in-the-loop example, verbatim: it must keep working (here on an emulated board;
with --board-port/--board-profile on a real one)."""

import pytest


@pytest.mark.board(capability="flash")
def test_the_board_keeps_its_files_across_a_reset(board):
    board.write_file("note.txt", "hello")
    board.soft_reset()
    assert board.read_file("note.txt") == b"hello"
    assert board.eval("1 + 1") == 2
