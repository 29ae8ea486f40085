"""SerialBoard: a real board on a serial port, through mpremote's transport (pyserial).

Everything a test does goes through the board's raw REPL, as for the
EmulatedBoard, so one test body drives either. The console log is what the
host read from the port, timestamped as it arrives: while a command runs,
and while a test waits for a line (`wait_for` reads the port). A power cut
needs hardware the host does not have: real profiles do not list the
`power_cut` capability, and `cut_power` says so.

Hard reset (`power_cycle`): an ESP32 on a USB-UART bridge is reset through
its EN line (RTS), as esptool does; any other board (or a port without modem
lines, such as a pty) runs `machine.reset()` -- on the emulated board, whose
`machine` has no reset, `emuboard.reset()`. A board with native USB leaves
and comes back: for `timeout` seconds after the reset, opening its port is
retried.
"""

import select
import time

from .board import Board, BoardError, load_profile
from .console import ConsoleLog

_RESET = "try:\n import machine\n machine.reset()\nexcept AttributeError:\n import emuboard\n emuboard.reset()\n"


class SerialBoard(Board):
    """SerialBoard(port, profile="esp32-generic", baudrate=115200, log_path=None, echo=None)"""

    _tap_log = True

    def __init__(self, port, profile="esp32-generic", baudrate=115200, log_path=None, echo=None):
        prof = profile if isinstance(profile, dict) else load_profile(profile)
        super().__init__(prof, ConsoleLog(str(log_path) if log_path else None, echo))
        self.port = port
        self.baudrate = baudrate

    def _port_path(self):
        return self.port

    def _pump(self, seconds):
        with self._lock:
            t = self._transport()
            s = t.serial
            n = s.in_waiting
            if n:
                s.read(n)
                return
        select.select([s.fileno()], [], [], seconds)

    def _transport(self):
        # after a hard reset a native-USB board leaves and comes back: retry
        # opening its port until the deadline set by power_cycle()
        while True:
            try:
                return super()._transport()
            except BoardError:
                if time.monotonic() > self._back_by:
                    raise
                time.sleep(0.2)

    _back_by = 0.0

    def power_cycle(self, timeout=15.0):
        """Hard reset. Returns at once; the board's boot output (boot.py,
        main.py) reaches the log as the host reads the port (wait_for)."""
        with self._lock:
            t = self._transport()
            done = False
            if self.profile.get("platform") == "esp32":
                try:
                    s = t.serial
                    s.dtr = False
                    s.rts = True  # EN low
                    time.sleep(0.1)
                    s.rts = False
                    done = True
                except OSError:
                    done = False
            if not done:
                self.exec_nowait(_RESET)
            t.in_raw_repl = False
            self._busy = False
            self._back_by = time.monotonic() + timeout

    def cut_power(self, *a, **k):
        raise BoardError("%s: a power cut needs a relay the harness does not have (profile %s has no power_cut capability)" % (self.port, self.name))

    arm_cut = cut_power
