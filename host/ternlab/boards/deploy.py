"""`tern deploy`: compile the library and the telemetry app with mpy-cross and copy them to a board.

With --romfs the compiled modules go into one ROMFS image instead (deploy_romfs), where their
bytecode runs in place and costs the heap only its objects, as frozen code does.

What goes where on the board's filesystem (ternlab.devset decides what, for every way onto a board):
  lib/tern/*.py          -> /lib/tern/*.mpy   (compiled for the profile's architecture; the device
                                               set of lib/tern/manifest.py: not the host codec)
  the app's modules      -> /*.mpy            (firmware/app/manifest.py's module() lines)
  firmware/app/main.py   -> /main.py          (source: the board runs it by that name)
  --app DIR              -> its files instead of the app's (.py compiled; main.py, boot.py source)
  --config FILE          -> /config.json
The other form of a module (X.py next to a new X.mpy, or the reverse) is removed, since
MicroPython imports X.py before X.mpy. Before copying, the board's .mpy version
(sys.implementation._mpy) is compared with mpy-cross's, so a board on an older
MicroPython gets one clear error instead of ImportErrors at boot.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

from ..devset import APP_MAIN, app_entry, board_files, device_files, mpy_cross, romfs_image
from .errors import BoardError

SOURCE_ONLY = ("main.py", "boot.py")
# board-side snippets: make folders, remove files (neither minds what is already so)
_MKDIRS = "import os\nfor d in %r:\n try:\n  os.mkdir(d)\n except OSError:\n  pass\n"
_REMOVE = "import os\nfor p in %r:\n try:\n  os.remove(p)\n except OSError:\n  pass\n"


def plan(config=None, files=(), app=None):
    """[(local path, remote path without extension change, compile?)]: the device set of the library
    this interpreter imports and the telemetry app (firmware/app), or your app.
    app: a user's app folder instead of the firmware: its .py files compiled (main.py and boot.py
    kept source), its other files copied as they are, subfolders included.
    files: extra files copied as they are, each "LOCAL" (to the board's top folder under its own
    name) or "LOCAL:REMOTE" -- the broker's CA for TLS, for instance."""
    if app is None:
        items = [(p, remote, True) for p, remote in board_files()] + [(app_entry(), APP_MAIN, False)]
    else:
        items = [(p, "lib/" + remote, True) for p, remote in device_files()]
        app = Path(app)
        if not app.is_dir():
            raise BoardError("app folder %s does not exist" % app)
        for p in sorted(app.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".mpy"):
                rel = p.relative_to(app).as_posix()
                items.append((p, rel, p.suffix == ".py" and rel not in SOURCE_ONLY))
    if config:
        c = Path(config)
        if not c.is_file():
            raise BoardError("config file %s does not exist" % c)
        items.append((c, "config.json", False))
    for spec in files:
        local, _, remote = str(spec).partition(":")
        f = Path(local)
        if not f.is_file():
            raise BoardError("file %s does not exist" % f)
        remote = remote.lstrip("/") or f.name
        if remote.endswith("/"):
            remote += f.name
        items.append((f, remote, False))
    return items


def install(board, app=None, config=None, files=(), source=False, romfs=False, say=print):
    """What `tern deploy` does to a board: config (a file, or a dict written as config.json) checked
    first by the firmware's rules (config_check: a config the board would not run is refused before
    anything is copied), then the device set and the telemetry app (or your app) compiled and
    copied, or put in the ROMFS partition (romfs=True). Returns [(remote, bytes)]; the board runs
    them from its next boot."""
    import json

    from .config_check import check

    with tempfile.TemporaryDirectory(prefix="tern-config-") as tmp:
        if isinstance(config, dict):
            path = Path(tmp) / "config.json"
            path.write_text(json.dumps(config, indent=1))
            config = path
        if config is not None:
            if not Path(config).is_file():
                raise BoardError("config file %s does not exist" % config)
            for note in check(config, board.profile):
                say("  note: config.json %s" % note)
        items = plan(config=config, files=files, app=app)
        arch = board.profile["arch"]
        if romfs:
            if source:
                raise BoardError("--romfs holds compiled modules: it does not go with --source")
            return deploy_romfs(board, items, arch=arch, say=say)
        return deploy(board, items, arch=arch, source=source, say=say)


def build(items, arch, outdir):
    """Compile what is to be compiled; returns [(file to send, remote path)]."""
    out = []
    for src, remote, comp in items:
        if comp:
            dst = Path(outdir) / (remote.replace("/", "__")[:-3] + ".mpy")
            try:  # named as imported: lib/tern/client.py is tern/client.py
                mpy_cross(src, dst, remote[4:] if remote.startswith("lib/") else remote, arch)
            except RuntimeError as e:
                raise BoardError(str(e)) from None
            out.append((dst, remote[:-3] + ".mpy"))
        else:
            out.append((src, remote))
    return out


