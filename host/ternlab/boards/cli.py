"""`tern board run`, `tern deploy`, `tern flash`, `tern repl`: boards from the command line.

  tern board run [--profile unix-emulated] [--dir DIR]   an emulated board in the foreground, its
                                                          REPL on this terminal (Ctrl-] quits)
  tern deploy (--port PORT | --emulated DIR) [--config F] compile lib/tern's device set and firmware/
              [--app APPDIR]                              (or your APPDIR) with mpy-cross and copy
                                                          them (mpremote's transport)
  tern flash --port PORT --firmware FILE [--profile P]    esptool: the MicroPython image plus the
                                                          profile's partition table (outbox partition)
  tern repl (--port PORT | --emulated DIR)                a terminal on a board's REPL

An emulated board's DIR (default tern-boards/PROFILE under the current directory) keeps its flash
image between runs, so `tern deploy --emulated DIR` then `tern board run --dir DIR` boots what was
deployed.
"""

import os
import select
import subprocess
import sys
import tempfile
import termios
import tty
from pathlib import Path

QUIT = b"\x1d"  # Ctrl-]


def _profile_arg(p, default):
    p.add_argument("--profile", default=default, metavar="NAME",
                   help="board profile (boards/NAME/profile.json; default %s)" % default)


def add_subcommands(sub):
    p = sub.add_parser("board", help="run an emulated board", description="Emulated boards.")
    bsub = p.add_subparsers(title="board commands", metavar="ACTION", dest="board_action")
    r = bsub.add_parser("run", help="an emulated board in the foreground, its REPL on this terminal")
    _profile_arg(r, "unix-emulated")
    r.add_argument("--dir", help="the board's folder (flash image, console.log); default tern-boards/PROFILE")
    r.add_argument("--id", help="board id (emuboard.unique_id()); default PROFILE-<random>")
    r.add_argument("--host-path", action="append", default=[], metavar="DIR",
                   help="host folder mounted on the board at /hostN and put on sys.path (repeatable)")
    r.add_argument("--cut-at", type=int, default=0, metavar="N", help="power fails at the N-th flash operation")
    r.add_argument("--seed", type=int, default=1, help="seed of the torn write (with --cut-at)")
    r.set_defaults(func=cmd_board_run)
    p.set_defaults(func=lambda a: (p.print_usage(sys.stderr), 2)[1])

    d = sub.add_parser("deploy", help="compile lib/tern and firmware/ with mpy-cross and copy them to a board")
    _target_args(d)
    d.add_argument("--config", metavar="FILE", help="copied to the board as config.json")
    d.add_argument("--file", action="append", default=[], metavar="LOCAL[:REMOTE]",
                   help="also copy this file as it is (repeatable), e.g. --file ca.pem for the firmware's TLS CA")
    d.add_argument("--app", metavar="DIR", help="your app folder instead of the telemetry firmware (its .py "
                   "files compiled, main.py and boot.py kept source, other files copied)")
    d.add_argument("--source", action="store_true", help="copy .py sources instead of compiling")
    d.add_argument("--romfs", action="store_true",
                   help="put the compiled modules in the board's ROMFS partition (run in place, off the heap)")
    d.set_defaults(func=cmd_deploy)

    f = sub.add_parser("flash", help="write a MicroPython image and the profile's partition table (esptool)")
    f.add_argument("--port", required=True, help="the board's serial port")
    f.add_argument("--firmware", required=True, metavar="FILE", help="the MicroPython image (.bin) to write")
    _profile_arg(f, "esp32-generic")
    f.add_argument("--baud", type=int, default=460800)
    f.add_argument("--erase", action="store_true", help="erase the whole flash first")
    f.add_argument("--table-out", metavar="FILE", help="also save the generated partition table here")
    f.add_argument("--dry-run", action="store_true", help="check and print the esptool commands, run nothing")
    f.set_defaults(func=cmd_flash)

    q = sub.add_parser("repl", help="a terminal on a board's REPL")
    _target_args(q)
    q.set_defaults(func=cmd_repl)


def _target_args(p):
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--port", help="a real board's serial port (or any board's pty)")
    g.add_argument("--emulated", metavar="DIR", help="the folder of an emulated board (booted for this command)")
    _profile_arg(p, None)


def _fail(cmd, msg):
    sys.stderr.write("tern %s: %s\n" % (cmd, msg))
    return 1


def _emulated(args, dir_, echo=None):
    from . import BoardError
    from .emulated import EmulatedBoard

    name = args.profile
    cfg = Path(dir_) / "board.json"
    if name is None and cfg.is_file():
        import json

        try:
            name = json.loads(cfg.read_text())["profile"]["name"]
        except (ValueError, KeyError):
            name = None
    try:
        return EmulatedBoard(name or "unix-emulated", workdir=dir_, board_id=getattr(args, "id", None),
                             host_paths=getattr(args, "host_path", ()), echo=echo,
                             cut_at=getattr(args, "cut_at", 0), seed=getattr(args, "seed", 1))
    except (BoardError, ValueError) as e:
        raise SystemExit("tern: %s" % e) from None


