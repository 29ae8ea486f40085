"""`tern board run`, `tern deploy`, `tern flash`, `tern repl`, and the ESP32 partition tables.

There is no ESP32 on this machine: `tern flash` is tested up to esptool talking to a port where no
chip answers, and the partition table it writes is checked byte by byte against the documented format."""

import hashlib
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ternlab import cli
from ternlab.boards import load_profile
from ternlab.boards.emulated import EmulatedBoard
from ternlab.boards.partitions import PartitionError, from_binary, parse_csv, profile_table, to_binary
from ternlab.devset import device_files
from ternlab.paths import device_dir

TERN = str(Path(sys.executable).with_name("tern"))
ROOT = Path(__file__).resolve().parents[2]


def tern(capsys, *argv):
    capsys.readouterr()
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


# -- partition tables ---------------------------------------------------------------
def test_esp32_partition_table_bytes_follow_the_documented_format():
    parts, table = profile_table(load_profile("esp32-generic"))
    assert len(table) == 0xC00
    # entry 0, written out by hand from the format: AA 50, type, subtype, offset LE, size LE, label[16], flags
    nvs = bytes.fromhex("aa50" "01" "02" "00900000" "00600000") + b"nvs".ljust(16, b"\0") + bytes(4)
    assert table[:32] == nvs
    outbox = [i for i, p in enumerate(parts) if p["name"] == "outbox"][0]
    e = table[32 * outbox:32 * outbox + 32]
    assert struct.unpack("<2sBBII16sI", e) == (b"\xaa\x50", 1, 0x06, 0x200000, 0x20000, b"outbox".ljust(16, b"\0"), 0)
    factory = table[64:96]
    assert factory[2:4] == b"\x00\x00" and struct.unpack("<I", factory[4:8])[0] == 0x10000
    n = len(parts) * 32
    assert table[n:n + 16] == b"\xeb\xeb" + b"\xff" * 14
    assert table[n + 16:n + 32] == hashlib.md5(table[:n]).digest()
    assert table[n + 32:] == b"\xff" * (0xC00 - n - 32)
    assert from_binary(table) == parts
    s3, _ = profile_table(load_profile("esp32-s3"))
    assert [p for p in s3 if p["name"] == "vfs"][0]["size"] == 0x5E0000


@pytest.mark.parametrize("csv, message", [
    ("nvs, data, nvs, 0x9000, 0x6000\nx, data, nvs, 0xa000, 0x1000", "overlaps"),
    ("factory, app, factory, 0x11000, 0x10000", "not aligned to 0x10000"),
    ("a, blob, nvs, 0x9000, 0x1000", "unknown type 'blob'"),
    ("a, data, weird, 0x9000, 0x1000", "unknown data subtype 'weird'"),
    ("a, data, nvs, 0x9000, 0x1800", "multiple of 4 KiB"),
    ("a, data, nvs, 0x9000", "expected Name"),
    ("big, data, fat, 0x10000, 4M", "past the end of the 4 MiB flash"),
    ("a_name_far_too_long, data, nvs, 0x9000, 0x1000", "1 to 15 bytes"),
])
def test_partition_csv_errors_name_the_line(csv, message):
    with pytest.raises(PartitionError, match=message) as e:
        parse_csv("# header\n" + csv, "t.csv", 4 << 20)
    assert "t.csv line" in str(e.value)


def test_profile_table_checks_the_outbox_against_the_profile(tmp_path):
    prof = load_profile("esp32-generic")
    csv = (ROOT / "boards/esp32-generic/partitions.csv").read_text().replace("0x200000, 0x20000", "0x200000, 0x10000")
    (tmp_path / "partitions.csv").write_text(csv)
    prof["_dir"] = str(tmp_path)
    with pytest.raises(PartitionError, match="outbox is 0x10000 bytes, the profile says 0x20000"):
        profile_table(prof)
    assert to_binary(parse_csv(csv))[:32] == profile_table(load_profile("esp32-generic"))[1][:32]


# -- tern flash ----------------------------------------------------------------------
# Images as esp-idf lays them out (built here, full size, not downloaded): a 24-byte header (magic 0xE9,
# segment count, flash mode, size/frequency, entry point, then the extended header with the chip id at
# offset 12), 8-byte segment headers, and in an app the app description (magic 0xABCD5432) first.
CHIP_IDS = {"esp32": 0, "esp32s3": 9, "esp32c3": 5}
BOOT_AT = {"esp32": 0x1000, "esp32s3": 0x0}
APP_SIZE = 0x1A0000  # 1.6 MiB: about a MicroPython 1.28 ESP32_GENERIC app
# MicroPython's own layout for ESP32_GENERIC (ports/esp32/partitions-4MiB.csv): what a combined download holds
MP_TABLE = "nvs, data, nvs, 0x9000, 0x6000\nphy_init, data, phy, 0xf000, 0x1000\nfactory, app, factory, 0x10000, 0x1F0000\n" \
           "vfs, data, fat, 0x200000, 0x200000\n"


def esp_image(chip, size, app, seed=1):
    import random

    body = bytearray(random.Random(seed).randbytes(size - 32))
    if app:
        body[:4] = struct.pack("<I", 0xABCD5432)
    head = struct.pack("<BBBBI", 0xE9, 1, 2, 0x20, 0x40080000)
    head += struct.pack("<B3sHBHH4sB", 0xEE, bytes(3), CHIP_IDS[chip], 0, 0, 0xFFFF, bytes(4), 0)
    return head + struct.pack("<II", 0x3F400020, size - 32) + bytes(body)


