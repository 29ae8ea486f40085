"""One client connection of the chaos proxy and its own upstream connection: a reader and a writer
thread per direction that split the stream into whole packets, hold them (stalls, latency,
bandwidth), fire the connection's rules and forward; and the stand-in for a connection the proxy
closed at once (Refused). A connection reaches its proxy through the proxy's public face only: its
packet log (note, record, unrecord), its shaping and its seed."""

from __future__ import annotations

import collections
import random
import select
import socket
import struct
import threading
import time

from tern.codec import frame_size, packet_name
from tern.wire import MQTTError, VARINT_MAX, DISCONNECT

from .log import packet_id
from .rules import B2C, BOTH, C2B, DIRECTIONS, Armed, Rule, directions

_MAX_FRAME = VARINT_MAX + 5


class Shaping:
    """Traffic shaping a proxy applies at once to open and later connections: latency with jitter,
    bandwidth, and whether a client that leaves without DISCONNECT vanishes (ChaosProxy sets it)."""

    def __init__(self):
        self.latency = {d: 0.0 for d in DIRECTIONS}
        self.jitter = {d: 0.0 for d in DIRECTIONS}
        self.rate: dict[str, float | None] = {d: None for d in DIRECTIONS}
        self.vanish = False

    def delay(self, d: str, rng: random.Random) -> float:
        j = self.jitter[d]
        return self.latency[d] + (rng.uniform(0, j) if j else 0.0)


class _Item:
    __slots__ = ("data", "ptype", "pid", "release", "action", "eof")

    def __init__(self, data=b"", ptype=None, pid=None, release=0.0, action=None, eof=False):
        self.data = data
        self.ptype = ptype
        self.pid = pid
        self.release = release
        self.action = action
        self.eof = eof


