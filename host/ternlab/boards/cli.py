"""`tern board run`, `tern deploy`, `tern flash`, `tern repl`: boards from the command line.

  tern board run [--profile P] [--dir DIR] [--broker H:P] an emulated board in the foreground, its
                                                          REPL on this terminal (Ctrl-] quits; Ctrl-T p
                                                          powers it on or cycles it, Ctrl-T o off);
                                                          --headless leaves the port to mpremote
  tern deploy (--port PORT | --emulated DIR) [--config F] compile lib/tern's device set and firmware/app/
              [--app APPDIR]                              (or your APPDIR) with mpy-cross and copy
                                                          them (mpremote's transport); config checked
  tern flash --port PORT --firmware FILE [--profile P]    esptool: a combined, full-flash or app image,
                                                          each at its place, with the profile's partition
                                                          table; one that would move the board's
                                                          filesystem asks first (--layout keep-vfs keeps it)
  tern repl (--port PORT | --emulated DIR)                a terminal on a board's REPL

Emulated boards are of either kind: the unix port (unix-emulated, tight) or MicroPython's firmware
under QEMU (qemu-*: a Cortex-M3 or a RISC-V core; its sockets reach the host's loopback, its link UART
--broker). An emulated board's DIR keeps its flash image and its id between runs (default
$XDG_DATA_HOME/tern/boards/PROFILE), so `tern deploy --emulated DIR` then `tern board run --dir DIR`
boots what was deployed, as the same device; a DIR that does not exist is an error unless --create.
The board dies with the command: SIGHUP (a terminal closing) and SIGTERM power it off and end the
command, and the emulator is killed with the command however it ends (ternlab.boards.spawn).
"""

import functools
import os
import select
import signal
import subprocess
import sys
import termios
import tty
from pathlib import Path

QUIT = b"\x1d"  # Ctrl-]
MENU = b"\x14"  # Ctrl-T, then a power key (as miniterm's menu character)
POWER_KEYS = "Ctrl-T p powers the board on (or cycles it), Ctrl-T o cuts it, Ctrl-] quits"


def _ends_on_hangup(cmd):
    """A command whose board dies with it: SIGHUP (its terminal closed) and SIGTERM end it as Ctrl-] or
    the end of its work would (SystemExit: the board is closed on the way out, its emulator killed)."""

    @functools.wraps(cmd)
    def run(args):
        def end(sig, frame):
            raise SystemExit(128 + sig)

        old = {s: signal.signal(s, end) for s in (signal.SIGHUP, signal.SIGTERM)}
        try:
            return cmd(args)
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    return run


def _profile_arg(p, default):
    """--profile; default: a profile name, or a sentence saying what is used without one."""
    p.add_argument("--profile", default=default if " " not in default else None, metavar="NAME",
                   help="board profile (boards/NAME/profile.json; default %s)" % default)


