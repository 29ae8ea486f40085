"""Socket custody: an emulated board's connections to the broker outlive its process, as a board's do
when its power fails, with no relay in the data path.

Why: a board that loses power sends nothing more; the broker learns of it from the keepalive or from a
takeover by the board's next boot. An emulated board is a host process, and the host kernel closes a
dead process's sockets at once (FIN), so the broker would know at once. A relay (ternlab.brokers.chaos) hides
that, but then every packet crosses one more process, a wake-up each way, and the latency figures
measure the relay. Instead the fleet holds a duplicate of each of the board's connections to the broker
(pidfd_getfd(2), Linux 5.6: the same open socket, not a copy), so the socket stays open when the
process dies. The duplicate is never read while the board still has the socket. Once the board has let
go of it (its process died, or it closed the socket without the broker closing first), custody reads
and drops whatever the broker still sends until the broker closes: what a vanished board's broker sees.
A network cut is shutdown(SHUT_RDWR) on the duplicates: the connection ends for both sides at once.

The fleet calls sync() on every tick (about every 20 ms): a connection opened and dropped by a dying
board within one tick is not held, and the broker sees that one close. Linux only; available() says
whether this kernel (and a sandbox's seccomp filter) allows it. The boards must be this process's
children (or the same user's processes under a permissive ptrace policy).
"""

from __future__ import annotations

import ctypes
import functools
import os
import select
import socket
import subprocess
import sys
import threading

_SYS_PIDFD_GETFD = 438  # the same number on every architecture that has it (the unified syscall table)
_libc = None


def _getfd(pid: int, fd: int) -> socket.socket | None:
    """A duplicate of process pid's file descriptor fd as a socket, or None (gone, not allowed)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        n = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
    finally:
        os.close(pidfd)
    if n < 0:
        return None
    try:
        return socket.socket(fileno=n)
    except OSError:
        os.close(n)
        return None


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether pidfd_getfd works here on a child process's socket, as it must on the boards' (a
    kernel before 5.6, a seccomp filter or a strict ptrace policy can refuse it)."""
    if not hasattr(os, "pidfd_open"):
        return False
    a, b = socket.socketpair()
    child = None
    try:  # pass_fds: the same fd number in the child
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"], pass_fds=(a.fileno(),))
        s = _getfd(child.pid, a.fileno())
        if s is None:
            return False
        s.close()
        return True
    except OSError:
        return False
    finally:
        if child is not None:
            child.kill()
            child.wait()
        a.close()
        b.close()


def _sockets(pid: int | None) -> dict[int, int]:
    """{socket inode: fd} of a process; empty once it is gone."""
    out: dict[int, int] = {}
    if pid is None:
        return out
    d = f"/proc/{pid}/fd"
    try:
        names = os.listdir(d)
    except OSError:
        return out
    for n in names:
        try:
            t = os.readlink(f"{d}/{n}")
        except OSError:
            continue
        if t.startswith("socket:["):
            out[int(t[8:-1])] = int(n)
    return out


class SocketCustody:
    """Holds the connections of several boards (each named by a key) to one broker address."""

    def __init__(self, broker: tuple[str, int]):
        self.broker = (broker[0], broker[1])
        self._held: dict[str, dict[int, socket.socket]] = {}  # key -> {inode: duplicate}
        self._loose: dict[socket.socket, str] = {}      # let go by their board: drained until EOF
        self._other: dict[str, set[int]] = {}            # inodes seen that are not broker connections
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)  # a full pipe already wakes the drainer
        self._closed = False
        self._thread = threading.Thread(target=self._drain, daemon=True, name="socket-custody")
        self._thread.start()

    def sync(self, key: str, pid: int | None) -> None:
        """Take the board's new connections to the broker; let go of those it no longer has."""
        now = _sockets(pid)
        held = self._held.setdefault(key, {})
        other = self._other.setdefault(key, set())
        for ino in [i for i in held if i not in now]:  # a new process (a reboot) has none of the old inodes
            self._let_go(key, held.pop(ino))
        other.intersection_update(now)
        for ino, fd in now.items():
            if ino in held or ino in other:
                continue
            s = _getfd(pid, fd)
            if s is None:
                continue
            if os.fstat(s.fileno()).st_ino != ino:  # closed and the number reused meanwhile: next tick
                s.close()
                continue
            try:
                peer = s.getpeername()[:2]
            except OSError:  # not connected yet: looked at again next time
                s.close()
                continue
            if peer != self.broker:
                other.add(ino)
                s.close()
                continue
            held[ino] = s

    def cut(self, key: str, pid: int | None) -> int:
        """End every connection of the board, held or let go of, for both sides (FIN). Returns how
        many there were."""
        self.sync(key, pid)
        socks = list(self._held.pop(key, {}).values())
        with self._lock:
            socks += [s for s, k in self._loose.items() if k == key]
            for s in socks:
                self._loose.pop(s, None)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self._wake()
        return len(socks)

    def held(self, key: str) -> int:
        """Connections of the board held now (the board's and let go of)."""
        with self._lock:
            loose = sum(1 for k in self._loose.values() if k == key)
        return len(self._held.get(key, {})) + loose

    def _let_go(self, key: str, s: socket.socket) -> None:
        with self._lock:
            self._loose[s] = key
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    def _drain(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                socks = {s.fileno(): s for s in self._loose if s.fileno() >= 0}
            p = select.poll()
            p.register(self._wake_r, select.POLLIN)
            for fd in socks:
                p.register(fd, select.POLLIN)
            for fd, ev in p.poll(1000):
                if fd == self._wake_r:
                    os.read(self._wake_r, 4096)
                    continue
                s = socks[fd]
                data = b""
                if not ev & select.POLLNVAL:  # closed meanwhile (a cut): nothing to read
                    try:
                        data = s.recv(65536)
                    except OSError:
                        pass
                if not data:  # the broker closed it (takeover, keepalive, its own restart)
                    with self._lock:
                        gone = self._loose.pop(s, None) is not None
                    if gone:
                        s.close()

    def close(self) -> None:
        """Close everything held (the broker then sees each connection close) and stop."""
        with self._lock:
            self._closed = True
            socks = list(self._loose)
            self._loose.clear()
        for held in self._held.values():
            socks += held.values()
        self._held.clear()
        self._wake()
        self._thread.join(2)
        for s in socks:
            s.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
