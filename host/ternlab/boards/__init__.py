"""Boards for hardware-in-the-loop tests: one interface, an emulated and a real kind.

`Board` is what a test uses: run code, copy files to and from the board's
filesystem, read its console log (timestamped, kept per test), soft reset,
power cycle, and its profile. Everything goes through MicroPython's raw REPL
on a serial port (mpremote's SerialTransport), so the same test body drives

- `EmulatedBoard` (ternlab.boards.emulated): the MicroPython unix port on a
  pseudo-terminal, with emulated NOR flash and power cuts,
- `QemuBoard` (ternlab.boards.qemu): MicroPython's own firmware for an Arm
  Cortex-M3 or a RISC-V RV32 core under QEMU (profiles qemu-*; stock, or with
  Tern frozen in), and
- `SerialBoard` (ternlab.boards.serial): a real board on a serial port.

Board profiles live in `boards/<name>/profile.json` at the top of the project
(JSON, so the device can read the same file); `load_profile(name)` reads one.
This package is the host side; the code that runs on the boards (or emulates
them) is in `firmware/` at the top (`firmware/emulated/unix`, `firmware/emulated/qemu`;
firmware/README.md), reached through ternlab.paths.
The interface is `ternlab.boards.board`, which the kinds import; this module
only re-exports it (so the package and its kinds never import each other).
"""

from .board import (  # noqa: F401
    BOARDS_DIR,
    Board,
    BoardError,
    DeviceError,
    PowerLost,
    device_profile,
    load_profile,
    profile_names,
)
from .console import ConsoleLog  # noqa: F401


def __getattr__(name):
    # ternlab.boards.EmulatedBoard / SerialBoard without importing both kinds up front
    if name == "EmulatedBoard":
        from .emulated import EmulatedBoard

        return EmulatedBoard
    if name == "QemuBoard":
        from .qemu import QemuBoard

        return QemuBoard
    if name == "SerialBoard":
        from .serial import SerialBoard

        return SerialBoard
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
