"""Chaos proxy: a TCP proxy between an MQTT client and its broker that understands
MQTT framing and breaks the connection on cue.

Over 600 lines because the per-connection relay (`Connection`) and the proxy
(`ChaosProxy`) share the proxy's event log, packet records, rates and delays
(`_event`, `_record`, `_delay`, `_rate`): in two modules each would reach into
the other's private state.

    with ChaosProxy(broker.address) as proxy:
        proxy.cut_at_packet("PUBACK", 3, B2C)            # drop the broker's 3rd PUBACK, cut
        client.connect(*proxy.address)
        ...
        assert [r.type for r in proxy.log if r.direction == B2C][:1] == ["CONNACK"]

It listens on 127.0.0.1 (a free port unless given). Every client connection
gets its own fresh upstream connection, so clients may reconnect at will. Each
direction ("c2b" client to broker, "b2c" broker to client) is split into whole
packets with tern.codec.frame_size (packets split across reads and several
packets in one read are both fine) and forwarded packet by packet, in order.

Faults, set from the test at any time:
- rules (`cut_after_bytes`, `cut_at_packet`, `stall_after_bytes`,
  `stall_at_packet`, `cut_at_random_packet`, `refuse_connections`) are copied
  into each connection when it is accepted: a change applies to the next
  connection, never to one already open. `connections=k` limits a rule to the
  next k connections (None: every later connection until `clear_rules()`).
  A rule fires at most once per connection.
- `stall(seconds)` blackholes the connections open now: nothing is forwarded
  but both sockets stay open; what arrived meanwhile is delivered when the
  stall ends (as TCP would after retransmission), unless a side gave up.
- `latency()` and `bandwidth()` shape traffic from the moment they are set, on
  open and later connections alike.
- `client_vanishes()`: a client that drops its connection without DISCONNECT
  (FIN or RST) vanishes instead of closing: the proxy closes its client side
  but leaves the broker's side open and silent (what the broker sends is
  dropped) until the broker gives up (keepalive x 1.5) or a new connection
  with the same client id takes the session over. That is what a board's
  power cut or a lost Wi-Fi link looks like to a broker; without it an
  emulated board's power cut, whose host kernel sends FIN at once, tells the
  broker at once.

Every forwarded packet is logged as a PacketRecord (monotonic time, connection
number, direction, type name, length, packet id); `events` records connections,
cuts, stalls and framing errors. `write_log(path)` writes JSON lines.
All random choices come from seeded `random.Random` instances.

CPython only (threads).
"""

from __future__ import annotations

import collections
import json
import os
import random
import select
import socket
import struct
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tern.codec import frame_size, packet_name
from tern.wire import (
    MQTTError, VARINT_MAX, DISCONNECT, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP,
    SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, get_varint, varint_size,
)

C2B = "c2b"
B2C = "b2c"
DIRECTIONS = (C2B, B2C)
_BOTH = "both"
_MAX_FRAME = VARINT_MAX + 5
_PID_TYPES = (PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK)
_TYPE_NAMES = {packet_name(t): t for t in range(1, 16)}


class ChaosError(RuntimeError):
    """The proxy could not start or was used wrongly."""


# ---------------------------------------------------------------- records

@dataclass(frozen=True)
class PacketRecord:
    """One packet the proxy forwarded in full."""
    t: float            # time.monotonic() just before its last byte went to the kernel
    conn: int           # connection number, from 1
    direction: str      # "c2b" or "b2c"
    type: str           # "CONNECT", "PUBACK", ...
    length: int         # bytes on the wire, fixed header included
    pid: int | None     # packet identifier, for packet types that carry one

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Event:
    """Something the proxy did or saw besides forwarding: accept, cut, stall, close."""
    t: float
    conn: int
    kind: str
    detail: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"t": self.t, "conn": self.conn, "event": self.kind, **self.detail}