def add_subcommands(sub):
    p = sub.add_parser("board", help="run an emulated board", description="Emulated boards.")
    bsub = p.add_subparsers(title="board commands", metavar="ACTION", dest="board_action")
    r = bsub.add_parser("run", help="an emulated board in the foreground, its REPL on this terminal")
    _profile_arg(r, "the one the folder's board last ran, else unix-emulated")
    r.add_argument("--dir", help="the board's folder (flash image, id, console.log); default "
                   "$XDG_DATA_HOME/tern/boards/PROFILE (~/.local/share/tern/boards/PROFILE)")
    _create_arg(r)
    r.add_argument("--id", help="board id (emuboard.unique_id()), kept in the folder; default: the folder's, "
                   "else PROFILE-<random> drawn once")
    r.add_argument("--host-path", action="append", default=[], metavar="DIR",
                   help="host folder mounted on the board at /hostN and put on sys.path (repeatable; unix-port "
                        "boards)")
    _broker_arg(r)
    r.add_argument("--cut-at", type=int, default=0, metavar="N", help="power fails at the N-th flash operation")
    r.add_argument("--seed", type=int, default=1, help="seed of the torn write (with --cut-at)")
    r.add_argument("--headless", action="store_true",
                   help="do not open the port: print it and the board's power events, and leave it to "
                        "mpremote or a test; power commands on stdin (on, off, cycle, quit), Ctrl-C stops")
    r.set_defaults(func=_ends_on_hangup(cmd_board_run))
    p.set_defaults(func=lambda a: (p.print_usage(sys.stderr), 2)[1])

    d = sub.add_parser("deploy", help="compile lib/tern's device set and the telemetry app (firmware/app) with mpy-cross and copy them to a board")
    _target_args(d)
    d.add_argument("--config", metavar="FILE", help="copied to the board as config.json")
    d.add_argument("--file", action="append", default=[], metavar="LOCAL[:REMOTE]",
                   help="also copy this file as it is (repeatable), e.g. --file ca.pem for the firmware's TLS CA")
    d.add_argument("--app", metavar="DIR", help="your app folder instead of the telemetry app (its .py "
                   "files compiled, main.py and boot.py kept source, other files copied)")
    d.add_argument("--source", action="store_true", help="copy .py sources instead of compiling")
    d.add_argument("--romfs", action="store_true",
                   help="put the compiled modules in the board's ROMFS partition (run in place, off the heap)")
    d.set_defaults(func=_ends_on_hangup(cmd_deploy))

    f = sub.add_parser("flash", help="write a MicroPython image and the profile's partition table (esptool)")
    f.add_argument("--port", required=True, help="the board's serial port")
    f.add_argument("--firmware", required=True, metavar="FILE", help="the MicroPython image (.bin) to write")
    _profile_arg(f, "esp32-generic")
    f.add_argument("--baud", type=int, default=460800, help="esptool's serial speed (default 460800)")
    g = f.add_mutually_exclusive_group()
    g.add_argument("--erase", action="store_true", help="erase the whole flash first (the outbox partition "
                   "and its undelivered messages too)")
    g.add_argument("--erase-outbox", action="store_true", help="erase the outbox partition (undelivered "
                   "messages are lost); by default it is kept")
    f.add_argument("--layout", choices=("tern", "keep-vfs", "board"), default="tern",
                   help="the partition table to write: tern (the profile's, default), keep-vfs (the board's own with "
                        "the outbox taken from the end of its app partition: a stock MicroPython filesystem stays "
                        "where it is), board (the board's own as it is: the outbox in files on vfs)")
    f.add_argument("--yes", action="store_true", help="write even when the new table moves the board's filesystem "
                   "(its files are lost): for scripts; at a terminal tern flash asks")
    f.add_argument("--board-table", metavar="FILE", help="the board's partition table as read before (esptool "
                   "read-flash 0x8000 0xc00 FILE, or a flash dump) instead of reading it from the chip; what "
                   "--dry-run judges the layout against")
    f.add_argument("--table-out", metavar="FILE", help="also save the generated partition table here")
    f.add_argument("--dry-run", action="store_true", help="check, write the partition table and print the esptool commands (ready to paste into a shell), run nothing")
    f.set_defaults(func=cmd_flash)

    q = sub.add_parser("repl", help="a terminal on a board's REPL")
    _target_args(q)
    q.set_defaults(func=_ends_on_hangup(cmd_repl))


def _target_args(p):
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--port", help="a real board's serial port (or any board's pty)")
    g.add_argument("--emulated", metavar="DIR", help="the folder of an emulated board (booted for this command)")
    _profile_arg(p, "with --emulated the one the folder's board last ran, else unix-emulated; with --port "
                    "esp32-generic")
    _create_arg(p)
    _broker_arg(p)


def _create_arg(p):
    p.add_argument("--create", action="store_true",
                   help="make a new emulated board if its folder does not exist (otherwise an error: a mistyped "
                        "folder would be a new, empty board)")


def _broker_arg(p):
    p.add_argument("--broker", metavar="HOST[:PORT]", type=_address,
                   help="a qemu board's link UART (MQTT over a serial line, stream=) reaches this broker (default "
                        "port 1883); sockets, on either kind of board, dial what the app's own config names")


def _address(text):
    import argparse

    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = text, "1883"
    try:
        n = int(port)
    except ValueError:
        n = 0
    if not host or not 0 < n < 65536:
        raise argparse.ArgumentTypeError("%r is not HOST[:PORT] (a port in 1..65535)" % text)
    return host, n


def _board_dir(args, dir_):
    """The emulated board's folder, which must exist unless --create (or the default folder) says make it."""
    d = Path(dir_)
    if not d.is_dir() and not getattr(args, "create", False):
        raise SystemExit("tern: no emulated board in %s (the folder does not exist): check the path, or add --create "
                         "to make a new board there" % d)
    return d


