"""The relay between a board's port and the process that is the board, for both emulated kinds
(the unix port, ternlab.boards.emulated_pty; QEMU, ternlab.boards.qemu): the loop, reading the
device, holding host bytes while it boots, power cuts at a deadline, stopping. Each kind says only
what differs (its device fd, its timers, what its exit means). A relay runs on a thread of its own
(select() over its descriptors: the qemu boards) or on the process's one event loop for all boards
(`hub`, ternlab.boards.hub: the unix port's, so a process holds a thousand of them)."""

import errno
import os
import select
import selectors
import signal
import subprocess
import threading
import time
import tty

BACKLOG = 64 * 1024  # what the port holds for a reader that is not there (both kinds)


class StepLoop(threading.Thread):
    """A thread that runs _step() while `running`, and never dies of an error in one (logged):
    a board whose relay died would hang. The relays of both board kinds and the qemu board's link
    bridge are this loop."""

    what = "relay"
    pause = 0.05

    def run(self):
        while self.running:
            try:
                self._step()
            except Exception as e:
                if self.running:
                    self.log.event("%s error: %s: %s" % (self.what, e.__class__.__name__, e))
                    time.sleep(self.pause)


class BridgeLoop(StepLoop):
    """A StepLoop with a lock and a wake-up pipe, stopped for good by stop(), which closes what it
    holds (_closed, under the lock): the qemu board's link and network bridges."""

    pause = 0.1

    def __init__(self, name, log):
        super().__init__(name=name, daemon=True)
        self.log = log
        self.lock = threading.Lock()
        self.running = True
        self.wake_r, self.wake_w = os.pipe()

    def wake(self):
        os.write(self.wake_w, b"x")

    def _closed(self):
        """Close the bridge's sockets (the lock is held)."""
        raise NotImplementedError

    def stop(self):
        if not self.running:
            return
        self.running = False
        self.wake()
        self.join(timeout=3)
        with self.lock:
            self._closed()
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)