class Connection:
    """One client connection and its upstream connection."""

    def __init__(self, proxy: "ChaosProxy", cid: int, client: socket.socket,
                 upstream: socket.socket, rules: list[Rule]):
        self.proxy = proxy
        self.id = cid
        self.socks = {C2B: (client, upstream), B2C: (upstream, client)}  # (source, destination)
        self._client = client
        self._upstream = upstream
        self.armed = [Armed(r) for r in rules]
        self.cond = threading.Condition()
        self.queues = {d: collections.deque() for d in DIRECTIONS}
        self.stall_until = {d: 0.0 for d in DIRECTIONS}
        self.last_release = {d: 0.0 for d in DIRECTIONS}
        self.next_send = {d: 0.0 for d in DIRECTIONS}
        self.bytes_in = {d: 0 for d in DIRECTIONS}
        self.bytes_out = {d: 0 for d in DIRECTIONS}
        self.raw = {d: False for d in DIRECTIONS}
        self.last_type = {d: None for d in DIRECTIONS}  # of the last packet forwarded
        self.busy = {d: False for d in DIRECTIONS}  # the writer is handling an item it took
        self.vanished = False  # the client vanished (client_vanishes): the broker's side is left half-open
        self.dropped = 0  # packets from the broker dropped since
        # Jitter draws: one stream per connection and direction, so they replay
        # whatever the thread scheduling.
        self.rng = {d: random.Random(f"{proxy.seed}/{cid}/{d}") for d in DIRECTIONS}
        self.closed = threading.Event()
        self.close_reason: str | None = None
        self._close_lock = threading.Lock()
        self.threads = [
            threading.Thread(target=fn, args=(d,), daemon=True, name=f"chaos-{cid}-{fn.__name__}-{d}")
            for d in DIRECTIONS for fn in (self._reader, self._writer)
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    # -- closing
    def close(self, reason: str, reset: bool = False) -> None:
        with self._close_lock:
            if self.closed.is_set():
                return
            self.close_reason = reason
            self.proxy.note(self.id, "closed", reason=reason, reset=reset,
                            bytes_c2b=self.bytes_out[C2B], bytes_b2c=self.bytes_out[B2C])
            self.closed.set()
        for s in (self._client, self._upstream):
            try:
                if reset:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.shutdown(socket.SHUT_RD)
                else:
                    s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass
        with self.cond:
            self.cond.notify_all()

    def wait_closed(self, timeout: float) -> bool:
        """Wait until the connection is closed and its threads are done (so its
        byte counts and the log are final); False on timeout."""
        deadline = time.monotonic() + timeout
        if not self.closed.wait(timeout):
            return False
        for t in self.threads:
            if t is not threading.current_thread() and t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))
                if t.is_alive():
                    return False
        return True

    def stall(self, seconds: float, direction: str = BOTH) -> None:
        until = time.monotonic() + seconds
        with self.cond:
            for d in directions(direction):
                self.stall_until[d] = max(self.stall_until[d], until)
            self.cond.notify_all()
        self.proxy.note(self.id, "stall", seconds=seconds, direction=direction)

    # -- reading: split the byte stream into packets and queue them
    def _reader(self, d: str) -> None:
        src = self.socks[d][0]
        buf = bytearray()
        try:
            while not self.closed.is_set():
                r, _, _ = select.select([src], [], [], 0.1)
                if not r:
                    continue
                data = src.recv(65536)
                if not data:
                    self._enqueue(d, _Item(eof=True))
                    return
                self.bytes_in[d] += len(data)
                if self.raw[d]:
                    self._forward(d, _Item(data))
                    continue
                buf += data
                pos = 0
                end = len(buf)
                while True:
                    try:
                        n = frame_size(buf, pos, end, _MAX_FRAME)
                    except MQTTError as e:
                        # Not MQTT (any more): say so and pass the rest through untouched.
                        self.raw[d] = True
                        self.proxy.note(self.id, "framing_error", direction=d, error=str(e),
                                          offset=self.bytes_in[d] - (end - pos))
                        self._enqueue(d, _Item(bytes(buf[pos:end])))
                        pos = end
                        break
                    if n < 0 or pos + n > end:
                        break
                    frame = bytes(buf[pos:pos + n])
                    pos += n
                    t = frame[0] >> 4
                    self._forward(d, _Item(frame, t, packet_id(frame), action=self._match(d, t)))
                del buf[:pos]
        except (OSError, ValueError) as e:
            if d == C2B and self.proxy.shaping.vanish and isinstance(e, ConnectionResetError):
                self._enqueue(d, _Item(eof=True))  # after what was read: its turn comes in order
            elif not self.closed.is_set():
                self.close(f"{'client' if d == C2B else 'broker'} read failed: {e}")

    def _match(self, d: str, t: int):
        """The first rule this packet fires (counting it for every packet rule)."""
        fired = None
        for a in self.armed:
            r = a.rule
            if a.fired or r.nbytes is not None or r.kind == "refuse" or r.direction != d:
                continue
            if r.ptype is not None and r.ptype != t:
                continue
            a.count += 1
            if a.count == r.nth:
                a.fired = True
                if fired is None:
                    fired = r
        return fired

    def _forward(self, d: str, item: _Item) -> None:
        """Send item from the reader's thread when nothing could hold it back (no latency, pacing,
        stall or rule, nothing queued before it or being sent): handed to the writer's thread instead,
        every packet waited for that thread to wake, up to milliseconds in a busy interpreter (the
        demo's latency figures measured the proxy). Otherwise queue it for the writer."""
        sh = self.proxy.shaping
        if (item.action is None and not sh.latency[d] and not sh.jitter[d] and not sh.rate[d]
                and not self.vanished and not self._byte_rules(d)):
            with self.cond:
                fast = (not self.queues[d] and not self.busy[d] and not self.closed.is_set()
                        and self.stall_until[d] <= time.monotonic())
            if fast:
                try:
                    self._send(d, self.socks[d][1], item)
                except OSError as e:
                    if not self.closed.is_set():
                        self.close(f"{'broker' if d == C2B else 'client'} write failed: {e}")
                return
        self._enqueue(d, item)

    def _enqueue(self, d: str, item: _Item) -> None:
        now = time.monotonic()
        delay = self.proxy.shaping.delay(d, self.rng[d])
        with self.cond:
            item.release = max(now + delay, self.last_release[d])
            self.last_release[d] = item.release
            self.queues[d].append(item)
            self.cond.notify_all()

    # -- writing: wait for latency and stalls, pace to the bandwidth, apply rules
    def _wait(self, d: str, release: float = 0.0) -> bool:
        """Wait until `release` and until no stall holds direction d; False once closed."""
        with self.cond:
            while not self.closed.is_set():
                wake = max(release, self.stall_until[d])
                now = time.monotonic()
                if now >= wake:
                    return True
                self.cond.wait(min(wake - now, 0.5))
        return False

    def _next(self, d: str) -> _Item | None:
        q = self.queues[d]
        with self.cond:
            while not self.closed.is_set():
                self.busy[d] = False
                if q:
                    item = q[0]
                    wake = max(item.release, self.stall_until[d])
                    now = time.monotonic()
                    if now >= wake:
                        self.busy[d] = True
                        return q.popleft()
                    self.cond.wait(min(wake - now, 0.5))
                else:
                    self.cond.wait(0.5)
        return None

    def _fire(self, r: Rule, d: str, item: _Item | None, forwarded: bool) -> None:
        detail = {"rule": r.describe(), "direction": d, "forwarded": forwarded}
        if item is not None and item.ptype is not None:
            detail.update(type=packet_name(item.ptype), pid=item.pid)
        if r.kind == "cut":
            self.proxy.note(self.id, "cut", **detail)
            self.close("cut: " + r.describe(), reset=r.reset)
        else:
            self.proxy.note(self.id, "stall_rule", **detail)
            self.stall(r.seconds, r.stall_direction)

    def _vanish(self) -> bool:
        """The client's side ended: True if it vanishes (see ChaosProxy.client_vanishes) rather than
        closing, i.e. the broker's side is left open and silent."""
        if not self.proxy.shaping.vanish or self.last_type[C2B] == DISCONNECT:
            return False
        with self._close_lock:
            if self.closed.is_set():
                return True
            self.vanished = True
        self.proxy.note(self.id, "vanished", bytes_c2b=self.bytes_out[C2B], bytes_b2c=self.bytes_out[B2C])
        try:
            self._client.shutdown(socket.SHUT_RDWR)  # wakes a writer blocked on it
        except OSError:
            pass
        self._client.close()
        return True

    def _byte_rules(self, d: str) -> list[Armed]:
        return [a for a in self.armed if not a.fired and a.rule.nbytes is not None and a.rule.direction == d]

    def _writer(self, d: str) -> None:
        dst = self.socks[d][1]
        try:
            while True:
                item = self._next(d)
                if item is None:
                    return
                if item.eof:
                    if d == C2B and self._vanish():
                        return  # the broker's side stays open: only the broker (or a cut) closes it
                    self.close(("client" if d == C2B else "broker") + " closed")
                    return
                if d == B2C and self.vanished:
                    self.dropped += 1  # nobody is there to receive it
                    continue
                r = item.action
                if r is not None and not r.forward:
                    self._fire(r, d, item, forwarded=False)
                    if self.closed.is_set():
                        return
                    if not self._wait(d):
                        return
                if not self._send(d, dst, item):
                    return
                if r is not None and r.forward:
                    self._fire(r, d, item, forwarded=True)
        except OSError as e:
            if d == B2C and self.vanished:
                return self._writer(d)  # the client vanished under this write: drop, as above
            if not self.closed.is_set():
                self.close(f"{'broker' if d == C2B else 'client'} write failed: {e}")

    def _send(self, d: str, dst: socket.socket, item: _Item) -> bool:
        """Forward item.data, logging the packet just before its last byte goes
        out (so whoever receives it finds it in the log already)."""
        view = memoryview(item.data)
        while view:
            if not self._wait(d):
                return False
            chunk = len(view)
            rate = self.proxy.shaping.rate[d]
            if rate:
                chunk = min(chunk, max(1, int(rate * 0.02)))  # 20 ms worth at a time
                if not self._wait(d, self.next_send[d]):
                    return False
            limit = None
            for a in self._byte_rules(d):
                left = a.rule.nbytes - self.bytes_out[d]
                if limit is None or left < limit[0]:
                    limit = (left, a)
            if limit is not None and limit[0] <= chunk:
                n, a = limit
                if n > 0:
                    dst.sendall(view[:n])
                    self.bytes_out[d] += n
                    view = view[n:]
                a.fired = True
                self._fire(a.rule, d, None, forwarded=True)
                if self.closed.is_set():
                    return False
                continue
            started = time.monotonic()
            rec = None
            if chunk == len(view) and item.ptype is not None:
                rec = self.proxy.record(self.id, d, item.ptype, len(item.data), item.pid)
            try:
                dst.sendall(view[:chunk])
            except OSError:
                if rec is not None:
                    self.proxy.unrecord(rec)
                raise
            self.bytes_out[d] += chunk
            view = view[chunk:]
            if not view:
                self.last_type[d] = item.ptype
            if rate:
                self.next_send[d] = max(self.next_send[d], started) + chunk / rate
        return True



class Refused:
    """A connection the proxy closed at once (refused, or the broker was down)."""

    def __init__(self, cid: int, reason: str):
        self.id = cid
        self.close_reason = reason
        self.closed = threading.Event()
        self.closed.set()
        self.threads: list[threading.Thread] = []
        self.bytes_out = {d: 0 for d in DIRECTIONS}

    def wait_closed(self, timeout: float) -> bool:
        return True

    def close(self, reason: str, reset: bool = False) -> None:
        pass