def combined_image(chip):
    boot = BOOT_AT[chip]
    out = bytearray(esp_image(chip, 0x6000 if chip == "esp32" else 0x5000, app=False, seed=2))
    out += b"\xff" * (0x8000 - boot - len(out)) + to_binary(parse_csv(MP_TABLE))
    out += b"\xff" * (0x10000 - boot - len(out)) + esp_image(chip, APP_SIZE, app=True)
    return bytes(out)


def esptool_merge(chip, pairs, out):
    """esptool's own check of an address/file list: merge-bin parses it as write-flash does (the same
    argument type, which refuses overlapping files) and lays the files out as the flash will hold them."""
    r = subprocess.run([sys.executable, "-m", "esptool", "--chip", chip, "merge-bin", "-o", str(out), *pairs],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, COLUMNS="300"))
    return r.returncode, " ".join((r.stdout + r.stderr).replace("│", " ").split())  # its boxes unwrapped


def flash_dry_run(capsys, fw, profile, *extra):
    rc, out, err = tern(capsys, "flash", "--port", "/dev/ttyUSB9", "--firmware", fw, "--profile", profile,
                        "--dry-run", *extra)
    assert rc == 0, err
    kept = Path(re.search(r"the files to write are in (\S+) \(kept", err).group(1))
    return [line.split() for line in out.splitlines()], err, kept


@pytest.mark.parametrize("profile", ["esp32-generic", "esp32-s3"])
def test_tern_flash_writes_each_kind_of_image_where_the_chip_reads_it(tmp_path, capsys, profile):
    prof = load_profile(profile)
    chip, boot = prof["chip"], BOOT_AT[prof["chip"]]
    _, table = profile_table(prof)
    outbox = [p for p in profile_table(prof)[0] if p["name"] == "outbox"][0]
    combined, app = tmp_path / "combined.bin", tmp_path / "micropython.bin"
    combined.write_bytes(combined_image(chip))
    app.write_bytes(esp_image(chip, APP_SIZE, app=True))
    assert len(combined.read_bytes()) > 0x1A0000

    # the command the old `tern flash` printed for the combined image: esptool refuses it
    (tmp_path / "t.bin").write_bytes(table)
    rc, text = esptool_merge(chip, ["0x%x" % boot, combined, "0x8000", tmp_path / "t.bin"], tmp_path / "x.bin")
    assert rc != 0 and "Detected overlap at address: 0x8000" in text, text

    for fw in (combined, app):
        (cmd,), err, kept = flash_dry_run(capsys, fw, profile)
        try:
            assert cmd[:4] == [sys.executable, "-m", "esptool", "--chip"] and cmd[4] == chip
            i = cmd.index("write-flash")
            pairs = cmd[i + 2:]
            rc, text = esptool_merge(chip, pairs, tmp_path / "flash.bin")
            assert rc == 0, text
            flash = (tmp_path / "flash.bin").read_bytes()  # as the flash holds it: from address 0, 0xFF between
            data = fw.read_bytes()
            if fw is combined:
                assert pairs[0] == "0x%x" % boot and len(pairs) == 2
                assert flash[boot:0x8000] == data[:0x8000 - boot]  # the bootloader, at the chip's offset
            else:
                assert pairs[0] == "0x10000" and len(pairs) == 4
                assert "bootloader already on the chip is kept" in err
            assert flash[0x8000:0x8000 + len(table)] == table  # Tern's partition table, not MicroPython's
            assert flash[0x10000:0x10000 + APP_SIZE] == data[-APP_SIZE:]  # the app in its partition
            assert len(flash) <= outbox["offset"]  # nothing written over the outbox partition
            assert "outbox partition (0x%x, 128 KiB) is kept" % outbox["offset"] in err
        finally:
            __import__("shutil").rmtree(kept)
    # the outbox partition erased on purpose: the region esptool erases is the partition, sector aligned
    (erase, write), err, kept = flash_dry_run(capsys, app, profile, "--erase-outbox")
    __import__("shutil").rmtree(kept)
    assert erase[erase.index("erase-region") + 1:] == ["0x%x" % outbox["offset"], "0x%x" % outbox["size"]]
    assert outbox["offset"] % 0x1000 == outbox["size"] % 0x1000 == 0
    assert "messages not yet delivered are lost" in err and write[write.index("write-flash") + 2:][:2] == ["0x10000", str(app)]


def test_tern_flash_tells_images_apart_and_checks_its_inputs(tmp_path, capsys):
    app = tmp_path / "fw.bin"
    app.write_bytes(esp_image("esp32", 0x10000, app=True))
    s3 = tmp_path / "s3.bin"
    s3.write_bytes(esp_image("esp32s3", 0x10000, app=True))
    boot = tmp_path / "bootloader.bin"
    boot.write_bytes(esp_image("esp32", 0x6000, app=False))
    big = tmp_path / "big.bin"
    big.write_bytes(esp_image("esp32", 0x200000, app=True))
    odd = tmp_path / "odd.bin"
    odd.write_bytes(esp_image("esp32", 0x20000, app=False))
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x7fELF")
    cases = [
        (["--port", "/dev/nonexistent", "--firmware", app], "no serial port /dev/nonexistent"),
        (["--port", "/dev/null", "--firmware", tmp_path / "missing.bin"], "missing.bin does not exist"),
        (["--port", "/dev/null", "--firmware", bad], "not an ESP32 image (first byte 7f, expected 0xe9, or 0xff up "
                                                     "to a bootloader at 0x1000 for a full-flash image)"),
        (["--port", "/dev/null", "--firmware", app, "--profile", "rp2-pico-w"], "rp2-pico-w is not an ESP32 board"),
        (["--port", "/dev/null", "--firmware", app, "--profile", "esp33"], "unknown board profile 'esp33'"),
        (["--port", "/dev/null", "--firmware", s3], "s3.bin is built for ESP32-S3, not ESP32"),
        (["--port", "/dev/null", "--firmware", boot], "bootloader.bin is a bootloader alone"),
        (["--port", "/dev/null", "--firmware", odd], "neither an app image (no app description magic 0xabcd5432"),
        (["--port", "/dev/null", "--firmware", big], "does not fit the factory partition (0x1f0000 bytes at 0x10000)"),
    ]
    for argv, message in cases:
        rc, out, err = tern(capsys, "flash", *argv)
        assert rc == 1 and err.startswith("tern flash: ") and message in err, (argv, err)
    rc, out, err = tern(capsys, "flash", "--firmware", app)
    assert rc == 2 and "--port" in err
    rc, out, err = tern(capsys, "flash", "--port", "/dev/null", "--firmware", app, "--erase", "--erase-outbox")
    assert rc == 2 and "not allowed with" in err

    table = tmp_path / "pt.bin"
    rc, out, err = tern(capsys, "flash", "--port", "/dev/ttyUSB9", "--firmware", s3, "--dry-run", "--erase",
                        "--table-out", table, "--profile", "esp32-s3")
    assert rc == 0, err
    lines = out.splitlines()
    esptool = "%s -m esptool --chip esp32s3 --port /dev/ttyUSB9 --baud 460800" % sys.executable
    assert lines[0] == esptool + " erase-flash"
    assert lines[1] == esptool + " write-flash -z 0x10000 %s 0x8000 %s" % (s3, table)
    assert "the outbox partition with it" in err
    assert table.read_bytes() == profile_table(load_profile("esp32-s3"))[1]