def packet_id(frame: bytes) -> int | None:
    """The packet identifier of a whole frame, or None if its type has none."""
    try:
        t = frame[0] >> 4
        rl = get_varint(frame, 1, len(frame))
        if rl < 0:
            return None
        pos = 1 + varint_size(rl)
        if t == PUBLISH:
            if not (frame[0] >> 1) & 3:
                return None
            pos += 2 + (frame[pos] << 8 | frame[pos + 1])
        elif t not in _PID_TYPES:
            return None
        if pos + 2 > len(frame):
            return None
        return frame[pos] << 8 | frame[pos + 1]
    except (IndexError, MQTTError):
        return None


def _direction(d: str, allow_both: bool = False) -> str:
    if d in DIRECTIONS or (allow_both and d == _BOTH):
        return d
    allowed = ", ".join(repr(x) for x in DIRECTIONS + ((_BOTH,) if allow_both else ()))
    raise ValueError(f"direction must be one of {allowed}, not {d!r}")


def _dirs(d: str) -> tuple[str, ...]:
    return DIRECTIONS if _direction(d, True) == _BOTH else (d,)


def _ptype(t) -> int | None:
    if t is None:
        return None
    if isinstance(t, str) and t.upper() in _TYPE_NAMES:
        return _TYPE_NAMES[t.upper()]
    if isinstance(t, int) and not isinstance(t, bool) and 1 <= t <= 15:
        return t
    raise ValueError(f"packet type must be 1..15, a name such as 'PUBACK', or None for any, not {t!r}")


def _positive_int(name: str, n, minimum: int = 1) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, not {n!r}")
    return n


def _seconds(name: str, s) -> float:
    if not isinstance(s, (int, float)) or isinstance(s, bool) or not s >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {s!r}")
    return float(s)


def _connections(n) -> int | None:
    return None if n is None else _positive_int("connections", n)


# ---------------------------------------------------------------- rules

@dataclass
class Rule:
    """A fault armed for later connections. Made by the ChaosProxy methods."""
    kind: str                      # "cut", "stall" or "refuse"
    direction: str | None = None   # direction whose traffic triggers it
    ptype: int | None = None       # packet trigger: type (None = any type)
    nth: int | None = None         # packet trigger: the n-th matching packet
    nbytes: int | None = None      # byte trigger: after this many bytes
    forward: bool = False          # packet trigger: forward the packet first?
    seconds: float = 0.0           # stall duration
    stall_direction: str = _BOTH   # what a stall holds
    reset: bool = False            # cut with RST instead of FIN
    connections: int | None = None  # next k connections; None = all
    seed: int | None = None        # for rules chosen at random

    def describe(self) -> str:
        if self.kind == "refuse":
            return "refuse the connection"
        if self.nbytes is not None:
            trig = f"after {self.nbytes} bytes {self.direction}"
        else:
            what = packet_name(self.ptype) if self.ptype else "packet"
            trig = f"at {self.direction} {what} #{self.nth} ({'after' if self.forward else 'before'} forwarding it)"
        act = "cut" if self.kind == "cut" else f"stall {self.stall_direction} {self.seconds:g}s"
        return f"{act} {trig}"


class _Armed:
    """A rule's state within one connection."""
    __slots__ = ("rule", "count", "fired")

    def __init__(self, rule: Rule):
        self.rule = rule
        self.count = 0
        self.fired = False


