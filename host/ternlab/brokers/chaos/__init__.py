"""Chaos proxy: a TCP proxy between an MQTT client and its broker that understands
MQTT framing and breaks the connection on cue.

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

The package, by job: `rules` (the directions, the faults a test arms and their checks), `log` (the
packet records and events), `relay` (one client connection and its upstream: the threads that
split, hold and forward), `proxy` (ChaosProxy: the listener, the rules handed to each connection,
traffic shaping). Import from here.
"""

from .log import Event, PacketLog, PacketRecord, packet_id  # noqa: F401
from .proxy import ChaosProxy  # noqa: F401
from .relay import Connection, Shaping  # noqa: F401
from .rules import B2C, C2B, DIRECTIONS, ChaosError, Rule  # noqa: F401
