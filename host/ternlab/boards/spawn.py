"""Emulators that die with their host, and board folders that say who holds them.

An emulated board's device process (qemu-system-*, or the unix port) must not outlive the process
that runs the board: `tern board run` killed with SIGKILL or SIGHUP (a terminal closing), a pytest
run or a fleet runner killed, would otherwise leave it running on its own, at most of a core, still
writing the board's flash image, and a second run on the same folder would start a second emulator
on the same flash.

- `popen(argv, **kw)`: subprocess.Popen whose child gets SIGKILL when this process ends, however it
  ends (Linux's parent-death signal, prctl(PR_SET_PDEATHSIG), set in the child before exec). The
  kernel sends it when the *thread* that forked the child exits, so every child is forked by one
  thread that lives as long as the process (`_Forker`), whichever thread asks (a relay thread that
  reboots the board, a test's worker thread that ends).
- `FolderLock`: the board folder's lock (an flock on DIR/.lock), taken by the host and handed to each
  device process it starts (the open file is inherited), so the folder stays locked while an
  emulator of it lives, even one whose host is gone. The file names the holders' PIDs: a second
  board on the same folder is refused with a message naming them.
"""

import ctypes
import fcntl
import json
import os
import queue
import signal
import subprocess
import threading

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with(parent):
    prctl = _libc.prctl  # looked up before the fork: the child only calls it

    def pre():
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the host died between the fork and the prctl
            os._exit(1)

    return pre


class _Forker(threading.Thread):
    """The one thread that forks device processes (see the module docstring); daemon: it ends with
    the process, which is when its children must die."""

    def __init__(self):
        super().__init__(name="tern-forker", daemon=True)
        self.pid = os.getpid()  # a forked copy of this process needs a thread of its own
        self.jobs = queue.Queue()

    def run(self):
        while True:
            job = self.jobs.get()
            try:
                job.result = subprocess.Popen(job.argv, **job.kw)
            except BaseException as e:  # raised in the caller's thread
                job.result = e
            job.done.set()


class _Job:
    def __init__(self, argv, kw):
        self.argv, self.kw, self.result, self.done = argv, kw, None, threading.Event()


_forker = None
_forker_lock = threading.Lock()


def popen(argv, **kw):
    """subprocess.Popen(argv, **kw) for a child that is killed (SIGKILL) when this process ends."""
    global _forker
    die, more = _die_with(os.getpid()), kw.get("preexec_fn")
    kw["preexec_fn"] = die if more is None else (lambda: (die(), more()))
    with _forker_lock:
        if _forker is None or _forker.pid != os.getpid() or not _forker.is_alive():
            _forker = _Forker()
            _forker.start()
        forker = _forker
    job = _Job(argv, kw)
    forker.jobs.put(job)
    job.done.wait()
    if isinstance(job.result, BaseException):
        raise job.result
    return job.result


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _name(pid):
    """The program a live process runs (its argv[0], not /proc's comm: 15 characters cut
    qemu-system-riscv32 short)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return os.path.basename(f.read().split(b"\0")[0].decode(errors="replace")) or "process"
    except OSError:
        return "process"


class FolderInUse(Exception):
    """The folder's lock is held: by a live host (`tern board run`, a test), an emulator, or both."""


class FolderLock:
    """DIR/.lock, held (flock) by this process and by every device process started with
    `inherit()` among its pass_fds; `holders()` reads who holds it, as the file names them."""

    def __init__(self, folder):
        self.path = os.path.join(str(folder), ".lock")
        self.f = open(self.path, "a+")
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            who = self.holders()
            self.f.close()
            raise FolderInUse(who) from None
        self.info = {"host": os.getpid()}
        self._write()

    def _write(self):
        self.f.seek(0)
        self.f.truncate()
        self.f.write(json.dumps(self.info))
        self.f.flush()

    def holders(self):
        """'qemu-system-arm (PID 1234), started by tern (PID 1200)': the live processes the file names."""
        try:
            with open(self.path) as f:
                info = json.loads(f.read() or "{}")
        except (OSError, ValueError):
            info = {}
        emu, host = info.get("emulator"), info.get("host")
        parts = []
        if emu and _alive(emu):
            parts.append("%s (PID %d)" % (_name(emu), emu))
        if host and _alive(host):
            parts.append("%s%s (PID %d)" % ("started by " if parts else "", _name(host), host))
        elif parts and host:
            parts.append("whose host (PID %d) is gone" % host)
        return ", ".join(parts) or "a process that did not say who it is"

    def fd(self):
        """The lock's file descriptor, for a device process's pass_fds: it holds the lock while it lives."""
        return self.f.fileno()

    def started(self, pid):
        """A device process of this folder was started: the file names it."""
        self.info["emulator"] = pid
        self._write()

    def close(self):
        if not self.f.closed:
            self.f.close()