class PortRelay(StepLoop):
    """What a board's relay thread is, whatever runs the device (the unix port here, QEMU for the
    qemu boards): the port pty, the wake-up pipe, the state EmulatedBoard reads and waits on, the
    backlog for a reader that is not there, freezing the device process, and a loop of _step()
    that never dies silently."""

    def __init__(self, board, name, hub=None):
        super().__init__(name=name, daemon=True)
        self.b = board
        self.log = board.log
        self.hub = hub  # the shared event loop (ternlab.boards.hub), or None: a thread of its own
        self.m_out, self.s_out = os.openpty()
        tty.setraw(self.s_out)  # no echo: the port is a wire, not a terminal
        os.set_blocking(self.m_out, False)
        self.port = os.ttyname(self.s_out)
        self.wake_r, self.wake_w = os.pipe() if hub is None else (None, None)
        self.lock = threading.RLock()
        self.proc = None
        self.state = "off"  # off | booting | on
        self.expect = None  # why the host is killing the process: "off" | "cycle"
        self.cut_deadline = None
        self.cut_note = ""
        self.booted = threading.Event()
        self.boot_failed = threading.Event()
        self.off = threading.Event()
        self.off.set()
        self.backlog = bytearray()
        self.pending_in = bytearray()  # host bytes held while the device boots
        self.running = True
        self.cause = "pwron"  # why the running process was booted (emuboard.reset_cause())
        self.frozen = False  # fault injection: the process is stopped (SIGSTOP)

    def freeze(self, on=True):
        """Stop (SIGSTOP) or resume (SIGCONT) the device process: an app that hangs."""
        with self.lock:
            p = self.proc
            if p is None or p.poll() is not None:
                return False
            os.kill(p.pid, signal.SIGSTOP if on else signal.SIGCONT)
            self.frozen = on
            return True

    def start(self):
        if self.hub is None:
            super().start()
        else:
            self.hub.add(self)

    def _wake(self):
        if self.running:
            if self.hub is not None:
                self.hub.poke(self)
            else:
                os.write(self.wake_w, b"x")

    def _forget(self, fd):
        """fd (the device's) is about to be closed: the hub stops watching it first."""
        if self.hub is not None:
            self.hub.forget_fd(self, fd)

    # -- the relay loop, one for both kinds of board --------------------------------
    def _device_fd(self):
        """The fd the device's output comes from (None while it is off); the caller holds the lock."""
        raise NotImplementedError

    def _deadlines(self):
        """Monotonic times the loop must wake up by, besides a random power cut's (None: none)."""
        return ()

    def _timers(self):
        """What is due after a pass of the loop, besides a random power cut."""

    def _exited(self):
        """The device process has ended (the lock is held)."""
        raise NotImplementedError

    def _device_bytes(self, data):
        """What the device printed."""
        raise NotImplementedError

    def _device_closed(self):
        """The device's output reached its end."""

    def _read_device(self, fd):
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError as e:
            if e.errno != errno.EIO:  # EIO: a pty whose other side is closed
                raise
            data = b""
        if data:
            self._device_bytes(data)
        else:
            self._device_closed()

    def _step(self):
        with self.lock:
            dev = self._device_fd()
        rl = [self.m_out, self.wake_r] + ([dev] if dev is not None else [])
        wl = [self.m_out] if self.backlog else []
        timeout = 0.2
        now = time.monotonic()
        due = self._next_due()
        if due is not None:
            timeout = max(0.0, min(timeout, due - now))
        try:
            r, _, _ = select.select(rl, wl, [], timeout)
        except (OSError, ValueError):
            time.sleep(0.05)  # an fd closed under us: stop() is under way
            return
        if self.wake_r in r:
            os.read(self.wake_r, 4096)
        if dev is not None and dev in r:
            self._read_device(dev)
        if self.m_out in r:
            self._read_host()
        if self.backlog:
            self._flush()
        self._due()

    # -- what the hub calls (ternlab.boards.hub): the same steps, one board at a time -------------
    def _watch(self):
        """{fd: (selector events, role)} to watch now."""
        out = {self.m_out: (selectors.EVENT_READ | (selectors.EVENT_WRITE if self.backlog else 0), "port")}
        with self.lock:
            dev = self._device_fd()
        if dev is not None:
            out[dev] = (selectors.EVENT_READ, "dev")
        return out

    def _ready(self, role, mask):
        if role == "dev":
            with self.lock:
                dev = self._device_fd()
            if dev is not None:
                self._read_device(dev)
        elif mask & selectors.EVENT_READ:
            self._read_host()
        if self.backlog:
            self._flush()
        self._due()

    def _next_due(self):
        """The earliest monotonic time the relay must run by (None: no deadline)."""
        ts = [t for t in (self.cut_deadline,) + tuple(self._deadlines()) if t is not None]
        return min(ts) if ts else None

    def _due(self):
        """What is due after a pass: a power cut at its deadline, the kind's timers, an exit."""
        if self.cut_deadline is not None and time.monotonic() >= self.cut_deadline:
            self.cut_deadline = None
            self.kill("random-cut")
        self._timers()
        with self.lock:
            if self.proc is not None and self.proc.poll() is not None:
                self._exited()

    # -- stopping ------------------------------------------------------------------
    def _power_off(self):
        """Kill the device process for good and wait for it."""
        self.kill("off")
        p = self.proc
        if p is not None:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def _close(self, *device_fds):
        """End the loop, then close the port, the wake-up pipe and these fds of the device's."""
        if self.hub is not None:
            self.running = False
            self.hub.remove(self)
        else:
            self.running = False
            os.write(self.wake_w, b"x")
            self.join(timeout=5)
        for fd in (self.m_out, self.s_out, self.wake_r, self.wake_w) + device_fds:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass


    def _flush(self):
        try:
            n = os.write(self.m_out, self.backlog)
            del self.backlog[:n]
        except BlockingIOError:
            pass