# -- terminal ------------------------------------------------------------------
def terminal(port, inp=None, out=None):
    """Relay this terminal and a board's port until Ctrl-] (or the end of a non-tty stdin)."""
    inp = sys.stdin.fileno() if inp is None else inp
    out = sys.stdout.buffer if out is None else out
    fd = os.open(port, os.O_RDWR | os.O_NOCTTY)
    tty.setraw(fd)
    saved = None
    if os.isatty(inp):
        saved = termios.tcgetattr(inp)
        tty.setraw(inp)
    eof_at = None
    try:
        while True:
            r, _, _ = select.select([fd] + ([inp] if eof_at is None else []), [], [], 0.1)
            if fd in r:
                data = os.read(fd, 4096)
                out.write(data)
                out.flush()
            elif eof_at is not None:
                return 0  # stdin ended and the board went quiet
            if inp in r:
                data = os.read(inp, 1024)
                if not data:
                    eof_at = True
                    continue
                if QUIT in data:
                    os.write(fd, data[: data.index(QUIT)])
                    _settle(fd, out)
                    return 0
                os.write(fd, data)
    finally:
        if saved is not None:
            termios.tcsetattr(inp, termios.TCSADRAIN, saved)
        os.close(fd)


def _settle(fd, out, quiet=0.3, most=2.0):
    """Show what the board still prints for what was sent just before quitting."""
    import time

    end = time.monotonic() + most
    while time.monotonic() < end:
        r, _, _ = select.select([fd], [], [], quiet)
        if not r:
            return
        out.write(os.read(fd, 4096))
        out.flush()


def cmd_board_run(args):
    dir_ = args.dir or os.path.join("tern-boards", args.profile)
    b = _emulated(args, dir_)
    try:
        sys.stderr.write("tern: board %s (%s) on %s, flash in %s; Ctrl-] quits\r\n" % (b.id, b.name, b.port, b.workdir))
        b.disconnect()
        return terminal(b.port)
    finally:
        b.close()


def cmd_repl(args):
    if args.port:
        if not os.path.exists(args.port):
            return _fail("repl", "no serial port %s" % args.port)
        return subprocess.call([sys.executable, "-m", "mpremote", "connect", args.port, "repl"])
    b = _emulated(args, args.emulated)
    try:
        sys.stderr.write("tern: board %s on %s; Ctrl-] quits\r\n" % (b.id, b.port))
        return terminal(b.port)
    finally:
        b.close()


def cmd_deploy(args):
    from . import BoardError
    from .deploy import deploy, deploy_romfs, plan

    try:
        items = plan(config=args.config, files=args.file, app=args.app)
        if args.port:
            if not os.path.exists(args.port):
                return _fail("deploy", "no serial port %s" % args.port)
            from .serial import SerialBoard

            board = SerialBoard(args.port, profile=args.profile or "esp32-generic")
        else:
            board = _emulated(args, args.emulated)
        try:
            prof = board.profile
            print("tern deploy: %d files to %s (%s, %s)" % (len(items), args.port or board.workdir, prof["name"],
                                                            "source" if args.source else "mpy-cross -march=%s" % (prof["arch"] or "host")))
            if args.romfs:
                if args.source:
                    return _fail("deploy", "--romfs holds compiled modules: it does not go with --source")
                done = deploy_romfs(board, items, arch=prof["arch"])
            else:
                done = deploy(board, items, arch=prof["arch"], source=args.source)
            print("tern deploy: %d files, %d bytes" % (len(done), sum(n for _, n in done)))
        finally:
            board.close()
    except (BoardError, ValueError, OSError) as e:
        return _fail("deploy", e)
    return 0


def flash_commands(args, table_path):
    """The esptool command lines `tern flash` runs (checked inputs)."""
    from . import load_profile
    from .partitions import profile_table

    prof = load_profile(args.profile)
    if prof.get("platform") != "esp32" or not prof.get("partitions"):
        raise ValueError("profile %s is not an ESP32 board: tern flash writes ESP32 images with esptool" % prof["name"])
    fw = Path(args.firmware)
    if not fw.is_file():
        raise ValueError("firmware file %s does not exist" % fw)
    head = fw.read_bytes()[:1]
    if head != b"\xe9":
        raise ValueError("%s is not an ESP32 image (first byte %s, expected 0xe9)" % (fw, head.hex() or "none"))
    if not args.dry_run and not os.path.exists(args.port):
        raise ValueError("no serial port %s" % args.port)
    if not 9600 <= args.baud <= 4000000:
        raise ValueError("--baud %d is out of range (9600..4000000)" % args.baud)
    _, table = profile_table(prof)
    Path(table_path).write_bytes(table)
    base = [sys.executable, "-m", "esptool", "--chip", prof["chip"], "--port", args.port, "--baud", str(args.baud)]
    cmds = []
    if args.erase:
        cmds.append(base + ["erase-flash"])
    cmds.append(base + ["write-flash", "-z", "0x%x" % prof["firmware_offset"], str(fw), "0x8000", str(table_path)])
    return cmds


def cmd_flash(args):
    with tempfile.TemporaryDirectory(prefix="tern-flash-") as tmp:
        table = Path(args.table_out) if args.table_out else Path(tmp) / "partitions.bin"
        try:
            cmds = flash_commands(args, table)
        except ValueError as e:
            return _fail("flash", e)
        for cmd in cmds:
            print("tern flash: " + " ".join(cmd[1:] if cmd[0] == sys.executable else cmd))
            if args.dry_run:
                continue
            rc = subprocess.call(cmd)
            if rc:
                return _fail("flash", "esptool failed (exit status %d)" % rc)
    return 0