def _profile_of(args, dir_):
    """--profile, else the profile the board in dir_ last ran (board.json), else unix-emulated."""
    name = args.profile
    cfg = Path(dir_) / "board.json"
    if name is None and cfg.is_file():
        import json

        try:
            name = json.loads(cfg.read_text())["profile"]["name"]
        except (ValueError, KeyError, TypeError):
            name = None
    return name or "unix-emulated"


def _fail(cmd, msg):
    sys.stderr.write("tern %s: %s\n" % (cmd, msg))
    return 1


def _emulated(args, dir_, echo=None, power=True, app=True):
    """The emulated board in dir_: an EmulatedBoard (unix port), or a QemuBoard for a qemu profile, its
    link UART joined to --broker. power: booted (app=False: boot.py only, main.py does not run)."""
    from .board import BoardError, load_profile
    from .emulated import EmulatedBoard

    _board_dir(args, dir_)
    try:
        prof = load_profile(_profile_of(args, dir_))
        if prof.get("kind") == "qemu":
            from .qemu import QemuBoard

            if getattr(args, "host_path", None):
                raise ValueError("--host-path mounts host folders on a unix-port board; %s runs under QEMU "
                                 "(tern deploy copies files to it)" % prof["name"])
            b = QemuBoard(prof, workdir=dir_, board_id=getattr(args, "id", None), echo=echo, power=False,
                          link=getattr(args, "broker", None))
        else:
            b = EmulatedBoard(prof, workdir=dir_, board_id=getattr(args, "id", None),
                              host_paths=getattr(args, "host_path", ()), echo=echo, power=False)
    except (BoardError, ValueError) as e:
        raise SystemExit("tern: %s" % e) from None
    if power:
        try:
            b.power_on(cut_at=getattr(args, "cut_at", 0), seed=getattr(args, "seed", 1), app=app)
        except BoardError as e:
            b.close()
            raise SystemExit("tern: %s" % e) from None
    return b


# -- terminal ------------------------------------------------------------------
def terminal(port, inp=None, out=None, keys=None):
    """Relay this terminal and a board's port until Ctrl-] (or the end of a non-tty stdin).
    keys: callable(byte) for the key typed after Ctrl-T (Ctrl-T twice sends one Ctrl-T)."""
    inp = sys.stdin.fileno() if inp is None else inp
    out = sys.stdout.buffer if out is None else out
    fd = os.open(port, os.O_RDWR | os.O_NOCTTY)
    tty.setraw(fd)
    saved = None
    if os.isatty(inp):
        saved = termios.tcgetattr(inp)
        tty.setraw(inp)
    eof_at = None
    menu = False
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
                if keys is not None:
                    send = bytearray()
                    for b in data:
                        c = bytes((b,))
                        if menu:
                            menu = False
                            if c != MENU:
                                os.write(fd, bytes(send))
                                send.clear()
                                keys(c)
                                continue
                        elif c == MENU:
                            menu = True
                            continue
                        send += c
                    data = bytes(send)
                if QUIT in data:
                    os.write(fd, data[: data.index(QUIT)])
                    _settle(fd, out)
                    return 0
                if data:
                    os.write(fd, data)
    finally:
        if saved is not None:
            try:
                termios.tcsetattr(inp, termios.TCSADRAIN, saved)
            except termios.error:  # the terminal is gone (SIGHUP)
                pass
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


def _power(board, action, say):
    """on, off or cycle an emulated board (a key's or a command's action); say(text) reports."""
    from .board import BoardError

    try:
        if action == "on":
            board.power_on()
        elif action == "cycle":
            board.power_cycle()
        elif action == "off":
            board.power_off()
        else:
            say("unknown power command %r: on, off, cycle, quit" % action)
    except BoardError as e:
        say("power %s: %s" % (action, e))


def _press(board, key, say):
    """The key typed after Ctrl-T: p powers on (a power cycle when on), o cuts the power."""
    if key == b"p":
        _power(board, "cycle" if board.is_on else "on", say)
    elif key == b"o":
        _power(board, "off", say)
    else:
        say("keys: " + POWER_KEYS)