def test_tern_flash_dry_run_prints_commands_a_shell_runs(tmp_path, capsys):
    # it printed "tern flash: -m esptool ..." with the python left out, paths unquoted, and a partition
    # table in a temporary folder removed on exit: nothing of it could be pasted into a shell
    fw = tmp_path / "my firmware" / "fw.bin"
    fw.parent.mkdir()
    fw.write_bytes(combined_image("esp32"))
    m, s = os.openpty()
    try:
        rc, out, err = tern(capsys, "flash", "--port", os.ttyname(s), "--firmware", fw, "--dry-run")
        assert rc == 0, err
        (line,) = out.splitlines()
        kept = Path(re.search(r"the files to write are in (\S+) \(kept", err).group(1))
        try:
            copy = kept / "fw-tern-table.bin"
            assert copy.read_bytes()[0x7000:0x7C00] == profile_table(load_profile("esp32-generic"))[1]
            assert line.endswith("0x1000 %s" % copy)
            # pasted into a shell: esptool gets every argument, finds the file, and fails only at
            # connecting (no chip on this pty)
            r = subprocess.run(["sh", "-c", line.replace("write-flash", "--before no-reset --connect-attempts 1 "
                                                         "write-flash")], capture_output=True, text=True, timeout=120)
        finally:
            __import__("shutil").rmtree(kept)
    finally:
        os.close(m)
        os.close(s)
    text = r.stdout + r.stderr
    assert r.returncode != 0 and "Failed to connect to ESP32" in text, text
    assert "Usage" not in text and "No such file" not in text and "overlap" not in text


def esptool_full_image(tmp_path, chip, *extra, vfs=None):
    """A full-flash image as esptool merge-bin writes it from a combined image's parts: from address 0
    (0xff before an ESP32's bootloader at 0x1000), MicroPython's own table; extra: merge-bin options
    (--pad-to-size 4MB fills to the flash's end); vfs: a filesystem image put at 0x200000 (a flash dump)."""
    files = {"boot.bin": esp_image(chip, 0x6000 if chip == "esp32" else 0x5000, app=False, seed=2),
             "mp-table.bin": to_binary(parse_csv(MP_TABLE)), "app.bin": esp_image(chip, APP_SIZE, app=True)}
    if vfs is not None:
        files["vfs.bin"] = vfs
    pairs = []
    for (name, data), at in zip(files.items(), (BOOT_AT[chip], 0x8000, 0x10000, 0x200000)):
        (tmp_path / name).write_bytes(data)
        pairs += ["0x%x" % at, tmp_path / name]
    out = tmp_path / ("full-%s%s.bin" % (chip, "-dump" if vfs else "".join(extra)))
    rc, text = esptool_merge(chip, [*extra, *pairs], out)
    assert rc == 0, text
    return out


@pytest.mark.parametrize("chip, profile", [("esp32", "esp32-generic"), ("esp32s3", "esp32-s3")])
def test_tern_flash_places_a_full_flash_image_at_0x0(tmp_path, capsys, chip, profile):
    # esptool merge-bin's output starts at address 0: 0xff up to an ESP32's bootloader at 0x1000. It was
    # refused as "not an ESP32 image (first byte ff)".
    _, table = profile_table(load_profile(profile))
    outbox = [p for p in profile_table(load_profile(profile))[0] if p["name"] == "outbox"][0]
    for extra in ((), ("--pad-to-size", "4MB")):
        full = esptool_full_image(tmp_path, chip, *extra)
        data = full.read_bytes()
        assert data[:1] == (b"\xff" if chip == "esp32" else b"\xe9") and (len(data) == 4 << 20) == bool(extra)
        (cmd,), err, kept = flash_dry_run(capsys, full, profile)
        try:
            pairs = cmd[cmd.index("write-flash") + 2:]
            assert pairs[0] == "0x0" and len(pairs) == 2, pairs  # placed at 0x0
            rc, text = esptool_merge(chip, pairs, tmp_path / "flash.bin")
            assert rc == 0, text
            flash = (tmp_path / "flash.bin").read_bytes()
            boot = BOOT_AT[chip]
            assert flash[boot:0x8000] == data[boot:0x8000]  # the bootloader where the chip reads it
            assert flash[0x8000:0x8000 + len(table)] == table  # Tern's table in place of MicroPython's
            assert flash[0x10000:0x10000 + APP_SIZE] == data[0x10000:0x10000 + APP_SIZE]
            assert len(flash) <= outbox["offset"]  # the fill is not written over the outbox and vfs
            assert ("full-flash image" if chip == "esp32" else "combined image") in err
            assert ("0xff fill after the app" in err) == bool(extra), err
        finally:
            __import__("shutil").rmtree(kept)


