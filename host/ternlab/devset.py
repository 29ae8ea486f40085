"""Tern's device set: the library modules that go on a board, as lib/tern/manifest.py names them
(micropython-lib manifest style, the file a FROZEN_MANIFEST includes). `tern deploy` and the
package.json check read it here, so the three ways onto a board (frozen, deploy, mip) agree."""

from pathlib import Path

from .paths import lib_dir


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
