"""One event loop for the relays of every unix-port board in a process.

Why: a relay per board used to be a thread of its own waiting in select() on the board's port pty,
its device pty and a wake-up pipe. At a thousand boards that is a thousand threads taking turns at
one interpreter lock, each waking five times a second to look at its deadlines, and select() cannot
take a descriptor above 1023 (FD_SETSIZE): one runner process stopped near 140 boards
(docs/fleet.md). The hub is one thread and one epoll (selectors.DefaultSelector) for all of them:
a board's relay (ternlab.boards.relay.PortRelay) says which descriptors it wants watched
(`_watch()`), handles what is ready (`_ready()`) and when it must run next (`_next_due()`, its
power-cut, watchdog, deep-sleep and Ctrl-C deadlines); what other threads change (a power-on that
opens a new device pty, a power cut set for later) reaches the hub by `poke(relay)`. The handlers are
the ones a relay thread ran: the hub is the relays' thread, shared.

A relay's handlers must not block for long (they read and write non-blocking ptys; the longest wait
is for a process that closed its pty to be reaped, microseconds): one slow board would hold up all.
"""

from __future__ import annotations

import heapq
import itertools
import os
import selectors
import threading
import time

SWEEP = 1.0  # seconds between looks at every relay's process (an exit not seen on its pty)

_shared = None
_shared_lock = threading.Lock()


def shared() -> "Hub":
    """This process's hub, started on first use (a forked child gets its own)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.pid != os.getpid():
            _shared = Hub()
            _shared.start()
        return _shared


class Hub(threading.Thread):
    """See the module docstring. add(relay), poke(relay), remove(relay); the rest runs in the hub."""

    def __init__(self):
        super().__init__(name="board-hub", daemon=True)
        self.pid = os.getpid()
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)  # a full pipe wakes the hub already
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        self.lock = threading.Lock()  # guards the sets below and the selector's registrations
        self.relays: set = set()
        self.dirty: set = set()
        self.leaving: dict = {}  # relay -> Event set once its descriptors are no longer watched
        self.heap: list = []
        self.seq = itertools.count()
        self.events = 0  # descriptor events handled (tools/bench/fleet_scale.py reports them)
        self.late_max = 0.0  # the most a deadline was handled late, in seconds (the loop's lag)

    # -- from any thread ---------------------------------------------------------------------------
    def add(self, relay) -> None:
        relay._reg = {}
        relay._sched = None
        with self.lock:
            self.relays.add(relay)
        self.poke(relay)

    def poke(self, relay) -> None:
        """Something of the relay's changed (a descriptor, a deadline): the hub looks again."""
        with self.lock:
            self.dirty.add(relay)
        try:
            os.write(self.wake_w, b"x")
        except BlockingIOError:
            pass

    def forget_fd(self, relay, fd) -> None:
        """The relay is about to close fd: stop watching it first (a descriptor closed while watched
        leaves epoll, but the selector's table would keep it, and the number comes back)."""
        with self.lock:
            if relay._reg.pop(fd, None) is not None:
                self.sel.unregister(fd)

    def remove(self, relay, timeout=5.0) -> None:
        """Stop watching the relay's descriptors; returns once the hub no longer handles them."""
        if threading.current_thread() is self:
            self._drop(relay)
            return
        done = threading.Event()
        with self.lock:
            if relay not in self.relays:
                return
            self.leaving[relay] = done
        self.poke(relay)
        done.wait(timeout)

    # -- the loop --------------------------------------------------------------------------------
    def _drop(self, relay) -> None:
        with self.lock:
            for fd in list(relay._reg):
                self.sel.unregister(fd)
            relay._reg.clear()
            self.relays.discard(relay)
            self.dirty.discard(relay)
            done = self.leaving.pop(relay, None)
        relay._sched = None
        if done is not None:
            done.set()

    def _sync(self, relay) -> None:
        """Watch what the relay wants watched now; schedule its next deadline."""
        if relay in self.leaving or not relay.running:
            self._drop(relay)
            return
        want = relay._watch()
        with self.lock:
            if relay not in self.relays:
                return
            reg = relay._reg
            for fd in [fd for fd in reg if fd not in want]:
                del reg[fd]
                self.sel.unregister(fd)
            for fd, (events, role) in want.items():
                old = reg.get(fd)
                if old is None:
                    self.sel.register(fd, events, (relay, role))
                elif old != events:
                    self.sel.modify(fd, events, (relay, role))
                reg[fd] = events
        due = relay._next_due()
        if due is not None and due != relay._sched:
            relay._sched = due
            heapq.heappush(self.heap, (due, next(self.seq), relay))

    def _guard(self, relay, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as e:  # a board whose relay died would hang: log it, carry on
            if relay.running:
                relay.log.event("relay error: %s: %s" % (e.__class__.__name__, e))

    def run(self) -> None:
        sweep_at = time.monotonic() + SWEEP
        while True:
            now = time.monotonic()
            timeout = max(0.0, min(sweep_at, self.heap[0][0] if self.heap else sweep_at) - now)
            touched = set()
            for key, mask in self.sel.select(timeout):
                if key.data is None:
                    try:
                        os.read(self.wake_r, 65536)
                    except BlockingIOError:
                        pass
                    continue
                relay, role = key.data
                if relay._reg.get(key.fd) is None:
                    continue  # no longer watched (closed meanwhile)
                self.events += 1
                self._guard(relay, relay._ready, role, mask)
                touched.add(relay)
            with self.lock:
                dirty, self.dirty = self.dirty, set()
            now = time.monotonic()
            while self.heap and self.heap[0][0] <= now:
                due, _, relay = heapq.heappop(self.heap)
                if relay._sched == due:  # else an older deadline, moved since
                    self.late_max = max(self.late_max, now - due)
                    relay._sched = None
                    self._guard(relay, relay._due)
                    touched.add(relay)
            if now >= sweep_at:
                sweep_at = now + SWEEP
                with self.lock:
                    every = list(self.relays)
                for relay in every:
                    self._guard(relay, relay._due)
                touched.update(every)
            for relay in touched | dirty:
                self._guard(relay, self._sync, relay)
