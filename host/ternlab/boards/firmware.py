"""Firmware images for the qemu boards: MicroPython v1.28.0's qemu port for an Arm Cortex-M3 (board
MPS2_AN385, qemu-system-arm) or a RISC-V RV32 core (board VIRT_RV32, qemu-system-riscv32: the ESP32-C3's
ISA), with the board's C module (firmware/qemu-firmware/cmodules: NOR flash, ROMFS, link UART, `socket`).

A profile's machine is its "arch" (MACHINES); its firmware is *stock* (the board's own frozen modules,
_boot.py and emuboard.py, and asyncio: nothing of Tern or the app, as on a user's board, so what is
installed in /lib is what is imported) unless it says `"firmware": "frozen"`, which freezes Tern and
the telemetry app in through firmware/app/manifest.py. The heap is not a build constant: the host gives
each boot the profile's (qemu.py, the semihosting command line), so one image serves every profile of
a machine and kind, up to HEAP_MAX bytes.

`build(profile)` returns the path of its firmware.elf, building it when the cache has none for the
same content. Steps:
1. the source: ../shared/third_party/micropython-1.28.0-subset.tar.gz beside the project when it is
   there, else a shallow clone of tag v1.28.0; unpacked once into the cache, with the patches of
   firmware/qemu-firmware/patches applied (`git apply`) and lib/micropython-lib/README.md created (the
   manifest tools need it; the submodule is not part of the subset); mpy-cross built in it;
2. ports/qemu/boards/manifest.py written into that tree: the board's own frozen modules
   (firmware/emulated/qemu) and asyncio, what firmware/app/manifest.py's
   `include("$(PORT_DIR)/boards/manifest.py")` picks up as on any other port;
3. `make -C ports/qemu BOARD=...` with FROZEN_MANIFEST (that manifest, or firmware/app/manifest.py for
   a frozen image), LittleFS (MICROPY_VFS_LFS2=1), asyncio, the C module, in a fresh build directory.

Images are cached under build/firmware (or $TERN_FIRMWARE_CACHE) by a hash of everything that goes
into them: the source, the patches, the C module, the manifests, the files they freeze, this recipe
and the machine. A lock file makes concurrent builds (pytest workers, make) wait for each other.
"""

import fcntl
import hashlib
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from ..paths import CHECKOUT as ROOT  # the build needs a checkout: ../shared beside it
from ..devset import board_files
from ..paths import device_dir, lib_dir
from .board import load_profile

VERSION = "1.28.0"
TAG = "v1.28.0"
REPO = "https://github.com/micropython/micropython.git"
TARBALL = ROOT.parent / "shared" / "third_party" / f"micropython-{VERSION}-subset.tar.gz"
PATCHES = device_dir("qemu-firmware") / "patches"
CMODULES = device_dir("qemu-firmware") / "cmodules"
DEVICE = device_dir("qemu-board")
MANIFEST = device_dir("app") / "manifest.py"
HEAP_MAX = 512 * 1024  # the largest heap a qemu profile may have (the firmware holds it; a boot uses its profile's)
KIND = "qemu"  # the profiles' "kind"


class Machine:
    """What a qemu board's arch builds and runs on: the port's BOARD, its compiler and make options,
    and QEMU's program, machine and options (run), the board's UARTs 1-3 on PCIe or not (pci_uarts)."""

    def __init__(self, board, cc, qemu, machine, make=(), run=(), pci_uarts=False):
        self.board, self.cc, self.qemu, self.machine = board, cc, qemu, machine
        self.make, self.run, self.pci_uarts = tuple(make), tuple(run), pci_uarts


# A profile's "arch" (mpy-cross -march) -> its machine.
MACHINES = {
    "armv7m": Machine("MPS2_AN385", "arm-none-eabi-gcc", "qemu-system-arm", "mps2-an385"),
    # GCC 12 wants zicsr named for csrr; the libraries are picked by -march=rv32imac (no multilib has
    # zicsr in its name), so the compiler's flags say both (the port copies AFLAGS into CFLAGS). The
    # C3 has no atomics (RV32IMC): the core runs without them (a=off); the firmware has none.
    "rv32imc": Machine("VIRT_RV32", "riscv64-unknown-elf-gcc", "qemu-system-riscv32", "virt",
                       ("RV32_ARCH=rv32imac", "AFLAGS=-mabi=ilp32 -march=rv32imac_zicsr"),
                       ("-bios", "none", "-cpu", "rv32,a=off"), pci_uarts=True),
}


class BuildError(Exception):
    """The firmware could not be built; the message names the step and the tail of its output."""


def cache_dir() -> Path:
    return Path(os.environ.get("TERN_FIRMWARE_CACHE") or ROOT / "build" / "firmware")


def machine(prof) -> Machine:
    """The machine a qemu profile runs on (its "arch"); BuildError for any other profile."""
    if prof.get("kind") != KIND:
        raise BuildError("profile %s is not a qemu board (its \"kind\" is %r)" % (prof["name"], prof.get("kind")))
    try:
        return MACHINES[prof["arch"]]
    except KeyError:
        raise BuildError("profile %s: no qemu machine for arch %r (known: %s)"
                         % (prof["name"], prof["arch"], ", ".join(MACHINES))) from None


def frozen(prof) -> bool:
    """Whether the profile's firmware has Tern and the app frozen in (else it is stock)."""
    return prof.get("firmware", "stock") == "frozen"


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


