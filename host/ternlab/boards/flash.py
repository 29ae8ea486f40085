"""`tern flash`: a MicroPython image and a partition table onto an ESP32, with esptool.

What kind of image it is (ternlab.boards.esp_image) says where it goes; which table is written
(ternlab.boards.flash_layout) is judged against the table the board holds, read first.
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path


def _fail(msg):
    sys.stderr.write("tern flash: %s\n" % msg)
    return 1


def flash_commands(args, outdir, board=None, precheck=False):
    """(esptool command lines, notes, warning) of `tern flash`, inputs checked. board: the bytes of the
    partition table the board holds (None: not read; precheck: not read yet, the layout is judged
    once it is). warning: what writing would destroy (the files on vfs), for the user to confirm.
    The files the commands write are put in outdir: the partition table (or --table-out), and for a
    combined or full-flash image a copy of it with that table in place of its own (one write, no
    window with the image's own table on the chip), cut after the app: nothing is written past the
    app partition of the table written (the "does not fit" check below)."""
    from .board import load_profile
    from .esp_image import ImageError, chip_def, classify
    from .flash_layout import board_table, choose
    from .partitions import TABLE_OFFSET, TYPES, PartitionError, profile_table

    prof = load_profile(args.profile)
    if prof.get("platform") != "esp32" or not prof.get("partitions"):
        raise ValueError("profile %s is not an ESP32 board: tern flash writes ESP32 images with esptool" % prof["name"])
    fw = Path(args.firmware)
    if not fw.is_file():
        raise ValueError("firmware file %s does not exist" % fw)
    if not args.dry_run and not os.path.exists(args.port):
        raise ValueError("no serial port %s" % args.port)
    if not 9600 <= args.baud <= 4000000:
        raise ValueError("--baud %d is out of range (9600..4000000)" % args.baud)
    if args.erase and args.erase_outbox:
        raise ValueError("--erase already erases the outbox partition with the rest: give one of them")
    if args.erase and args.layout != "tern":
        raise ValueError("--erase erases the whole flash, vfs with it: --layout %s has nothing to keep" % args.layout)
    tern_parts, _ = profile_table(prof)
    data = fw.read_bytes()
    app = next(p for p in tern_parts if p["type"] == TYPES["app"])
    try:
        kind, base, app_at = classify(data, prof["chip"], str(fw), TABLE_OFFSET, app["offset"])
    except ImageError as e:
        raise ValueError(str(e)) from None
    end = len(data) if base is None else app["offset"] + app["size"] - base  # the file up to the app partition's end
    body = data[:end].rstrip(b"\xff")
    app_len = max(len(body) - app_at, 0)
    try:
        theirs = None if board is None else board_table(board)
    except PartitionError as e:
        theirs = None
        notes = ["the board's partition table cannot be read (%s): it is replaced" % e]
    else:
        notes = []
    ob = prof["flash"].get("outbox")
    layout = "tern" if precheck else args.layout
    parts, said, warning = choose(layout, tern_parts, theirs, ob["label"] if ob else None, app_len, args.port)
    notes += said
    app = next(p for p in parts if p["type"] == TYPES["app"])
    if app_len > app["size"]:
        raise ValueError("the app in %s is 0x%x bytes: it does not fit the %s partition (0x%x bytes at 0x%x)"
                         % (fw, app_len, app["name"], app["size"], app["offset"]))
    from .partitions import to_binary

    table = to_binary(parts)
    outdir = Path(outdir)
    table_path = Path(args.table_out) if args.table_out else outdir / "partitions.bin"
    table_path.write_bytes(table)
    if kind == "app":
        pairs = ["0x%x" % app["offset"], str(fw), "0x%x" % TABLE_OFFSET, str(table_path)]
        notes.append("%s is an app image: written to the %s partition at 0x%x, the partition table at 0x%x; the "
                     "bootloader already on the chip is kept (a blank chip needs a combined image)"
                     % (fw, app["name"], app["offset"], TABLE_OFFSET))
    else:
        image = bytearray(body + b"\xff" * (-len(body) % 0x1000))  # whole sectors: what esptool erases anyway
        at = TABLE_OFFSET - base
        image[at:at + len(table)] = table
        out = outdir / (fw.stem + "-tern-table.bin")
        out.write_bytes(bytes(image))
        pairs = ["0x%x" % base, str(out)]
        what = ("a combined image (bootloader, partition table, app)" if kind == "combined" else
                "a full-flash image (from address 0: bootloader at 0x%x, partition table, app)"
                % chip_def(prof["chip"]).BOOTLOADER_FLASH_OFFSET)
        notes.append("%s is %s: written at 0x%x as %s, a copy with the %s partition table in place of its own"
                     % (fw, what, base, out, "chosen" if args.layout != "tern" else prof["name"]))
        rest = data[end:]
        if rest.strip(b"\xff"):
            notes.append("%s holds data past the app partition (0x%x bytes from 0x%x: a flash dump's other "
                         "partitions, laid out by its own table): not written; the board's outbox and filesystem "
                         "are kept (esptool write-flash 0x0 %s would restore the dump as it is, its table with it)"
                         % (fw, len(rest), base + end, fw))
        elif rest:
            notes.append("the 0xff fill after the app (to 0x%x) is not written: the board's outbox and filesystem "
                         "are kept" % (base + len(data)))
    base_cmd = [sys.executable, "-m", "esptool", "--chip", prof["chip"], "--port", args.port, "--baud", str(args.baud)]
    cmds = []
    obp = next((p for p in parts if ob and p["name"] == ob["label"]), None)
    if args.erase:
        cmds.append(base_cmd + ["erase-flash"])
        notes.append("--erase: the whole flash is erased, the outbox partition with it (messages not yet "
                     "delivered are lost), and the files on vfs")
    elif args.erase_outbox and obp is not None:
        cmds.append(base_cmd + ["erase-region", "0x%x" % obp["offset"], "0x%x" % obp["size"]])
        notes.append("--erase-outbox: the %s partition (0x%x, %d KiB) is erased: messages not yet delivered "
                     "are lost" % (obp["name"], obp["offset"], obp["size"] >> 10))
    elif obp is not None:
        notes.append("the %s partition (0x%x, %d KiB) is kept: messages not yet delivered survive the flash "
                     "(--erase-outbox empties it)" % (obp["name"], obp["offset"], obp["size"] >> 10))
    cmds.append(base_cmd + ["write-flash", "-z"] + pairs)
    return cmds, notes, warning


def _esptool(cmd):
    """Run one esptool command line; its exit status. (Tests put a model of the chip here: there is no
    ESP32 on the machine that runs them.)"""
    return subprocess.call(cmd)


def _read_board_table(args, outdir):
    """The board's partition table bytes: --board-table's file, else read from the chip with esptool
    (a read: nothing is written); None in a dry run or with --erase (nothing on the chip to keep)."""
    if args.board_table:
        p = Path(args.board_table)
        if not p.is_file():
            raise ValueError("--board-table %s does not exist" % p)
        return p.read_bytes()
    if args.dry_run or args.erase:
        return None
    from .board import load_profile
    from .partitions import MAX_LEN, TABLE_OFFSET

    out = Path(outdir) / "board-table.bin"
    prof = load_profile(args.profile)
    cmd = [sys.executable, "-m", "esptool", "--chip", prof["chip"], "--port", args.port, "--baud", str(args.baud),
           "read-flash", "0x%x" % TABLE_OFFSET, "0x%x" % MAX_LEN, str(out)]
    print("tern flash: " + __import__("shlex").join(cmd), flush=True)
    rc = _esptool(cmd)
    if rc or not out.is_file():
        raise ValueError("esptool could not read the board's partition table (exit status %d): is the board "
                         "connected, and free (no terminal open on %s)?" % (rc, args.port))
    return out.read_bytes()


def _confirm(warning, yes, ask=None):
    """True when the user lets the write go ahead: --yes, or "yes" typed at a terminal."""
    if yes:
        return True
    if ask is None:
        if not sys.stdin.isatty():
            return False
        ask = input
    sys.stderr.write("tern flash: %s\n" % warning)
    try:
        return ask("tern flash: write Tern's table and lose those files? [yes/no] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False


def cmd_flash(args):
    """Run the esptool commands; with --dry-run print them, one a line, each ready to paste into a
    shell (quoted with shlex; the files they write are kept: --table-out, else a temporary folder)."""
    import shlex
    import shutil

    keep = args.dry_run
    outdir = tempfile.mkdtemp(prefix="tern-flash-")
    try:
        try:
            flash_commands(args, outdir, precheck=True)  # the image and the options, before the board is touched
            cmds, notes, warning = flash_commands(args, outdir, _read_board_table(args, outdir))
        except ValueError as e:
            keep = False
            return _fail(e)
        for n in notes:
            sys.stderr.write("tern flash: %s\n" % n)
        if args.dry_run:
            if warning:
                sys.stderr.write("tern flash: %s\n" % warning)
            sys.stderr.write("tern flash: the files to write are in %s (kept for these commands)\n" % outdir)
            for cmd in cmds:
                print(shlex.join(cmd))
            return 0
        if warning and not _confirm(warning, args.yes):
            return _fail(warning if not sys.stdin.isatty() else "nothing written")
        for cmd in cmds:
            print("tern flash: " + shlex.join(cmd), flush=True)
            rc = _esptool(cmd)
            if rc:
                return _fail("esptool failed (exit status %d)" % rc)
        return 0
    finally:
        if not keep:
            shutil.rmtree(outdir, ignore_errors=True)
