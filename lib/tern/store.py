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
- commit(): make every change so far durable (group commit); close() too.
- dirty: True while changes wait for commit(), an attribute so that asking
  costs nothing. The session commits before any packet leaves while it is
  set (a packet may announce any change: PUBREL the mark, PUBCOMP the
  release), and before publish() returns.
- epoch, seen: epoch counts the times the store read its medium again after
  a failure (below); the session sets seen = epoch once it has re-derived
  its view from what the store holds. dirty stays True while they differ, so
  the session's look before every packet finds it.

When storage fails (a write, program, erase, sync or file create raises,
before any byte lands, after all of them did, or after part of them), the
call raises OSError and the store is in one of two states:
- known: the store has read its medium again (what a boot would find, no
  more: a file's bytes past its last good sync are voided first, durably) and
  the call's own change did not happen: append, in_add and set_meta raise
  only when the record they wrote is not and never will be found, voided if
  it landed anyway. An ack (release, mark, unmark, in_release, in_clear) or a
  commit that raises may or may not have happened, and changes that waited
  for commit may be gone: what the store holds says which (epoch moved on).
  ENOSPC keeps its meaning: nothing was written ("outbox full"), or the
  filesystem is full (then as any failed write).
- unknown: voiding or reading again failed too. The call raises
  OutboxUnknown (an OSError, errno EIO, "outbox state unknown: ..."): what
  it wrote may or may not be there. The store accepts nothing more (every
  write and commit tries to read its medium again first, and raises
  OutboxUnknown while it cannot) until it has; then what it holds decides.
Nothing a store raises after a failure is anything but OSError. MemoryStore
has no medium: it never fails this way.
"""

# Record kinds are the packet types they hold.
from .wire import PUBLISH, SUBSCRIBE, UNSUBSCRIBE  # noqa: F401


class MemoryStore:
    """Session state in RAM: for QoS 0 use or when losing it on reset is fine.

    Records sit in lists in append order (the session acknowledges and sends
    oldest first, so a search is short) rather than in a dict keyed by pid:
    on MicroPython a dict that holds a few hundred pids and loses and gains
    one per message costs microseconds per new key, as deleted slots fill it.
    A released record's buffer is kept for the next record of its size: a
    device's messages mostly have one size, and the allocation it saves is the
    one that costs most on MicroPython (several blocks, searched for in a heap
    full of the other records)."""

    durable = False
    dirty = False  # nothing is ever waiting for commit()
    epoch = seen = 0  # nor does it ever read a medium again

    def __init__(self):
        self._pids = []  # live pids in append order
        self._data = []  # their packets (bytearray)
        self._spare = []  # released buffers of one size, for reuse (at most 16)
        self._kind = []  # their kinds, | 128 when marked
        self._in = set()
        self._meta = {}
        self._last = 0
        # Every live pid is within _span ids before _last (cyclically, ids
        # 1..65535; an upper bound): what lets has() answer a new pid at once.
        self._span = 0

    def open(self):
        # Nothing to recover; nothing to make durable or let go of either, so
        # commit and close are this same method (returning self as open must).
        return self

    commit = close = open

    def reserve(self, n):
        pass

    # (Few locals in the methods a message passes through: a MicroPython
    # function whose frame needs more than 11 words gets it from the heap at
    # every call.)

    def append(self, kind, pid, head, body=b""):
        if self.has(pid):
            raise ValueError("packet identifier %d already pending" % pid)
        self._span = self._span + (pid - self._last) % 65535 if self._pids else 0
        self._pids.append(pid)
        self._data.append(self._copy(head, body))
        self._kind.append(kind)
        self._last = pid

    def _copy(self, head, body):
        h = len(head)
        sp = self._spare
        b = sp.pop() if sp and len(sp[-1]) == h + len(body) else bytearray(h + len(body))
        b[:h] = head
        b[h:] = body
        return b

    def _at(self, pid):
        i = self._index(pid)
        if i < 0:
            raise KeyError(pid)
        return i

    def mark(self, pid):
        self._kind[self._at(pid)] |= 128

    def unmark(self, pid):
        self._kind[self._at(pid)] &= 127

    def _index(self, pid):
        try:
            return self._pids.index(pid)
        except ValueError:
            return -1

    def release(self, pid):
        p = self._pids
        i = 0 if p and p[0] == pid else self._index(pid)  # (the oldest, mostly: found without a search)
        if i < 0:
            return
        b = self._data.pop(i)
        del p[i], self._kind[i]
        sp = self._spare
        if sp and len(sp[0]) != len(b):
            del sp[:]
        if len(sp) < 16:
            sp.append(b)
        if not i and p:  # a new oldest: the span shrinks by the ids between
            self._span -= (p[0] - pid) % 65535

    def pending(self):
        return self._pids[:]

    def has(self, pid):
        # The session asks this of every new pid (one after _last, in the
        # steady state): answered without a search when it lies beyond the span.
        d = (pid - self._last) % 65535
        if d and d + self._span < 65535:
            return False
        return pid in self._pids

    def kind(self, pid):
        return self._kind[self._at(pid)] & 127

    def marked(self, pid):
        return self._kind[self._at(pid)] > 127

    def size(self, pid):
        return len(self._data[self._at(pid)])

    def read(self, pid, offset, buf):
        d = self._data[self._at(pid)]
        n = len(d) - offset
        if n > len(buf):
            n = len(buf)
        if n <= 0:
            return 0
        buf[:n] = memoryview(d)[offset : offset + n] if offset or n < len(d) else d
        return n

    def count(self):
        return len(self._pids)

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
