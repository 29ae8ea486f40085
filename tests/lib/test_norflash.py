"""The emulated NOR flash keeps NOR rules, counts exactly, and tears where told."""

import os

from check import MICROPYTHON, raises
from norflash import NorFlash, NorViolation, PowerCut, read_wear
from storekit import tmppath, rm


def image(path):
    with open(path, "rb") as f:
        return f.read()


# -- tests --------------------------------------------------------------------
def test_fresh_flash_is_erased_and_reports_geometry():
    p = tmppath("nor")
    try:
        d = NorFlash(p, blocks=4, block_size=4096)
        assert d.ioctl(4, 0) == 4 and d.ioctl(5, 0) == 4096
        assert d.ioctl(1, 0) == 0 and d.ioctl(3, 0) == 0
        buf = bytearray(4096)
        d.readblocks(3, buf)
        assert buf == b"\xff" * 4096
        d.close()
        assert image(p) == b"\xff" * 4 * 4096
    finally:
        rm(p)


def test_program_only_clears_bits_and_zero_to_one_raises():
    p = tmppath("nor")
    try:
        d = NorFlash(p, blocks=2)
        d.writeblocks(1, b"\xf0\x0f\xaa", 10)
        d.writeblocks(1, b"\x30", 10)  # clears more bits: fine
        d.writeblocks(1, b"\x0f", 11)  # the same value again: fine
        d.writeblocks(1, b"\xff\x7f", 13)  # 1s over erased bytes: fine
        e = raises(NorViolation, d.writeblocks, 1, b"\x55", 12)  # 0xaa -> would set bits
        assert "0x100c" in str(e), str(e)
        big = bytearray(b"\xff" * 100)
        big[50] = 0x01
        d.writeblocks(0, big, 0)
        big[50] = 0x03
        raises(NorViolation, d.writeblocks, 0, big, 0)  # large-program path checks too
        buf = bytearray(4)
        d.readblocks(1, buf, 10)
        assert buf == b"\x30\x0f\xaa\xff", buf
        raises(NorViolation, d.writeblocks, 1, b"\xff", 11)  # asks for 1s where 0s are: strict
        d.close()
        img = image(p)
        assert img[4096 + 10 : 4096 + 15] == b"\x30\x0f\xaa\xff\x7f"  # written through
        assert img[50] == 0x01
    finally:
        rm(p)


def test_erase_sets_ff_and_counters_are_exact():
    p = tmppath("nor")
    try:
        d = NorFlash(p, blocks=3)
        d.writeblocks(0, b"\x00" * 8, 0)
        d.writeblocks(0, b"\x00" * 40, 100)
        d.writeblocks(2, b"\x12", 4095)
        d.ioctl(6, 0)
        d.ioctl(6, 0)
        d.ioctl(6, 2)
        buf = bytearray(4096)
        d.readblocks(0, buf)
        assert buf == b"\xff" * 4096
        c = d.counters()
        assert c["programs"] == 3 and c["bytes_programmed"] == 49, c
        assert c["erases"] == [2, 0, 1] and c["erases_total"] == 3, c
        assert c["ops"] == 6 and c["reads"] == 1 and c["bytes_read"] == 4096, c
        d.close()
        w = read_wear(p)  # what a host reads after the process is gone
        assert w["programs"] == 3 and w["bytes_programmed"] == 49 and w["erases"] == [2, 0, 1], w
        d = NorFlash(p, blocks=3)  # reopening carries the counters on
        d.writeblocks(1, b"\x00", 0)
        d.ioctl(6, 1)
        d.close()
        w = read_wear(p)
        assert w["programs"] == 4 and w["bytes_programmed"] == 50 and w["erases"] == [2, 1, 1], w
    finally:
        rm(p)


def test_bounds_are_checked():
    d = NorFlash(None, blocks=2)
    raises(ValueError, d.writeblocks, 2, b"\x00", 0)
    raises(ValueError, d.readblocks, 1, bytearray(2), 4095)
    raises(ValueError, d.ioctl, 6, 5)


def test_wrong_image_size_is_refused():
    p = tmppath("nor")
    try:
        NorFlash(p, blocks=2).close()
        raises(ValueError, NorFlash, p, 3)
    finally:
        rm(p)


