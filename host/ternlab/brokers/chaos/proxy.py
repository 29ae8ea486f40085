"""ChaosProxy: the listener, the rules it hands each connection it accepts, traffic shaping, and the
calls a test makes (the package's docstring says what each fault does)."""

from __future__ import annotations

import random
import socket
import threading
import time

from .log import PacketLog
from .relay import Connection, Refused, Shaping
from .rules import (
    BOTH, DIRECTIONS, ChaosError, Rule, check_connections, check_direction, check_positive_int, check_ptype,
    check_seconds, directions,
)


class ChaosProxy(PacketLog):
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
        PacketLog.__init__(self)
        self._rules: list[Rule] = []
        self.shaping = Shaping()
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
        self.note(cid, "accepted", rules=[r.describe() for r in rules])
        if any(r.kind == "refuse" for r in rules):
            self.note(cid, "refused")
            client.close()
            self.connections.append(Refused(cid, "refused"))
            return
        try:
            up = socket.create_connection(self.upstream, timeout=self.connect_timeout)
        except OSError as e:
            self.note(cid, "upstream_failed", error=str(e))
            client.close()
            self.connections.append(Refused(cid, f"upstream failed: {e}"))
            return
        up.settimeout(None)
        up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Connection(self, cid, client, up, rules)
        self.connections.append(conn)
        conn.start()

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
    def latency(self, seconds: float, direction: str = BOTH, jitter: float = 0.0) -> None:
        """Hold every packet `seconds` (plus a uniform 0..jitter drawn from a
        stream seeded by the proxy's seed, the connection and the direction)
        before forwarding it; packets stay in order and are pipelined, so a round trip
        through both directions costs 2 x seconds."""
        seconds = check_seconds("latency", seconds)
        jitter = check_seconds("jitter", jitter)
        for d in directions(direction):
            self.shaping.latency[d] = seconds
            self.shaping.jitter[d] = jitter

    def bandwidth(self, bytes_per_second: float | None, direction: str = BOTH) -> None:
        """Pace forwarding to this many bytes per second (None: unlimited)."""
        if bytes_per_second is not None and (not isinstance(bytes_per_second, (int, float))
                                             or isinstance(bytes_per_second, bool)
                                             or not bytes_per_second > 0):
            raise ValueError(f"bandwidth must be bytes per second > 0 or None, not {bytes_per_second!r}")
        for d in directions(direction):
            self.shaping.rate[d] = bytes_per_second

    def client_vanishes(self, on: bool = True) -> None:
        """From now on (open connections too), a client that ends its connection without DISCONNECT
        vanishes: its side is closed, the broker's is left open and silent (see the module docstring)."""
        self.shaping.vanish = bool(on)

    def stall(self, seconds: float, direction: str = BOTH) -> int:
        """Blackhole the open connections for `seconds` from now (sockets stay
        open; data is held, not lost). Returns how many connections it hit."""
        seconds = check_seconds("stall", seconds)
        check_direction(direction, True)
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
        self.shaping.vanish = False
        self.latency(0.0)
        self.bandwidth(None)

    def cut_after_bytes(self, n: int, direction: str, *, reset: bool = False,
                        connections: int | None = None) -> Rule:
        """Forward exactly n bytes in `direction` (mid-packet if need be), then
        close both sides. n=0 cuts as soon as anything is to be forwarded."""
        return self._add(Rule("cut", check_direction(direction), nbytes=check_positive_int("n", n, 0),
                              reset=bool(reset), connections=check_connections(connections)))

    def cut_at_packet(self, ptype, nth: int, direction: str, *, forward: bool = False,
                      reset: bool = False, connections: int | None = None) -> Rule:
        """At the nth packet of type `ptype` (None: of any type) in `direction`:
        forward=False drops it and cuts both sides; forward=True forwards it, then cuts."""
        return self._add(Rule("cut", check_direction(direction), ptype=check_ptype(ptype),
                              nth=check_positive_int("nth", nth), forward=bool(forward), reset=bool(reset),
                              connections=check_connections(connections)))

    def stall_at_packet(self, ptype, nth: int, direction: str, seconds: float, *,
                        forward: bool = False, stall_direction: str = BOTH,
                        connections: int | None = None) -> Rule:
        """At the nth packet of `ptype` in `direction`, blackhole `stall_direction`
        for `seconds`, holding that packet too unless forward=True."""
        return self._add(Rule("stall", check_direction(direction), ptype=check_ptype(ptype),
                              nth=check_positive_int("nth", nth), forward=bool(forward),
                              seconds=check_seconds("stall", seconds),
                              stall_direction=check_direction(stall_direction, True),
                              connections=check_connections(connections)))

    def stall_after_bytes(self, n: int, direction: str, seconds: float, *,
                          stall_direction: str = BOTH, connections: int | None = None) -> Rule:
        """After n bytes in `direction`, blackhole `stall_direction` for `seconds`."""
        return self._add(Rule("stall", check_direction(direction), nbytes=check_positive_int("n", n, 0),
                              seconds=check_seconds("stall", seconds),
                              stall_direction=check_direction(stall_direction, True),
                              connections=check_connections(connections)))

    def refuse_connections(self, connections: int = 1) -> Rule:
        """Accept the next `connections` clients and close them at once, without
        connecting upstream (what a broker that is down behind a load balancer looks like)."""
        return self._add(Rule("refuse", connections=check_positive_int("connections", connections)))

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
        d = check_direction(direction) if direction is not None else rng.choice(DIRECTIONS)
        t = None
        if types is not None:
            types = [check_ptype(x) for x in types]
            if not types:
                raise ValueError("types must name at least one packet type (or be None for any)")
            t = rng.choice(types)
        nth = rng.randint(1, check_positive_int("max_nth", max_nth))
        fwd = rng.random() < 0.5 if forward is None else bool(forward)
        return self._add(Rule("cut", d, ptype=t, nth=nth, forward=fwd, reset=bool(reset),
                              connections=check_connections(connections), seed=seed))