def image_key(arch, frozen_in) -> str:
    m = MACHINES[arch]
    files = [Path(__file__), PATCHES, CMODULES, DEVICE]
    if frozen_in:  # what the app's manifest freezes
        files += [MANIFEST, lib_dir() / "tern" / "manifest.py"] + [src for src, _ in board_files()]
    return _hash(list(_files(*files)), "%s %s %s frozen=%s heap_max=%d"
                 % (source_key(), m.board, " ".join(m.make), frozen_in, HEAP_MAX))


def _run(argv, what, cwd=None, env=None):
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-25:])
        raise BuildError("%s failed (exit %d): %s\n%s" % (what, r.returncode, " ".join(map(str, argv)), tail))
    return r.stdout


def _check_tools(m):
    missing = [t for t in (m.cc, m.qemu, "make", "git") if not shutil.which(t)]
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
    """The firmware.elf for a qemu profile (name or dict), from the cache or built now."""
    prof = profile if isinstance(profile, dict) else load_profile(profile)
    m = machine(prof)
    if prof["heap_bytes"] > HEAP_MAX:
        raise BuildError("profile %s: a heap of %d bytes is more than the qemu firmware holds (%d)"
                         % (prof["name"], prof["heap_bytes"], HEAP_MAX))
    frozen_in = frozen(prof)
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = cache / ("img-" + image_key(prof["arch"], frozen_in))
        elf = out / "firmware.elf"
        if elf.is_file() and not force:
            return elf
        _check_tools(m)
        mp = source_tree(log)
        board_manifest = out.with_name("manifest-" + out.name[4:] + ".py")
        board_manifest.write_text(
            "# written by ternlab.boards.firmware: the qemu board's own frozen modules\n"
            "include(\"$(MPY_DIR)/extmod/asyncio\")\n"
            "freeze(%r, (\"_boot.py\", \"emuboard.py\"))\n" % str(DEVICE))
        # the port's boards/manifest.py is what firmware/app/manifest.py includes ($(PORT_DIR)/boards/manifest.py)
        shutil.copyfile(board_manifest, mp / "ports" / "qemu" / "boards" / "manifest.py")
        obj = cache / ("obj-" + out.name[4:])
        shutil.rmtree(obj, ignore_errors=True)
        log("building the qemu port for %s (%s, %s firmware)" % (prof["name"], m.board, "frozen" if frozen_in else "stock"))
        _run(["make", "-C", "ports/qemu", "-j2", "BOARD=%s" % m.board, "BUILD=%s" % obj,
              "FROZEN_MANIFEST=%s" % (MANIFEST if frozen_in else board_manifest), "MICROPY_HEAP_SIZE=%d" % HEAP_MAX,
              "MICROPY_VFS_LFS2=1", "USER_C_MODULES=%s" % CMODULES, "CFLAGS_EXTRA=-DMICROPY_PY_ASYNCIO=1", *m.make],
             "building the qemu port", cwd=mp,
             env=dict(os.environ, GIT_DIR=str(mp / ".no-git")))  # the version is v1.28.0's, not the project's commit
        board_manifest.unlink()
        out.mkdir(exist_ok=True)
        tmp = out / "firmware.elf.tmp"
        shutil.copyfile(obj / "firmware.elf", tmp)
        os.replace(tmp, elf)
        shutil.rmtree(obj, ignore_errors=True)
        log("built %s" % elf)
        _prune(cache, mp.parent)
        return elf


def _prune(cache, src, keep=6):
    # the newest few images stay (one per machine and kind, and the last edit's); older sources go
    imgs = sorted(cache.glob("img-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for p in imgs[keep:] + [d for d in cache.glob("src-*") if d != src]:
        shutil.rmtree(p, ignore_errors=True)


def qemu_profiles():
    """The names of the qemu board profiles (boards/qemu-*, "kind": "qemu")."""
    from .board import profile_names

    return [n for n in profile_names() if load_profile(n).get("kind") == KIND]


def add_subcommands(sub):
    p = sub.add_parser("firmware", help="build the qemu boards' firmware (MicroPython's qemu port, stock or with Tern frozen in)",
                       description="Firmware images for the emulated microcontrollers (see docs/boards.md).")
    fsub = p.add_subparsers(title="firmware commands", metavar="ACTION", dest="firmware_action")
    b = fsub.add_parser("build", help="build (or take from the cache) the firmware of qemu profiles")
    b.add_argument("--board", default="all", metavar="NAME",
                   help="a qemu profile (%s), or all of them (the default)" % ", ".join(qemu_profiles()))
    b.add_argument("--force", action="store_true", help="build again even when the cache has the image")
    b.set_defaults(func=cmd_build)
    p.set_defaults(func=lambda a: (p.print_usage(), 2)[1])


def cmd_build(args):
    import sys

    try:
        names = qemu_profiles() if args.board == "all" else [args.board]
        built = set()
        for n in names:  # (profiles that share an image build it once, --force or not)
            prof = load_profile(n)
            key = (prof.get("arch"), frozen(prof))
            elf = build(prof, log=lambda s: print("  " + s, file=sys.stderr), force=args.force and key not in built)
            built.add(key)
            print("%s: %s" % (n, elf))
    except (BuildError, ValueError) as e:
        print("tern firmware build: %s" % e, file=sys.stderr)
        return 1
    return 0
