"""The library's store contract (tests/lib/test_store_contract.py) run on the qemu boards of both
ISAs (Cortex-M3 and RISC-V RV32, stock firmware): the same test functions, compiled with mpy-cross
for the board, against Tern's FlashStore and FileStore in the board's ROMFS partition -- FlashStore
on the board's NOR flash model, FileStore on the board's own LittleFS (its root filesystem, on the
same flash) -- through the REPL."""

from pathlib import Path

import pytest

from ternlab.boards import load_profile
from ternlab.paths import device_dir

from qemukit import ISAS, stock_board

HERE = Path(__file__).resolve().parent
LIB_TESTS = HERE.parent / "lib"
# the tests and their helpers, as the board imports them (from its ROMFS partition, with Tern)
FILES = [LIB_TESTS / "check.py", LIB_TESTS / "storekit.py", LIB_TESTS / "test_norflash.py", LIB_TESTS / "test_store_contract.py",
         device_dir("qemu-testing") / "norflash.py"]


@pytest.fixture(scope="module", params=list(ISAS), ids=list(ISAS.values()))
def board(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("qemu-store")
    # the Pico W's heap (the tests' own objects are on it), with a raw partition as qemu-m3-esp32 has
    prof = dict(load_profile(request.param), heap_bytes=194560,
                flash={"block_size": 4096, "fs_blocks": 128, "outbox": {"label": "outbox", "blocks": 32}})
    b = stock_board(prof, d, FILES)
    b.mkdir("tmp")
    yield b
    b.close()


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
