"""The qemu boards the tests run on, and how Tern gets onto a stock one quickly.

ISAS: one profile per ISA, each standing for a user's board (stock firmware: nothing of Tern frozen).
A stock board gets Tern (and any test modules) in its ROMFS partition, written from the host: what
`mpremote romfs deploy` puts on a board, imported in place from /rom/lib (the firmware's own
sys.path: '/rom/lib' comes before '/lib'). Copying the same files over the REPL UART takes about
20 s on the Cortex-M3 (its UART takes one byte at a time); tests that are about /lib (mip, deploy)
copy them as users do.
"""

import tempfile
from pathlib import Path

import pytest

from ternlab.boards import load_profile
from ternlab.devset import app_romfs, compile_mpy, mpy_cross

# profile -> its ISA's name in test ids
ISAS = {"qemu-m3-esp32": "cortex-m3", "qemu-rv32-c3": "rv32"}
BOTH_ISAS = pytest.mark.parametrize("qemu_profile", list(ISAS), ids=list(ISAS.values()))
ROMFS_ROOMY = 512 * 1024  # a test's ROMFS partition when Tern and test modules go in together

_MPY = {}


def tern_mpy(march):
    """Tern's device set and the app's modules compiled for an ISA (compile_mpy), once per run."""
    if march not in _MPY:
        _MPY[march] = compile_mpy(Path(tempfile.mkdtemp(prefix="tern-mpy-%s-" % march)), march=march)
    return _MPY[march]


def romfs_with_tern(march, files=(), workdir=None):
    """A ROMFS image: Tern under lib/tern, the app's modules at the top, and these files (test
    modules, .py) compiled under lib/ with their asserts (no -O)."""
    out = Path(workdir or tempfile.mkdtemp(prefix="tern-romfs-"))
    out.mkdir(parents=True, exist_ok=True)
    extra = []
    for f in map(Path, files):
        dst = out / (f.stem + ".mpy")
        mpy_cross(f, dst, f.name, march, opt=None)
        extra.append((dst, "lib/" + dst.name))
    return app_romfs(tern_mpy(march), extra)


def stock_board(profile, workdir, files=(), **kw):
    """A QemuBoard of profile (a name or a dict; ROMFS partition made roomy enough) with Tern and
    these modules in its ROMFS partition, booted with them."""
    from ternlab.boards.qemu import QemuBoard

    prof = dict(profile if isinstance(profile, dict) else load_profile(profile), romfs={"bytes": ROMFS_ROOMY})
    b = QemuBoard(prof, workdir=Path(workdir) / "board", **kw)
    try:
        b.write_romfs(romfs_with_tern(prof["arch"], files, Path(workdir) / "romfs-mpy"))
        b.power_cycle()
    except BaseException:
        b.close()
        raise
    return b
