"""Firmware images for the qemu-m3 board: MicroPython v1.28.0's qemu port (Arm Cortex-M3, board
MPS2_AN385) with Tern and the telemetry app frozen in through device/app/manifest.py.

`build(profile)` returns the path of a firmware.elf for the profile's heap size, building it when
the cache has none for the same content. Steps:
1. the source: ../shared/third_party/micropython-1.28.0-subset.tar.gz beside the project when it is
   there, else a shallow clone of tag v1.28.0; unpacked once into the cache, with the patches of
   device/qemu-firmware/patches applied (`git apply`) and lib/micropython-lib/README.md created (the
   manifest tools need it; the submodule is not part of the subset); mpy-cross built in it;
2. ports/qemu/boards/manifest.py written into that tree: the board's own frozen modules
   (device/emulated/qemu: _boot.py, emuboard.py) and asyncio, what device/app/manifest.py's
   `include("$(PORT_DIR)/boards/manifest.py")` picks up as on any other port;
3. `make -C ports/qemu` with FROZEN_MANIFEST=device/app/manifest.py, MICROPY_HEAP_SIZE from the
   profile, LittleFS (MICROPY_VFS_LFS2=1), asyncio, and the board's C module (device/qemu-firmware/cmodules:
   NOR flash, link UART, host files) in a fresh build directory (a frozen build after a flag change
   needs one).

Images are cached under build/firmware (or $TERN_FIRMWARE_CACHE) by a hash of everything that goes
into them: the source, the patches, the C module, the manifests, the files they freeze
(ternlab.devset.board_files), device/emulated/qemu/, this recipe and the heap size. A lock file makes concurrent builds (pytest workers,
make) wait for each other instead of racing.
"""

import fcntl
import hashlib
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from .boards.board import load_profile
from .paths import CHECKOUT as ROOT  # the build needs a checkout: ../shared beside it
from .devset import board_files
from .paths import device_dir, lib_dir

VERSION = "1.28.0"
TAG = "v1.28.0"
REPO = "https://github.com/micropython/micropython.git"
TARBALL = ROOT.parent / "shared" / "third_party" / f"micropython-{VERSION}-subset.tar.gz"
PATCHES = device_dir("qemu-firmware") / "patches"
CMODULES = device_dir("qemu-firmware") / "cmodules"
DEVICE = device_dir("qemu-board")
MANIFEST = device_dir("app") / "manifest.py"
TOOLS = ("arm-none-eabi-gcc", "qemu-system-arm", "make", "git")


class BuildError(Exception):
    """The firmware could not be built; the message names the step and the tail of its output."""


def cache_dir() -> Path:
    return Path(os.environ.get("TERN_FIRMWARE_CACHE") or ROOT / "build" / "firmware")


def _files(*roots):
    for r in roots:
        if r.is_file():
            yield r
            continue
        for p in sorted(r.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".mpy"):
                yield p


def _hash(paths, extra=""):
    h = hashlib.sha256(extra.encode())
    for p in paths:
        h.update(str(p.relative_to(ROOT)).encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def source_key() -> str:
    src = TARBALL.read_bytes() if TARBALL.is_file() else TAG.encode()
    return _hash(list(_files(PATCHES)), hashlib.sha256(src).hexdigest())


def image_key(heap_bytes: int) -> str:
    frozen = [src for src, _ in board_files()] + [lib_dir() / "tern" / "manifest.py"]  # what the manifest freezes
    return _hash(list(_files(Path(__file__), PATCHES, CMODULES, DEVICE, MANIFEST, *frozen)),
                 "%s heap=%d" % (source_key(), heap_bytes))


def _run(argv, what, cwd=None, env=None):
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-25:])
        raise BuildError("%s failed (exit %d): %s\n%s" % (what, r.returncode, " ".join(map(str, argv)), tail))
    return r.stdout


def _check_tools():
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        raise BuildError("missing programs: %s (run `make setup`: tools/debian-packages.txt lists their packages)"
                         % ", ".join(missing))