# ---------------------------------------------------------------- connections

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
        self.armed = [_Armed(r) for r in rules]
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
            self.proxy._event(self.id, "closed", reason=reason, reset=reset,
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

    def stall(self, seconds: float, direction: str = _BOTH) -> None:
        until = time.monotonic() + seconds
        with self.cond:
            for d in _dirs(direction):
                self.stall_until[d] = max(self.stall_until[d], until)
            self.cond.notify_all()
        self.proxy._event(self.id, "stall", seconds=seconds, direction=direction)

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
                        self.proxy._event(self.id, "framing_error", direction=d, error=str(e),
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
            if d == C2B and self.proxy._vanish and isinstance(e, ConnectionResetError):
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
        p = self.proxy
        if (item.action is None and not p._latency[d] and not p._jitter[d] and not p._rate[d]
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
        delay = self.proxy._delay(d, self.rng[d])
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
            self.proxy._event(self.id, "cut", **detail)
            self.close("cut: " + r.describe(), reset=r.reset)
        else:
            self.proxy._event(self.id, "stall_rule", **detail)
            self.stall(r.seconds, r.stall_direction)

    def _vanish(self) -> bool:
        """The client's side ended: True if it vanishes (see ChaosProxy.client_vanishes) rather than
        closing, i.e. the broker's side is left open and silent."""
        if not self.proxy._vanish or self.last_type[C2B] == DISCONNECT:
            return False
        with self._close_lock:
            if self.closed.is_set():
                return True
            self.vanished = True
        self.proxy._event(self.id, "vanished", bytes_c2b=self.bytes_out[C2B], bytes_b2c=self.bytes_out[B2C])
        try:
            self._client.shutdown(socket.SHUT_RDWR)  # wakes a writer blocked on it
        except OSError:
            pass
        self._client.close()
        return True

    def _byte_rules(self, d: str) -> list[_Armed]:
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
            rate = self.proxy._rate[d]
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
                rec = self.proxy._record(self.id, d, item)
            try:
                dst.sendall(view[:chunk])
            except OSError:
                if rec is not None:
                    self.proxy._unrecord(rec)
                raise
            self.bytes_out[d] += chunk
            view = view[chunk:]
            if not view:
                self.last_type[d] = item.ptype
            if rate:
                self.next_send[d] = max(self.next_send[d], started) + chunk / rate
        return True


# ---------------------------------------------------------------- the proxy

class ChaosProxy:
    """See the module docstring. upstream: the broker's (host, port)."""

    host = "127.0.0.1"

    def __init__(self, upstream: tuple[str, int], *, port: int = 0, seed: int = 0,
                 connect_timeout: float = 5.0):
        if (not isinstance(upstream, (tuple, list)) or len(upstream) != 2
                or not isinstance(upstream[1], int)):
            raise ValueError(f"upstream must be (host, port), not {upstream!r}")
        if not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"port must be 0 (any free port) or 1..65535, not {port!r}")
        self.upstream = (str(upstream[0]), upstream[1])
        self.port = port
        self.seed = seed  # latency jitter: random.Random(f"{seed}/{conn}/{direction}")
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._latency = {d: 0.0 for d in DIRECTIONS}
        self._jitter = {d: 0.0 for d in DIRECTIONS}
        self._rate: dict[str, float | None] = {d: None for d in DIRECTIONS}
        self._vanish = False
        self._log: list[PacketRecord] = []
        self._events: list[Event] = []
        self.connections: list[Connection] = []
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # -- lifecycle
    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def start(self) -> "ChaosProxy":
        if self._thread is not None:
            return self
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            ls.bind((self.host, self.port))
        except OSError as e:
            ls.close()
            raise ChaosError(f"chaos proxy cannot listen on {self.host}:{self.port}: {e}") from None
        ls.listen(16)
        ls.settimeout(0.1)
        self.port = ls.getsockname()[1]
        self._listener = ls
        self._stopping.clear()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True, name="chaos-accept")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting and close every open connection (the port is kept for a later start())."""
        if self._thread is None:
            return
        self._stopping.set()
        self._thread.join(5)
        self._thread = None
        self._listener.close()
        self._listener = None
        for c in list(self.connections):
            c.close("proxy stopped")
        for c in list(self.connections):
            for t in c.threads:
                if t is not threading.current_thread():
                    t.join(2)

    def __enter__(self) -> "ChaosProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                time.sleep(0.05)
                continue
            self._handle(client)

    def _handle(self, client: socket.socket) -> None:
        client.settimeout(None)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            cid = len(self.connections) + 1
            rules = []
            for r in self._rules:
                rules.append(r)
                if r.connections is not None:
                    r.connections -= 1
            self._rules = [r for r in self._rules if r.connections is None or r.connections > 0]
        self._event(cid, "accepted", rules=[r.describe() for r in rules])
        if any(r.kind == "refuse" for r in rules):
            self._event(cid, "refused")
            client.close()
            self.connections.append(_Refused(cid, "refused"))
            return
        try:
            up = socket.create_connection(self.upstream, timeout=self.connect_timeout)
        except OSError as e:
            self._event(cid, "upstream_failed", error=str(e))
            client.close()
            self.connections.append(_Refused(cid, f"upstream failed: {e}"))
            return
        up.settimeout(None)
        up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Connection(self, cid, client, up, rules)
        self.connections.append(conn)
        conn.start()

    # -- records
    def _event(self, cid: int, kind: str, **detail) -> None:
        with self._lock:
            self._events.append(Event(time.monotonic(), cid, kind, detail))

    def _record(self, cid: int, d: str, item: _Item) -> None:
        rec = PacketRecord(time.monotonic(), cid, d, packet_name(item.ptype), len(item.data), item.pid)
        with self._lock:
            self._log.append(rec)
        return rec

    def _unrecord(self, rec: PacketRecord) -> None:
        with self._lock:
            try:
                self._log.remove(rec)
            except ValueError:
                pass

    @property
    def log(self) -> list[PacketRecord]:
        """Every packet forwarded so far, in forwarding order (a copy)."""
        with self._lock:
            return list(self._log)

    @property
    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def packets(self, direction: str | None = None, type=None, conn: int | None = None) -> list[PacketRecord]:
        """The log filtered by direction, packet type and connection number."""
        if direction is not None:
            _direction(direction)
        t = packet_name(_ptype(type)) if type is not None else None
        return [r for r in self.log
                if (direction is None or r.direction == direction)
                and (t is None or r.type == t) and (conn is None or r.conn == conn)]

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()
            self._events.clear()

    def write_log(self, path: str | os.PathLike, events: bool = False) -> Path:
        """The packet log as JSON lines (one object per packet; with events=True
        the events too, each with an "event" key), in time order."""
        items = [r.as_dict() for r in self.log]
        if events:
            items += [e.as_dict() for e in self.events]
            items.sort(key=lambda x: x["t"])
        path = Path(path)
        with open(path, "w") as f:
            for obj in items:
                f.write(json.dumps(obj) + "\n")
        return path

    def wait_for(self, predicate, timeout: float, interval: float = 0.01) -> bool:
        """Poll predicate() until it is true or timeout seconds pass."""
        deadline = time.monotonic() + timeout
        while True:
            if predicate():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)

    def live(self) -> list[Connection]:
        return [c for c in self.connections if not c.closed.is_set()]

    # -- shaping (applies at once, to open and later connections)
    def _delay(self, d: str, rng: random.Random) -> float:
        j = self._jitter[d]
        return self._latency[d] + (rng.uniform(0, j) if j else 0.0)

    def latency(self, seconds: float, direction: str = _BOTH, jitter: float = 0.0) -> None:
        """Hold every packet `seconds` (plus a uniform 0..jitter drawn from a
        stream seeded by the proxy's seed, the connection and the direction)
        before forwarding it; packets stay in order and are pipelined, so a round trip
        through both directions costs 2 x seconds."""
        seconds = _seconds("latency", seconds)
        jitter = _seconds("jitter", jitter)
        for d in _dirs(direction):
            self._latency[d] = seconds
            self._jitter[d] = jitter

    def bandwidth(self, bytes_per_second: float | None, direction: str = _BOTH) -> None:
        """Pace forwarding to this many bytes per second (None: unlimited)."""
        if bytes_per_second is not None and (not isinstance(bytes_per_second, (int, float))
                                             or isinstance(bytes_per_second, bool)
                                             or not bytes_per_second > 0):
            raise ValueError(f"bandwidth must be bytes per second > 0 or None, not {bytes_per_second!r}")
        for d in _dirs(direction):
            self._rate[d] = bytes_per_second

    def client_vanishes(self, on: bool = True) -> None:
        """From now on (open connections too), a client that ends its connection without DISCONNECT
        vanishes: its side is closed, the broker's is left open and silent (see the module docstring)."""
        self._vanish = bool(on)

    def stall(self, seconds: float, direction: str = _BOTH) -> int:
        """Blackhole the open connections for `seconds` from now (sockets stay
        open; data is held, not lost). Returns how many connections it hit."""
        seconds = _seconds("stall", seconds)
        _direction(direction, True)
        live = self.live()
        for c in live:
            c.stall(seconds, direction)
        return len(live)

    def cut_now(self, reset: bool = False) -> int:
        """Close every open connection now (both sides). Returns how many."""
        live = self.live()
        for c in live:
            c.close("cut now", reset=reset)
        return len(live)

    # -- rules (apply to connections accepted from now on)
    def _add(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    @property
    def rules(self) -> list[Rule]:
        with self._lock:
            return list(self._rules)

    def clear_rules(self) -> None:
        with self._lock:
            self._rules.clear()

    def reset(self) -> None:
        """No rules, no latency, no bandwidth limit, clients close again (open stalls run out)."""
        self.clear_rules()
        self._vanish = False
        self.latency(0.0)
        self.bandwidth(None)

    def cut_after_bytes(self, n: int, direction: str, *, reset: bool = False,
                        connections: int | None = None) -> Rule:
        """Forward exactly n bytes in `direction` (mid-packet if need be), then
        close both sides. n=0 cuts as soon as anything is to be forwarded."""
        return self._add(Rule("cut", _direction(direction), nbytes=_positive_int("n", n, 0),
                              reset=bool(reset), connections=_connections(connections)))

    def cut_at_packet(self, ptype, nth: int, direction: str, *, forward: bool = False,
                      reset: bool = False, connections: int | None = None) -> Rule:
        """At the nth packet of type `ptype` (None: of any type) in `direction`:
        forward=False drops it and cuts both sides; forward=True forwards it, then cuts."""
        return self._add(Rule("cut", _direction(direction), ptype=_ptype(ptype),
                              nth=_positive_int("nth", nth), forward=bool(forward), reset=bool(reset),
                              connections=_connections(connections)))

    def stall_at_packet(self, ptype, nth: int, direction: str, seconds: float, *,
                        forward: bool = False, stall_direction: str = _BOTH,
                        connections: int | None = None) -> Rule:
        """At the nth packet of `ptype` in `direction`, blackhole `stall_direction`
        for `seconds`, holding that packet too unless forward=True."""
        return self._add(Rule("stall", _direction(direction), ptype=_ptype(ptype),
                              nth=_positive_int("nth", nth), forward=bool(forward),
                              seconds=_seconds("stall", seconds),
                              stall_direction=_direction(stall_direction, True),
                              connections=_connections(connections)))

    def stall_after_bytes(self, n: int, direction: str, seconds: float, *,
                          stall_direction: str = _BOTH, connections: int | None = None) -> Rule:
        """After n bytes in `direction`, blackhole `stall_direction` for `seconds`."""
        return self._add(Rule("stall", _direction(direction), nbytes=_positive_int("n", n, 0),
                              seconds=_seconds("stall", seconds),
                              stall_direction=_direction(stall_direction, True),
                              connections=_connections(connections)))

    def refuse_connections(self, connections: int = 1) -> Rule:
        """Accept the next `connections` clients and close them at once, without
        connecting upstream (what a broker that is down behind a load balancer looks like)."""
        return self._add(Rule("refuse", connections=_positive_int("connections", connections)))

    def cut_at_random_packet(self, seed: int, *, direction: str | None = None, types=None,
                             max_nth: int = 10, forward: bool | None = None, reset: bool = False,
                             connections: int | None = 1) -> Rule:
        """cut_at_packet with the choices made by random.Random(seed): the
        direction (unless given), the type (one of `types`, or any packet when
        types is None), nth in 1..max_nth and, unless given, before or after
        forwarding. The same seed always gives the same rule; the rule is returned
        (see Rule.describe()). If the session is shorter, it never fires."""
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"seed must be an int, not {seed!r}")
        rng = random.Random(seed)
        d = _direction(direction) if direction is not None else rng.choice(DIRECTIONS)
        t = None
        if types is not None:
            types = [_ptype(x) for x in types]
            if not types:
                raise ValueError("types must name at least one packet type (or be None for any)")
            t = rng.choice(types)
        nth = rng.randint(1, _positive_int("max_nth", max_nth))
        fwd = rng.random() < 0.5 if forward is None else bool(forward)
        return self._add(Rule("cut", d, ptype=t, nth=nth, forward=fwd, reset=bool(reset),
                              connections=_connections(connections), seed=seed))


class _Refused:
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