class FakeChip:
    """The ESP32 at the other end of esptool (the machine that runs the tests has none): a 4 MiB flash
    that esptool's read-flash, write-flash, erase-region and erase-flash commands act on as the chip
    does. write-flash's address/file list goes through esptool's own parser and layout (merge-bin), and
    the sectors it covers are erased before they are written, as esptool does."""

    def __init__(self, tmp_path, flash):
        self.flash = bytearray(flash)
        self.tmp = tmp_path
        self.ops = []

    def __call__(self, cmd):
        assert cmd[:3] == [sys.executable, "-m", "esptool"], cmd
        chip = cmd[cmd.index("--chip") + 1]
        op = next(a for a in cmd if a in ("read-flash", "write-flash", "erase-region", "erase-flash"))
        args = cmd[cmd.index(op) + 1:]
        self.ops.append(op)
        if op == "read-flash":
            at, n, out = int(args[0], 0), int(args[1], 0), args[2]
            Path(out).write_bytes(self.flash[at:at + n])
        elif op == "erase-flash":
            self.flash[:] = b"\xff" * len(self.flash)
        elif op == "erase-region":
            at, n = int(args[0], 0), int(args[1], 0)
            self.flash[at:at + n] = b"\xff" * n
        else:
            pairs = [a for a in args if a != "-z"]
            low = min(int(a, 0) for a in pairs[::2])
            rc, text = esptool_merge(chip, ["--target-offset", hex(low), *pairs], self.tmp / "written.bin")
            assert rc == 0, text
            data = (self.tmp / "written.bin").read_bytes()
            end = low + len(data) + (-len(data) % 0x1000)
            self.flash[low:end] = data + b"\xff" * (end - low - len(data))
        return 0

    def files(self, at, size):
        """The files of the LittleFS filesystem at `at` (MicroPython's vfs on ESP32), or None when there is
        none there."""
        import littlefs

        fs = littlefs.LittleFS(block_size=4096, block_count=size // 4096, mount=False)
        fs.context.buffer = bytearray(self.flash[at:at + size])
        try:
            fs.mount()
        except Exception:
            return None
        return {name: fs.open(name, "rb").read() for name in fs.listdir("/")}


def stock_micropython_flash(tmp_path):
    """An ESP32 that ran stock MicroPython: its table (vfs at 0x200000, 2 MiB) and a LittleFS vfs holding
    the user's files, as a dump of its 4 MiB (esptool merge-bin --pad-to-size 4MB)."""
    import littlefs

    fs = littlefs.LittleFS(block_size=4096, block_count=512)
    for name, text in (("main.py", b"print('my app')\n"), ("config.json", b'{"host": "broker.lan"}')):
        with fs.open(name, "wb") as f:
            f.write(text)
    return esptool_full_image(tmp_path, "esp32", "--pad-to-size", "4MB", vfs=bytes(fs.context.buffer))


def test_tern_flash_over_a_stock_micropython_table_says_what_moves_and_keeps_the_files_if_asked(
        tmp_path, capsys, monkeypatch):
    # Tern's table moves vfs from 0x200000 to 0x220000: the first flash of a board that ran stock MicroPython
    # left its files unreadable, without a word.
    from ternlab.boards import flash as boards_cli
    from ternlab.boards.partitions import from_binary

    dump = stock_micropython_flash(tmp_path)
    user_files = {"main.py": b"print('my app')\n", "config.json": b'{"host": "broker.lan"}'}
    full = esptool_full_image(tmp_path, "esp32", "--pad-to-size", "4MB")
    m, s = os.openpty()
    port = os.ttyname(s)
    try:
        chip = FakeChip(tmp_path, dump.read_bytes())
        monkeypatch.setattr(boards_cli, "_esptool", chip)
        assert chip.files(0x200000, 0x200000) == user_files
        monkeypatch.setattr(sys, "stdin", open(os.devnull))  # a script: nobody to ask
        rc, out, err = tern(capsys, "flash", "--port", port, "--firmware", full)
        assert rc == 1 and chip.ops == ["read-flash"], (chip.ops, err)  # read, then nothing written
        assert "moves vfs (MicroPython's filesystem) from 0x200000 (2048 KiB) to 0x220000 (1920 KiB)" in err, err
        assert "--layout keep-vfs" in err and "--yes" in err
        assert chip.files(0x200000, 0x200000) == user_files

        rc, out, err = tern(capsys, "flash", "--port", port, "--firmware", full, "--layout", "keep-vfs")
        assert rc == 0 and chip.ops[1:] == ["read-flash", "write-flash"], (chip.ops, err)
        table = from_binary(bytes(chip.flash[0x8000:0x8C00]))
        assert [(p["name"], p["offset"], p["size"]) for p in table] == [
            ("nvs", 0x9000, 0x6000), ("phy_init", 0xF000, 0x1000), ("factory", 0x10000, 0x1D0000),
            ("outbox", 0x1E0000, 0x20000), ("vfs", 0x200000, 0x200000)]
        assert chip.files(0x200000, 0x200000) == user_files  # the files where MicroPython will look
        assert chip.flash[0x10000:0x10000 + APP_SIZE] == full.read_bytes()[0x10000:0x10000 + APP_SIZE]
        assert "vfs stays at 0x200000: the files on it are kept" in err, err

        # the board's own dump as the firmware: its app goes in, its (old) filesystem copy is not written back
        before = bytes(chip.flash[0x1E0000:])
        rc, out, err = tern(capsys, "flash", "--port", port, "--firmware", dump, "--layout", "keep-vfs")
        assert rc == 0 and "holds data past the app partition" in err, err
        assert bytes(chip.flash[0x1E0000:]) == before

        chip = FakeChip(tmp_path, dump.read_bytes())
        monkeypatch.setattr(boards_cli, "_esptool", chip)
        rc, out, err = tern(capsys, "flash", "--port", port, "--firmware", full, "--yes")
        assert rc == 0 and chip.ops == ["read-flash", "write-flash"], (chip.ops, err)
        assert bytes(chip.flash[0x8000:0x8C00]) == profile_table(load_profile("esp32-generic"))[1]
        assert chip.files(0x220000, 0x1E0000) is None  # as it said: Tern's vfs holds no filesystem yet
        rc, out, err = tern(capsys, "flash", "--port", port, "--firmware", full)  # Tern's table already: no question
        assert rc == 0 and chip.ops[2:] == ["read-flash", "write-flash"] and "differs" not in err, (chip.ops, err)
        chip.flash[:] = b"\xff" * len(chip.flash)  # a new chip
        rc, out, err = tern(capsys, "flash", "--port", port, "--firmware", full)
        assert rc == 0 and "the board's partition table is erased: nothing on it to keep" in err, err

        chip = FakeChip(tmp_path, dump.read_bytes())
        monkeypatch.setattr(boards_cli, "_esptool", chip)
        rc, out, err = tern(capsys, "flash", "--port", port, "--firmware", full, "--layout", "board")
        assert rc == 0 and bytes(chip.flash[0x8000:0x8C00]) == dump.read_bytes()[0x8000:0x8C00]
        assert chip.files(0x200000, 0x200000) == user_files and "outbox in files on vfs (FileStore)" in err
    finally:
        os.close(m)
        os.close(s)


def test_tern_flash_asks_at_a_terminal_and_plans_a_dry_run_against_a_given_table(tmp_path, capsys):
    from ternlab.boards.flash import _confirm

    said = []
    assert not _confirm("it moves vfs", False, ask=lambda q: said.append(q) or "no")
    assert _confirm("it moves vfs", False, ask=lambda q: "yes") and _confirm("x", True, ask=None)
    assert "lose those files" in said[0]
    dump = stock_micropython_flash(tmp_path)
    app = tmp_path / "micropython.bin"
    app.write_bytes(esp_image("esp32", APP_SIZE, app=True))
    (cmd,), err, kept = flash_dry_run(capsys, app, "esp32-generic", "--board-table", dump, "--layout", "keep-vfs")
    try:
        table = from_binary((kept / "partitions.bin").read_bytes())
        assert [p["name"] for p in table] == ["nvs", "phy_init", "factory", "outbox", "vfs"]
        assert cmd[cmd.index("write-flash") + 2:] == ["0x10000", str(app), "0x8000", str(kept / "partitions.bin")]
    finally:
        __import__("shutil").rmtree(kept)
    (cmd,), err, kept = flash_dry_run(capsys, app, "esp32-generic", "--board-table", dump)
    __import__("shutil").rmtree(kept)
    assert "moves vfs" in err  # a dry run says it too, and runs nothing
    big = tmp_path / "big.bin"
    big.write_bytes(esp_image("esp32", 0x1E0000, app=True))
    rc, out, err = tern(capsys, "flash", "--port", "/dev/null", "--firmware", big, "--dry-run", "--board-table", dump,
                        "--layout", "keep-vfs")
    assert rc == 1 and "factory partition would shrink to 1856 KiB, and the app is 1920 KiB" in err, err
    rc, out, err = tern(capsys, "flash", "--port", "/dev/null", "--firmware", app, "--dry-run", "--layout", "keep-vfs")
    assert rc == 1 and "--board-table FILE" in err, err


# -- tern deploy, tern board run, tern repl ---------------------------------------------
def test_tern_deploy_compiles_and_copies_to_a_board_port(tmp_path, capsys):
    board = EmulatedBoard("unix-emulated", workdir=tmp_path / "b")
    try:
        board.write_file("stale.txt", "x")
        board.mkdir("lib")
        board.mkdir("lib/tern")
        board.write_file("lib/tern/message.py", "raise ImportError('the stale source was imported')\n")
        board.disconnect()
        cfg = tmp_path / "cfg.json"
        cfg.write_text('{"host": "127.0.0.1", "port": 1}')
        ca = tmp_path / "ca.pem"
        ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
        rc, out, err = tern(capsys, "deploy", "--port", board.port, "--profile", "unix-emulated", "--config", cfg,
                            "--file", ca, "--file", "%s:certs/broker-ca.pem" % ca)
        assert rc == 0, err
        assert "mpy-cross -march=host" in out and "lib/tern/message.mpy" in out
        assert "codec" not in out  # the device set of lib/tern/manifest.py: not the host codec
        files = board.listdir("lib/tern")
        expected = sorted(Path(r).stem + ".mpy" for _, r in device_files())
        assert files == expected  # message.py, the stale source, is gone
        top = board.listdir()
        assert {"main.py", "config.json", "telemetry.mpy", "stale.txt"} <= set(top) and "manifest.mpy" not in top
        assert board.read_file("config.json") == cfg.read_bytes()
        assert board.read_file("ca.pem") == board.read_file("certs/broker-ca.pem") == ca.read_bytes()
        assert board.read_file("main.py") == (device_dir("app") / "main.py").read_bytes()
        assert board.eval("__import__('tern.message').message.__file__") == "/lib/tern/message.mpy"
    finally:
        board.close()
    rc, out, err = tern(capsys, "deploy", "--port", "/dev/nonexistent")
    assert rc == 1 and "no serial port /dev/nonexistent" in err
    rc, out, err = tern(capsys, "deploy", "--emulated", tmp_path / "e", "--config", tmp_path / "nope.json")
    assert rc == 1 and "nope.json does not exist" in err
    rc, out, err = tern(capsys, "deploy", "--emulated", tmp_path / "e", "--file", tmp_path / "no-ca.pem")
    assert rc == 1 and "no-ca.pem does not exist" in err
    rc, out, err = tern(capsys, "deploy", "--port", "/dev/null", "--emulated", tmp_path / "e")
    assert rc == 2 and "not allowed with" in err


def test_tern_deploy_romfs_puts_the_modules_in_the_rom_partition(tmp_path, capsys):
    d = tmp_path / "t"
    ca = tmp_path / "ca.der"
    ca.write_bytes(b"0\x82 not really DER")
    rc, out, err = tern(capsys, "deploy", "--emulated", d, "--create", "--profile", "tight", "--romfs", "--file", "%s:certs/" % ca)
    assert rc == 0, err
    assert "ROMFS image -> /rom" in out and "main.py" in out and "lib/tern/client.mpy" not in out
    assert re.search(r"certs/ca\.der +%d bytes" % len(ca.read_bytes()), out), out  # beside, not in, the ROMFS
    # the deployed main.py starts the app at boot (and it does not fit 32 KiB yet): read the image
    # on a second board with the same ROMFS partition and nothing on its filesystem
    other = tmp_path / "o"
    other.mkdir()
    (other / "romfs.img").write_bytes((d / "romfs.img").read_bytes())
    board = EmulatedBoard("tight", workdir=other)
    try:
        assert board.eval("__import__('tern.message').message.__file__") == "/rom/lib/tern/message.mpy"
    finally:
        board.close()
    rc, out, err = tern(capsys, "deploy", "--emulated", tmp_path / "u", "--create", "--profile", "unix-emulated", "--romfs")
    assert rc == 1 and "profile unix-emulated has no ROMFS partition" in err
    rc, out, err = tern(capsys, "deploy", "--emulated", d, "--romfs", "--source")
    assert rc == 1 and "--romfs holds compiled modules" in err


def test_tern_board_run_gives_the_repl_to_the_terminal_and_keeps_the_flash(tmp_path):
    d = tmp_path / "board"
    env = dict(os.environ)

    def run(keys, *extra):
        r = subprocess.run([TERN, "board", "run", "--profile", "tight", "--dir", str(d), "--create", *extra], input=keys,
                           capture_output=True, timeout=60, env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout.decode(), r.stderr.decode()

    out, err = run(b"f = open('note.txt', 'w'); f.write('kept'); f.close()\rprint(6 * 7, __import__('emuboard').PROFILE['heap_bytes'])\r\x1d")
    assert "42 32768" in out and "Ctrl-] quits" in err and "flash in %s" % d in err
    out, _ = run(b"print(open('note.txt').read())\r\x1d")
    assert "kept" in out  # the same flash image on the next run
    # the folder belongs to one process at a time
    holder = EmulatedBoard("tight", workdir=d)
    try:
        r = subprocess.run([TERN, "repl", "--emulated", str(d)], input=b"\x1d", capture_output=True, timeout=60)
        assert r.returncode == 1 and b"is in use: its flash is held by" in r.stderr  # naming the PIDs
    finally:
        holder.close()


class _Lines:
    """The lines a process prints on one of its pipes, read in a thread; wait(pattern) for one."""

    def __init__(self, pipe):
        import queue
        import threading

        self.lines, self.q = [], queue.Queue()
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe):
        for raw in iter(pipe.readline, b""):
            self.q.put(raw.decode(errors="replace").rstrip("\r\n"))

    def wait(self, pattern, timeout=30):
        import queue
        import time

        end = time.monotonic() + timeout
        for ln in self.lines:
            if re.search(pattern, ln):
                return ln
        while True:
            try:
                ln = self.q.get(timeout=max(end - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError("no line matching %r in %r" % (pattern, self.lines[-20:])) from None
            self.lines.append(ln)
            if re.search(pattern, ln):
                return ln


WRITE_FILES = "for i in range(30):\r f = open('f%d.txt' % i, 'w'); f.write('x' * 100); f.close(); print('wrote', i)\r\r"


def test_tern_board_run_shows_the_power_cut_and_powers_back_on_from_a_key(tmp_path):
    # the cut used to show only in console.log: the terminal went silent, with no key to power back on
    p = subprocess.Popen([TERN, "board", "run", "--dir", str(tmp_path / "b"), "--create", "--cut-at", "12"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = _Lines(p.stdout), _Lines(p.stderr)
    try:
        assert "Ctrl-T p powers the board on" in err.wait("Ctrl-] quits")
        p.stdin.write(WRITE_FILES.encode())
        p.stdin.flush()
        cut = err.wait(r"\[tern\] power cut")
        assert re.search(r"power cut at flash operation 12 \(.*\) -- the board is off: Ctrl-T p powers", cut), cut
        p.stdin.write(b"\x14p")  # Ctrl-T p
        p.stdin.flush()
        err.wait(r"\[tern\] power on$")
        p.stdin.write(b"import os; print(len([n for n in os.listdir() if n.startswith('f')]) > 0, 6 * 7)\r")
        p.stdin.flush()
        out.wait(r"True 42")
        p.stdin.write(b"\x1d")
        p.stdin.flush()
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
        p.wait()


def test_tern_board_run_headless_leaves_the_port_to_mpremote(tmp_path):
    p = subprocess.Popen([TERN, "board", "run", "--headless", "--dir", str(tmp_path / "b"), "--create", "--cut-at", "12"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out = _Lines(p.stdout)
    mpremote = [str(Path(sys.executable).with_name("mpremote")), "connect"]
    try:
        port = re.search(r" on (/dev/pts/\d+), .*headless", out.wait("headless")).group(1)
        # mpremote has the port to itself (resume: no soft reset, which would restart the cut count)
        m = subprocess.Popen(mpremote + [port, "resume", "exec", WRITE_FILES.replace("\r", "\n")],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env=dict(os.environ, PYTHONUNBUFFERED="1"))
        said = _Lines(m.stdout)
        try:
            out.wait(r"^\[tern\] power cut at flash operation 12 ")
            said.wait(r"^wrote 0$")  # what the board printed before the cut reaches mpremote after the cut's notice
        finally:
            m.kill()  # it waits for a board that lost power, as it would for a real one
            m.wait()
        try:
            said.wait(r"^wrote 29", timeout=1)  # all it printed, read to the end: the last file was never written
        except AssertionError:
            pass
        assert not any(ln.startswith("wrote 29") for ln in said.lines), said.lines
        p.stdin.write(b"on\n")
        p.stdin.flush()
        out.wait(r"^\[tern\] power on$")
        r = subprocess.run(mpremote + [port, "resume", "exec", "import os; print(sorted(os.listdir()))"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "'f0.txt'" in r.stdout, r.stdout + r.stderr
        p.stdin.write(b"quit\n")
        p.stdin.flush()
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
        p.wait()


# -- a board's folder: its identity, --create, deploy without the app, config checked ----------------
def test_an_emulated_board_keeps_its_id_with_its_folder(tmp_path, capsys):
    # every run of the same folder drew a new random id, so the firmware's default client id (and its
    # MQTT session and topics) changed while its flash and boot counter carried over
    d = tmp_path / "b"
    ids = []
    for _ in range(2):
        b = EmulatedBoard("tight", workdir=d)
        try:
            ids.append(b.eval("__import__('emuboard').unique_id()"))
        finally:
            b.close()
    assert ids[0] == ids[1] and re.fullmatch(rb"tight-[0-9a-f]{8}", ids[0]), ids
    assert (d / "id").read_text().strip() == ids[0].decode()
    b = EmulatedBoard("tight", workdir=tmp_path / "other")
    try:  # another folder is another device
        assert b.id != ids[0].decode()
    finally:
        b.close()
    b = EmulatedBoard("tight", workdir=d, board_id="sensor-7", power=False)
    b.close()
    b = EmulatedBoard("tight", workdir=d, power=False)  # an id given is kept, as the folder's
    try:
        assert b.id == "sensor-7"
    finally:
        b.close()


def test_a_board_folder_that_does_not_exist_is_an_error_unless_created(tmp_path, capsys):
    missing = tmp_path / "typo"
    r = subprocess.run([TERN, "board", "run", "--dir", str(missing)], input=b"\x1d", capture_output=True, timeout=60)
    assert r.returncode == 1 and b"no emulated board in %s" % bytes(missing) in r.stderr and b"--create" in r.stderr
    rc, out, err = tern(capsys, "deploy", "--emulated", missing)
    assert rc == 1 and "the folder does not exist" in err
    rc, out, err = tern(capsys, "repl", "--emulated", missing)
    assert rc == 1 and "--create" in err
    assert not missing.exists()  # nothing made for a mistyped folder
    r = subprocess.run([TERN, "board", "run", "--profile", "tight", "--dir", str(missing), "--create"],
                       input=b"print(6 * 7)\r\x1d", capture_output=True, timeout=60)
    assert r.returncode == 0 and b"42" in r.stdout, r.stderr
    assert (missing / "flash.img").is_file()
    # with no --dir, the profile's board lives in the user's data folder, not the working directory
    home = tmp_path / "data"
    r = subprocess.run([TERN, "board", "run", "--profile", "tight"], input=b"\x1d", capture_output=True, timeout=60,
                       cwd=tmp_path, env=dict(os.environ, XDG_DATA_HOME=str(home)))
    assert r.returncode == 0 and (home / "tern/boards/tight/flash.img").is_file(), r.stderr
    assert not (tmp_path / "tern-boards").exists()


def test_tern_deploy_does_not_run_the_app(tmp_path, capsys):
    # deploying booted the board as a power-on does: its main.py ran (spent a boot, published) first
    app = tmp_path / "app"
    app.mkdir()
    (app / "main.py").write_text("print('the app ran')\n")
    d = tmp_path / "b"
    for _ in range(2):  # the second deploy boots a board with the first one's main.py on it
        rc, out, err = tern(capsys, "deploy", "--emulated", d, "--create", "--profile", "unix-emulated", "--app", app)
        assert rc == 0, err
    log = (d / "console.log").read_text()
    assert "main.py not run" in log and "the app ran" not in log
    b = EmulatedBoard("unix-emulated", workdir=d)  # a power-on runs it
    try:
        b.wait_for("the app ran", timeout=20)
    finally:
        b.close()


@pytest.mark.parametrize("text, message", [
    ('{"host": "b",\n "port": 1883\n "qos": 1}', "line 3 column 2: not valid JSON: Expecting ',' delimiter. "
     "MicroPython's json skips commas and colons, so the board would read it as {\"host\": \"b\", \"port\": 1883, "
     "\"qos\": 1}"),
    ('{"host": "b", "password": "hunter2", "user"}', '{"host": "b", "password": "***"}'),  # "user" vanished
    ('{"host": "b",\n "port": [1883}', "line 2 column 15: not valid JSON: Expecting ',' delimiter (MicroPython's "
     "json cannot read it either: the board would say so and run on defaults, with no broker)"),
    ('{"host": "127.0.0.1:18831"}', 'host must be a host name or address without a port: put the port in `port` '
     '(got "127.0.0.1:18831"; write "host": "127.0.0.1", "port": 18831)'),
    ('{"host": "mqtt://broker.lan"}', "host must be a host name or address, not a URL"),
    ('{"hots": "127.0.0.1"}', "unknown key 'hots' (did you mean 'host'?)"),
    ('{"host": "b", "intervall_ms": 100}', "did you mean 'interval_ms'?"),
    ('{"host": "b", "port": 70000}', "port must be an integer in 1..65535 (got 70000)"),
    ('{"host": "b", "qos": 3}', "qos must be 0, 1, 2 or a non-empty list of them"),
    ('{"host": "b", "password": 7, "user": "u"}', "password must be a non-empty string"),
    ('["host"]', "must hold a JSON object"),
])
def test_tern_deploy_checks_the_config_by_the_firmwares_rules_before_copying(tmp_path, capsys, text, message):
    cfg = tmp_path / "config.json"
    cfg.write_text(text)
    d = tmp_path / "b"
    rc, out, err = tern(capsys, "deploy", "--emulated", d, "--create", "--config", cfg)
    assert rc == 1 and err.startswith("tern deploy: ") and message in err, err
    assert "(got 7)" not in err and "hunter2" not in err  # a secret's value is not echoed
    assert not d.exists()  # refused before the board was booted: nothing copied


def test_board_deploy_checks_a_config_dict_and_notes_what_the_firmware_would_say(tmp_path):
    from ternlab.boards.config_check import ConfigError

    b = EmulatedBoard("unix-emulated", workdir=tmp_path / "b")
    try:
        with pytest.raises(ConfigError, match="unknown key 'hots' \\(did you mean 'host'\\?\\)"):
            b.deploy(config={"hots": "x"})
        assert not b.exists("config.json")
        said = []
        done = b.deploy(config={"interval_ms": 100}, say=said.append)
        assert ("config.json", len(b.read_file("config.json"))) in done
        assert any("host: missing: no broker to connect to" in line for line in said), said
    finally:
        b.close()


def test_the_qemu_board_from_the_command_line_deploys_runs_and_reaches_the_broker(tmp_path, capsys, broker):
    """`tern board run --profile qemu-m3-esp32` gives a REPL (it answered "use QemuBoard"); `tern deploy
    --emulated --romfs` puts Tern, the telemetry app and its config on the stock board without running it;
    `tern board run --headless` runs it: the app dials the broker its config names through the board's
    sockets, and its readings arrive under its kept id (--broker joins the link UART, for stream=)."""
    import json

    from tern.client import Client

    d = tmp_path / "mcu"
    r = subprocess.run([TERN, "board", "run", "--profile", "qemu-m3-esp32", "--dir", str(d), "--create"],
                       input=b"print(6 * 7, __import__('sys').platform)\r\x1d", capture_output=True, timeout=120)
    assert r.returncode == 0 and b"42 qemu" in r.stdout, r.stdout + r.stderr
    assert b"link UART to nothing (--broker HOST[:PORT]" in r.stderr
    board_id = (d / "id").read_text().strip()
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"host": broker.host, "port": broker.port, "interval_ms": 200, "count": 2}))
    # the folder knows its profile; --romfs: from .mpy files in /lib the telemetry app does not fit the
    # ESP32's 110,000-byte heap (MemoryError in Client() at boot), in place from ROMFS it does
    rc, out, err = tern(capsys, "deploy", "--emulated", d, "--config", cfg, "--romfs")
    assert rc == 0, err
    assert "qemu-m3-esp32, mpy-cross -march=armv7m" in out and "config.json" in out
    log = (d / "console.log").read_text()
    assert "main.py not run" in log and '"ev":"boot"' not in log.split("main.py not run")[-1]
    got = []
    sub = Client("cli-observer", server=broker.host, port=broker.port)
    dev = board_id  # the firmware's device id: its board's id, kept in the folder (PROFILE-<8 hex>)
    assert re.fullmatch(r"qemu-m3-esp32-[0-9a-f]{8}", dev), dev
    sub.subscribe("tern/%s/telemetry" % dev, qos=1, handler=lambda m: got.append(json.loads(bytes(m.payload))))
    sub.connect()
    p = subprocess.Popen([TERN, "board", "run", "--headless", "--dir", str(d), "--broker", "%s:%d" % broker.address],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out = _Lines(p.stdout)
    try:
        assert "link UART to %s:%d" % broker.address in out.wait("headless", timeout=120)
        import time

        end = time.monotonic() + 90
        while len(got) < 2 and time.monotonic() < end:
            sub.loop(100)
        assert [(m["d"], m["s"]) for m in got] == [(dev, 0), (dev, 1)], got
        p.stdin.write(b"quit\n")
        p.stdin.flush()
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        sub.disconnect()
    rc, out, err = tern(capsys, "board", "run", "--dir", d, "--broker", "localhost:99999")
    assert rc == 2 and "'localhost:99999' is not HOST[:PORT]" in err
    rc, out, err = tern(capsys, "board", "run", "--dir", d, "--host-path", tmp_path)
    assert rc == 1 and "--host-path mounts host folders on a unix-port board" in err


def test_errors_name_the_command_to_use_not_a_python_class(tmp_path, capsys):
    # "use SerialBoard" told a command-line user about a Python class
    rc, out, err = tern(capsys, "board", "run", "--profile", "esp32-generic", "--dir", tmp_path / "x", "--create")
    assert rc == 1 and "give its serial port (tern deploy/repl --port PORT" in err and "use SerialBoard" not in err
    with pytest.raises(ValueError, match="tern board run --profile qemu-m3-esp32 and pytest --board-profile"):
        EmulatedBoard("qemu-m3-esp32", workdir=tmp_path / "y")
