"""The emulated board's `time`: the unix port's own, with a sleep_ms() that waits in one system call.

The port's sleep_ms() waits in 0.5 ms steps (mp_hal_delay_ms loops on mp_event_wait_ms(1), a 500 us
usleep on this port), so a board waiting in it -- its link down, its broker away, the app's step() --
woke about 1,600 times a second and took about 3 % of a core doing nothing; hundreds of boards whose
links a broker restart held down at once saturated the host. A board's sleep_ms() idles until the time
is up; this one waits in poll() on no descriptor (select.poll's ipoll: one poll(2) for the whole wait,
resumed after a signal, pending events and Ctrl-C handled as in the port's own waits, no allocation).
Everything else is the port's own module: same names, same behaviour. The port's `time` cannot be
patched (its attributes are in ROM); it is extensible, so this file, found on the path first, is
`time`. emuboard imports it first thing (this folder is on the path then); it stays in sys.modules,
so the app's and the library's `from time import sleep_ms` get it after the boot changes the path."""

import sys

_path = sys.path
sys.path = []  # no path: the import below finds the built-in module, not this file
try:
    from time import *  # noqa: F403
finally:
    sys.path = _path
del _path

import select  # noqa: E402

_idle = select.poll()  # nothing registered: its ipoll(ms) is a wait of ms in one poll(2)
for _ in _idle.ipoll(0):  # the first ipoll allocates the poll object's result tuple: here, not in a wait
    pass
del sys, select


def sleep_ms(ms):
    """Wait ms milliseconds (an int; nothing below 0), as the port's sleep_ms does, in one wait."""
    if ms >= 0:
        for _ in _idle.ipoll(ms):
            pass