def _boot(args, dir_, echo, say):
    """The board of `tern board run`, powered on; a power cut while it boots (--cut-at N reached during
    boot) leaves it off, as a real board would be, for a power key to bring back."""
    from .board import BoardError

    b = _emulated(args, dir_, echo=echo, power=False)
    try:
        b.power_on(cut_at=args.cut_at, seed=args.seed)
    except BoardError as e:
        events = b.log.texts(kind="event")
        if b.is_on or not events or not events[-1].startswith("power cut"):
            b.close()
            raise SystemExit("tern: %s" % e) from None
        say("the power failed while the board booted")
    return b


def cmd_board_run(args):
    if args.dir:
        dir_ = args.dir
    else:  # the default folder of the profile's board is made on first use
        from ..paths import boards_home

        dir_ = str(boards_home() / (args.profile or "unix-emulated"))
        args.create = True
    if args.headless:
        return _board_headless(args, dir_)

    def say(text):
        sys.stderr.write("\r\n[tern] %s\r\n" % text)
        sys.stderr.flush()

    def event(line):  # the harness's lines (power cut, power on, watchdog...), not the board's output
        if line.kind == "event":
            say(line.text + (" -- the board is off: " + POWER_KEYS if line.text.startswith("power cut") else ""))

    b = _boot(args, dir_, event, say)
    try:
        sys.stderr.write("tern: board %s (%s) on %s, flash in %s%s; %s\r\n" % (b.id, b.name, b.port, b.workdir,
                                                                          _link_note(b, args), POWER_KEYS))
        b.disconnect()
        return terminal(b.port, keys=lambda k: _press(b, k, say))
    finally:
        b.close()


def _link_note(b, args):
    """What a qemu board's link UART reaches ('' for a unix-port board, which has none)."""
    if b.profile.get("kind") != "qemu":
        return ""
    if args.broker:
        return ", link UART to %s:%d" % args.broker
    return ", link UART to nothing (--broker HOST[:PORT] joins it to a broker)"


def _board_headless(args, dir_):
    """The board runs with nobody on its port (mpremote, a test or a terminal opens it); this process
    prints the port and the power events and takes power commands as lines on stdin."""
    import signal
    import threading

    def say(text):
        print("[tern] %s" % text, flush=True)

    b = _boot(args, dir_, lambda line: line.kind == "event" and say(line.text), say)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    try:
        b.disconnect()
        print("tern: board %s (%s) on %s, flash in %s%s; headless: the port is free for mpremote; commands on "
              "stdin: on, off, cycle, quit" % (b.id, b.name, b.port, b.workdir, _link_note(b, args)), flush=True)

        def commands():
            for line in sys.stdin:
                word = line.strip()
                if word == "quit":
                    break
                if word:
                    _power(b, word, say)
            else:
                return  # stdin ended: run on until a signal
            stop.set()

        threading.Thread(target=commands, daemon=True, name="board-commands").start()
        while not stop.wait(0.2):
            pass
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        b.close()


def cmd_flash(args):
    from .flash import cmd_flash  # its own module: esptool's side, the image kinds, the layouts

    return cmd_flash(args)


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
    from .board import BoardError, load_profile
    from .config_check import check
    from .deploy import install, plan

    try:
        if args.port and not os.path.exists(args.port):
            return _fail("deploy", "no serial port %s" % args.port)
        plan(config=args.config, files=args.file, app=args.app)  # every file there, before a board is booted
        if args.romfs and args.source:
            return _fail("deploy", "--romfs holds compiled modules: it does not go with --source")
        name = args.profile or ("esp32-generic" if args.port else None)
        if args.emulated:
            _board_dir(args, args.emulated)
            name = _profile_of(args, args.emulated)
        if args.config:
            check(args.config, load_profile(name))  # a config the board would not run: refused before it boots
        if args.port:
            from .serial import SerialBoard

            board = SerialBoard(args.port, profile=name)
        else:  # booted without its app: deploying does not run main.py (nor spend a boot or publish)
            board = _emulated(args, args.emulated, app=False)
        try:
            prof = board.profile
            print("tern deploy: to %s (%s, %s)" % (args.port or board.workdir, prof["name"],
                                                  "source" if args.source else "mpy-cross -march=%s" % (prof["arch"] or "host")))
            done = install(board, app=args.app, config=args.config, files=args.file, source=args.source,
                           romfs=args.romfs)
            print("tern deploy: %d files, %d bytes" % (len(done), sum(n for _, n in done)))
        finally:
            board.close()
    except (BoardError, ValueError, OSError) as e:
        return _fail("deploy", e)
    return 0