def mpy_version(path):
    """(version, flags) from an .mpy header: b"M", version, flags (arch and sub-version,
    set only when the file holds native code; 0 for bytecode, which any v6.x board loads)."""
    head = Path(path).read_bytes()[:4]
    if head[:1] != b"M":
        raise BoardError("%s is not an .mpy file" % path)
    return head[1], head[2]


def check_board_mpy(board, sample):
    v = board.eval("getattr(__import__('sys').implementation, '_mpy', 0)")
    version, flags = mpy_version(sample)
    if not v:
        return
    if (v & 0xFF) != version or (flags and (flags & 3) != (v >> 8) & 3):
        raise BoardError("the board reads .mpy v%d.%d, mpy-cross writes v%d.%d: update the board's MicroPython "
                         "or deploy sources with --source" % (v & 0xFF, (v >> 8) & 3, version, flags & 3))


def _copy(board, files, say):
    """Write [(local file, remote path)] to the board; returns [(remote, bytes)]."""
    done = []
    for local, remote in files:
        data = Path(local).read_bytes()
        board.write_file(remote, data)
        done.append((remote, len(data)))
        say("  %-28s %7d bytes" % (remote, len(data)))
    return done


def deploy(board, items, arch=None, source=False, say=print):
    """Copy `items` (from plan()) to the board; returns [(remote, bytes)]."""
    with tempfile.TemporaryDirectory(prefix="tern-deploy-") as tmp:
        if source:
            files = [(src, remote) for src, remote, _ in items]
        else:
            files = build(items, arch, tmp)
            mpys = [f for f, r in files if r.endswith(".mpy")]
            if mpys:
                check_board_mpy(board, mpys[0])
        dirs = sorted({r.rsplit("/", 1)[0] for _, r in files if "/" in r})
        twins = []
        for _, r in files:
            if r.endswith(".mpy"):
                twins.append(r[:-4] + ".py")
            elif r.endswith(".py"):
                twins.append(r[:-3] + ".mpy")
        board.exec(_MKDIRS % _parents(dirs) + _REMOVE % twins)
        return _copy(board, files, say)


def deploy_romfs(board, items, arch=None, say=print):
    """Like deploy(), with the compiled modules in the board's ROMFS partition instead of its
    filesystem: one image (romfs_image) holding lib/tern/*.mpy under lib/ and the app's .mpy at its
    top, mounted at /rom (/rom and /rom/lib on sys.path), where .mpy bytecode runs in place, as
    frozen code does, instead of being loaded onto the heap. An emulated board gets the image in its
    ROMFS partition file; a real one through `mpremote romfs deploy` (firmware built with
    MICROPY_VFS_ROM and a ROMFS partition). Sources (main.py, boot.py) and config.json still go to
    the filesystem, and every other copy of the modules there is removed (the current directory
    comes before /rom on sys.path). Takes effect at the next boot. Returns [(remote, bytes)]."""
    with tempfile.TemporaryDirectory(prefix="tern-romfs-") as tmp:
        files = build(items, arch, tmp)
        rom = [(f, r) for f, r in files if r.endswith(".mpy")]
        rest = [(f, r) for f, r in files if not r.endswith(".mpy")]
        image = romfs_image(rom)
        gone = []
        for _, r in rom:
            gone += [r, r[:-4] + ".py"]
        dirs = sorted({r.rsplit("/", 1)[0] for _, r in rest if "/" in r})
        board.exec(_MKDIRS % _parents(dirs) + _REMOVE % gone)
        if hasattr(board, "write_romfs"):
            board.write_romfs(image)
        else:
            img = Path(tmp) / "tern.romfs"
            img.write_bytes(image)
            board.disconnect()  # mpremote opens the port itself
            r = subprocess.run([sys.executable, "-m", "mpremote", "connect", board.port, "romfs", "deploy", str(img)],
                               capture_output=True, text=True)
            if r.returncode:
                raise BoardError("mpremote romfs deploy failed: %s" % (r.stderr or r.stdout).strip().splitlines()[-1:])
        say("  %-28s %7d bytes (%d modules)" % ("ROMFS image -> /rom", len(image), len(rom)))
        return [("/rom", len(image))] + _copy(board, rest, say)


def _parents(dirs):
    out = []
    for d in dirs:
        parts = d.split("/")
        for i in range(1, len(parts) + 1):
            p = "/".join(parts[:i])
            if p not in out:
                out.append(p)
    return out
