"""Where session state lives, and the contract every backend keeps.

The session writes ahead: a QoS 1/2 PUBLISH, a SUBSCRIBE or an UNSUBSCRIBE is
appended before its first byte is sent and released when its acknowledgement
arrives; an inbound QoS 2 packet id is recorded before PUBREC goes out and
released before PUBCOMP does. Records are keyed by their packet identifier
(unique among pending records by construction) and kept in append order, so a
backend needs no second index and a reboot resends in the original order.

Contract (MemoryStore is the reference; FlashStore and FileStore keep it across
power loss):
- open(): recover; afterwards pending() lists what survived.
- append(kind, pid, head, body): record head + body (the encoded packet as
  first sent, DUP clear; two buffers so the payload is never copied) under
  pid; durable when it returns unless group commit is on, then at commit().
- mark(pid): QoS 2 PUBREC seen (PUBREL is what remains to send).
- unmark(pid): forget a PUBREC (the broker lost the session): the PUBLISH
  must go again. Keeps the record's place in the order.
- release(pid): acknowledged; the record is no longer live.
- pending(): pids of live records in append order (allocates; reconnect only).
- kind(pid), marked(pid), size(pid), read(pid, offset, buf) -> bytes copied.
- in_add(pid), in_has(pid), in_release(pid), in_clear(): inbound QoS 2 ids.
- meta(key), set_meta(key, value): small bytes values (client id, protocol
  version, subscriptions, the firmware's boot counter).
- has(pid), count(): is pid live; how many records are live.
- reserve(n): room for n live records, asked for once at start (the session's
  max_pending) so that a store with tables in RAM takes them while the heap is
  whole; a store that needs nothing does nothing.
- last_pid(): the pid of the newest record ever appended (0 if none), so
  identifiers keep advancing across reboots instead of reusing recent ones.
- commit(): make appends durable (group commit); close().
"""

# Record kinds are the packet types they hold.
from .wire import PUBLISH, SUBSCRIBE, UNSUBSCRIBE  # noqa: F401


class MemoryStore:
    """Session state in RAM: for QoS 0 use or when losing it on reset is fine."""

    durable = False

    def __init__(self):
        self._rec = {}  # pid -> [kind, marked, bytes]
        self._pids = []  # live pids in append order
        self._in = set()
        self._meta = {}
        self._last = 0

    def open(self):
        # Nothing to recover; nothing to make durable or let go of either, so
        # commit and close are this same method (returning self as open must).
        return self

    commit = close = open

    def reserve(self, n):
        pass

    def append(self, kind, pid, head, body=b""):
        if pid in self._rec:
            raise ValueError("packet identifier %d already pending" % pid)
        self._rec[pid] = [kind, False, bytes(head) + bytes(body)]
        self._pids.append(pid)
        self._last = pid

    def mark(self, pid):
        self._rec[pid][1] = True

    def unmark(self, pid):
        self._rec[pid][1] = False

    def release(self, pid):
        if self._rec.pop(pid, None):
            self._pids.remove(pid)

    def pending(self):
        return self._pids[:]

    def has(self, pid):
        return pid in self._rec

    def kind(self, pid):
        return self._rec[pid][0]

    def marked(self, pid):
        return self._rec[pid][1]

    def size(self, pid):
        return len(self._rec[pid][2])

    def read(self, pid, offset, buf):
        data = self._rec[pid][2][offset : offset + len(buf)]
        buf[: len(data)] = data
        return len(data)

    def count(self):
        return len(self._rec)

    def in_add(self, pid):
        self._in.add(pid)

    def in_has(self, pid):
        return pid in self._in

    def in_release(self, pid):
        self._in.discard(pid)

    def in_clear(self):
        self._in.clear()

    def meta(self, key):
        return self._meta.get(key)

    def set_meta(self, key, value):
        self._meta[key] = bytes(value)

    def last_pid(self):
        return self._last