def source_tree(log=print) -> Path:
    """The patched MicroPython tree with mpy-cross built (made once per source and patch set)."""
    top = cache_dir() / ("src-" + source_key())
    mp = top / f"micropython-{VERSION}"
    if (top / ".ready").exists():
        return mp
    shutil.rmtree(top, ignore_errors=True)
    top.mkdir(parents=True)
    if TARBALL.is_file():
        log("unpacking %s" % TARBALL)
        with tarfile.open(TARBALL) as t:
            t.extractall(top, filter="data")
    else:
        log("cloning %s %s (no %s)" % (REPO, TAG, TARBALL))
        _run(["git", "clone", "-q", "--depth", "1", "--branch", TAG, REPO, str(mp)], "git clone")
    (mp / "lib" / "micropython-lib").mkdir(parents=True, exist_ok=True)
    (mp / "lib" / "micropython-lib" / "README.md").touch()  # the manifest tools look for it
    for p in sorted(PATCHES.glob("*.patch")):
        log("applying %s" % p.name)
        # outside any git work tree (the cache may sit inside the project's): paths are the tree's
        _run(["git", "--git-dir=/dev/null", "apply", "-p1", str(p)], "applying %s" % p.name, cwd=mp)
    log("building mpy-cross")
    _run(["make", "-C", "mpy-cross", "-j2"], "building mpy-cross", cwd=mp)
    (top / ".ready").touch()
    return mp


def build(profile="qemu-m3-esp32", log=print, force=False) -> Path:
    """The firmware.elf for a qemu-m3 profile (name or dict), from the cache or built now."""
    prof = profile if isinstance(profile, dict) else load_profile(profile)
    if prof.get("kind") != "qemu-m3":
        raise BuildError("profile %s is not a qemu-m3 board (its \"kind\" is %r)" % (prof["name"], prof.get("kind")))
    heap = prof["heap_bytes"]
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = cache / ("img-" + image_key(heap))
        elf = out / "firmware.elf"
        if elf.is_file() and not force:
            return elf
        _check_tools()
        mp = source_tree(log)
        (mp / "ports" / "qemu" / "boards" / "manifest.py").write_text(
            "# written by ternlab.firmware: the qemu-m3 board's frozen modules\n"
            "include(\"$(MPY_DIR)/extmod/asyncio\")\n"
            "freeze(%r, (\"_boot.py\", \"emuboard.py\"))\n" % str(DEVICE))
        obj = cache / ("obj-" + out.name[4:])
        shutil.rmtree(obj, ignore_errors=True)
        log("building the qemu port for %s (heap %d bytes)" % (prof["name"], heap))
        _run(["make", "-C", "ports/qemu", "-j2", "BOARD=MPS2_AN385", "BUILD=%s" % obj,
              "FROZEN_MANIFEST=%s" % MANIFEST, "MICROPY_HEAP_SIZE=%d" % heap, "MICROPY_VFS_LFS2=1",
              "USER_C_MODULES=%s" % CMODULES, "CFLAGS_EXTRA=-DMICROPY_PY_ASYNCIO=1"], "building the qemu port", cwd=mp,
             env=dict(os.environ, GIT_DIR=str(mp / ".no-git")))  # the version is v1.28.0's, not the project's commit
        out.mkdir(exist_ok=True)
        tmp = out / "firmware.elf.tmp"
        shutil.copyfile(obj / "firmware.elf", tmp)
        os.replace(tmp, elf)
        shutil.rmtree(obj, ignore_errors=True)
        log("built %s" % elf)
        _prune(cache, mp.parent)
        return elf


def _prune(cache, src, keep=6):
    # the newest few images stay (one per profile, and the last edit's); older sources go
    imgs = sorted(cache.glob("img-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for p in imgs[keep:] + [d for d in cache.glob("src-*") if d != src]:
        shutil.rmtree(p, ignore_errors=True)


def qemu_profiles():
    """The names of the qemu-m3 board profiles (boards/qemu-m3-*)."""
    from .boards.board import profile_names

    return [n for n in profile_names() if load_profile(n).get("kind") == "qemu-m3"]


def add_subcommands(sub):
    p = sub.add_parser("firmware", help="build the qemu-m3 board's firmware (Tern frozen into MicroPython)",
                       description="Firmware images for the emulated Cortex-M3 board (see docs/app.md).")
    fsub = p.add_subparsers(title="firmware commands", metavar="ACTION", dest="firmware_action")
    b = fsub.add_parser("build", help="build (or take from the cache) the firmware of qemu-m3 profiles")
    b.add_argument("--board", default="qemu-m3", metavar="NAME",
                   help="a qemu-m3 profile (qemu-m3-esp32, qemu-m3-rp2, qemu-m3-tight) or qemu-m3 for all of them")
    b.add_argument("--force", action="store_true", help="build again even when the cache has the image")
    b.set_defaults(func=cmd_build)
    p.set_defaults(func=lambda a: (p.print_usage(), 2)[1])


def cmd_build(args):
    import sys

    try:
        names = qemu_profiles() if args.board == "qemu-m3" else [args.board]
        for n in names:
            print("%s: %s" % (n, build(n, log=lambda s: print("  " + s, file=sys.stderr), force=args.force)))
    except (BuildError, ValueError) as e:
        print("tern firmware build: %s" % e, file=sys.stderr)
        return 1
    return 0
