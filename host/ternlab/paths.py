"""Where the harness finds the project's files, and the one place that puts device code on a path.

Board profiles, the device code and the fleet scenarios are the checkout's `boards/`, `firmware/` and
`scenarios/` folders; an installed `ternlab` wheel carries the same files as package data under
`ternlab/share/` (copied there by setup.py when the wheel is built, never kept twice in the repo).
The library's sources, which deploy and the emulated boards compile and copy to boards, are those of
the `tern` package this interpreter imports (lib/tern in a checkout, the installed `tern-mqtt`).

Device code (what runs on a board or emulates one) is reached only through `device_dir`,
`device_path` and `use_device` below: no other host module, tool or test spells a folder of
`firmware/` or edits `sys.path` to reach one (tests/host/test_layout.py checks both).
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARE = HERE / "share"
CHECKOUT = HERE.parents[1]


def project_dir(name: str) -> Path:
    """`boards`, `firmware` or `scenarios`: the wheel's copy when installed, else the checkout's."""
    d = SHARE / name
    return d if d.is_dir() else CHECKOUT / name


def lib_dir() -> Path:
    """The folder that holds the `tern` package (its parent)."""
    import tern

    return Path(tern.__file__).resolve().parent.parent


def boards_home() -> Path:
    """Where `tern board run` keeps an emulated board's folder when no --dir is given: the user's data
    folder ($XDG_DATA_HOME/tern/boards, by default ~/.local/share/tern/boards), not the working
    directory, so a board is the same device wherever the command is run from, and no checkout gets
    a stray folder."""
    import os

    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "tern" / "boards"


# The parts of firmware/ by what they are (firmware/README.md says what to change where).
DEVICE_PARTS = {
    "app": "app",                       # the telemetry app: main.py, hal.py, tconfig.py, telemetry.py, manifest.py
    "norflash": "emulated",             # norflash.py: the NOR flash model, the reference semantics
    "unix-board": "emulated/unix",      # the unix-port board's device side: emuboard.py, network.py
    "qemu-board": "emulated/qemu",      # the qemu boards' own frozen modules: _boot.py, emuboard.py
    "qemu-firmware": "qemu-firmware",   # the qemu port's C module (qboard) and patches
    "testing": "testing",               # device-side test helpers: crash_device.py, ledger_publisher.py, cutfs.py
    "qemu-testing": "testing/qemu",     # test helpers put on the qemu boards (its norflash.py)
}
# What a part needs beside itself to import: the unix board's emuboard imports norflash.
_NEEDS = {"unix-board": ("norflash",), "testing": ("norflash",)}


def device_dir(part: str) -> Path:
    """The folder of one part of the device code (a key of DEVICE_PARTS)."""
    try:
        return project_dir("firmware") / DEVICE_PARTS[part]
    except KeyError:
        raise ValueError("no device part %r (known: %s)" % (part, ", ".join(DEVICE_PARTS))) from None


def device_path(*parts: str) -> list:
    """The folders to put on a path (MICROPYPATH, sys.path) for these parts to import, with what
    they need, in order, each once."""
    out = []
    for part in parts:
        for p in (part,) + _NEEDS.get(part, ()):
            d = str(device_dir(p))
            if d not in out:
                out.append(d)
    return out


def use_device(*parts: str) -> list:
    """Put these parts of the device code on this interpreter's sys.path (host code that imports
    norflash, tools that run a device workload in-process); returns the folders."""
    import sys

    dirs = device_path(*parts)
    for d in reversed(dirs):
        if d not in sys.path:
            sys.path.insert(0, d)
    return dirs
