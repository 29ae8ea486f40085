"""The emulated board's `machine`: the unix port's own (idle, mem8, soft_reset, ...) and what a board's
has that the unix port's lacks, from emuboard: reset() (what `mpremote reset` calls), reset_cause() and
its constants, unique_id(), WDT, deepsleep(). emuboard.boot() imports it while this folder is on
sys.path; it stays in sys.modules after the boot gives the board its own path."""

import sys

_path = sys.path
sys.path = []  # no path: the import below finds the built-in module, not this file
try:
    from machine import *  # noqa: F403
finally:
    sys.path = _path
del _path

from emuboard import (WDT, deepsleep, reset, reset_cause, unique_id, PWRON_RESET, HARD_RESET,  # noqa: E402,F401
                      WDT_RESET, DEEPSLEEP_RESET, SOFT_RESET)