def test_cut_at_n_stops_exactly_there():
    p = tmppath("nor")
    try:
        d = NorFlash(p, blocks=2, cut_at=3, seed=7)
        d.writeblocks(0, b"\x00" * 4, 0)  # op 1
        d.ioctl(6, 1)  # op 2
        e = raises(PowerCut, d.writeblocks, 0, b"\x00" * 64, 64)  # op 3: torn
        assert d.ops == 3 and d.torn is not None
        raises(PowerCut, d.readblocks, 0, bytearray(4))  # dead from now on
        raises(PowerCut, d.writeblocks, 0, b"\x00", 200)
        raises(PowerCut, d.ioctl, 6, 0)
        assert "3" in str(e)
        d.close()
        d = NorFlash(p, blocks=2)  # "reboot"
        buf = bytearray(64)
        d.readblocks(0, buf, 64)
        assert buf != b"\x00" * 64, "the torn program completed"
        d.readblocks(0, buf, 128)
        assert buf == b"\xff" * 64, "a write after the cut happened"
        assert d.counters()["erases"] == [0, 1]
        d.close()
    finally:
        rm(p)


def test_torn_programs_are_torn():
    """Over many seeds: results lie between old and new, both kinds occur, never the full write."""
    kinds = {}
    for seed in range(1, 40):
        d = NorFlash(None, blocks=1, cut_at=2, seed=seed)
        d.writeblocks(0, b"\xf0" * 32, 0)
        new = b"\x00" * 32
        raises(PowerCut, d.writeblocks, 0, new, 0)
        got = d.mem[0:32]
        for i in range(32):
            assert got[i] & 0xF0 == got[i], "a torn program set bits"
        assert got != new and got != bytearray(b"\x00" * 32)
        kinds[d.torn[0]] = kinds.get(d.torn[0], 0) + 1
        if d.torn[0] == "program-prefix":
            k = d.torn[3]
            assert got[:k] == b"\x00" * k and got[k:] == b"\xf0" * (32 - k)
    assert set(kinds) == {"program-prefix", "program-bits"}, kinds


def test_torn_erases_are_neither_old_nor_blank():
    modes = set()
    for seed in range(1, 30):
        d = NorFlash(None, blocks=2, block_size=4096, cut_at=2, seed=seed)
        d.writeblocks(1, b"\x00" * 4096, 0)
        raises(PowerCut, d.ioctl, 6, 1)
        blk = d.mem[4096:8192]
        assert blk != b"\x00" * 4096 and blk != b"\xff" * 4096, d.torn
        assert d.mem[0:4096] == b"\xff" * 4096
        modes.add(d.torn[2])
    assert modes == {0, 1, 2}, modes


def test_killed_process_leaves_true_image():
    """Every op is written through: the file equals the RAM image after each op."""
    p = tmppath("nor")
    try:
        d = NorFlash(p, blocks=2, cut_at=5, seed=3)
        d.writeblocks(0, b"\x01\x02", 0)
        d.writeblocks(1, b"\x00" * 300, 1000)
        assert image(p) == bytes(d.mem)
        d.ioctl(6, 1)
        assert image(p) == bytes(d.mem)
        d.writeblocks(1, b"\x00" * 300, 1000)
        raises(PowerCut, d.ioctl, 6, 1)
        assert image(p) == bytes(d.mem)  # the torn erase is on disk too
        assert read_wear(p)["erases"] == [0, 2]
    finally:
        rm(p)


def test_littlefs_formats_and_mounts_over_it():
    """MicroPython's VfsLfs2 (CPython: littlefs-python) works on NOR rules."""
    p = tmppath("nor")
    try:
        d = NorFlash(p, blocks=16)
        data = bytes(range(256)) * 20
        if MICROPYTHON:
            import vfs

            vfs.VfsLfs2.mkfs(d, readsize=32, progsize=32, lookahead=32)
            fs = vfs.VfsLfs2(d, readsize=32, progsize=32, lookahead=32)
            mp = "/" + p.rpartition("/")[2]
            vfs.mount(fs, mp)
            with open(mp + "/f.bin", "wb") as f:
                f.write(data)
            vfs.umount(mp)
            d.close()
            d = NorFlash(p, blocks=16)
            vfs.mount(vfs.VfsLfs2(d, readsize=32, progsize=32, lookahead=32), mp)
            with open(mp + "/f.bin", "rb") as f:
                assert f.read() == data
            vfs.umount(mp)
        else:
            from storekit import lfs_mount

            fs = lfs_mount(d, fresh=True)
            with fs.open("f.bin", "wb") as f:
                f.write(data)
            fs.unmount()
            d.close()
            d = NorFlash(p, blocks=16)
            fs = lfs_mount(d)
            with fs.open("f.bin", "rb") as f:
                assert f.read() == data
        c = d.counters()
        d.close()
        assert read_wear(p)["erases_total"] > 0 and read_wear(p)["bytes_programmed"] >= len(data)
        assert c["reads"] > 0
    finally:
        rm(p)
