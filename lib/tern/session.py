"""The MQTT protocol engine, without I/O: it is fed received bytes and the time (milliseconds), and it
hands bytes to `send(buf, off, n)`, messages to handlers, events to `on_event(kind, a, b)`, and
tells when it next needs the clock. No sockets, no clocks, no files: drivers own those, which is
what lets the same engine run on a board, on a host and under fault injection.

Over 600 lines (up to the 1,200 the project allows session.py) because the steady path (send ring,
window, receive buffer, dispatch) is one class whose methods read the same fields for every message:
split by job, each part would reach into the others' fields or cost a call per message on the
device. What a connected client never runs is out (tern.handshake, replay, v5, fault, manual,
refused, through the interface in Session's docstring); a third of the lines are comments.

Write-ahead: a QoS 1/2 PUBLISH, SUBSCRIBE or UNSUBSCRIBE goes into the store before its first byte
is sent and leaves it on its acknowledgement. The send order lives in a ring of packet identifiers
(3 bytes per pending message); a reconnect replays the ring in order: PUBREL for QoS 2 messages
whose PUBREC was seen, the PUBLISH with DUP set for the rest; nothing on a live connection.

Inbound QoS 2 is delivered once: the packet identifier is made durable before the handler runs and
PUBREC is sent after it; a repeat of that identifier is answered with PUBREC again and not
delivered. A power cut while the handler runs therefore loses that one delivery rather than
repeating it (which is what keeps a `reboot` command from looping); manual acknowledgement reverses
this for applications that make their own write durable first.
"""

from .wire import const, MQTTError
from . import pkt
from .pkt import pub_head
from .topic import matches_bytes, validate_name

try:
    from time import ticks_diff
except ImportError:  # CPython: the driver's clock does not wrap, a plain a - b will do
    from operator import sub as ticks_diff


# Packet types and property identifiers as private constants: folded into the bytecode, so they cost
# no module globals on a board.
_CONNACK = const(2)
_PUBLISH = const(3)
_PUBACK = const(4)
_PUBREC = const(5)
_PUBREL = const(6)
_PUBCOMP = const(7)
_SUBACK = const(9)
_UNSUBACK = const(11)
_PINGRESP = const(13)
_DISCONNECT = const(14)
_AUTH = const(15)
_V5 = const(5)
_PROTOCOL_ERROR = const(0x82)
_P_SESSION_EXPIRY = const(0x11)
_P_RECEIVE_MAX = const(0x21)
_P_ALIAS_MAX = const(0x22)
_P_ALIAS = const(0x23)
_P_MAX_PACKET = const(0x27)

# The connection's states (public names, as for the events, publish()'s WOULD_BLOCK: tern.events,
# served below; CONNECTING is private: no driver needs to tell it apart) ...
_DISCONNECTED = const(0)
_CONNECTING = const(1)
_CONNECTED = const(2)
# ... the events that move it (go()) ...
_E_CONNECT = const(0)  # connect_packet(): CONNECT sent
_E_ACCEPT = const(1)  # a CONNACK accepting it (tern.handshake)
_E_REFUSE = const(2)  # a CONNACK refusing it (tern.handshake)
_E_LOST = const(3)  # connection_lost(): the transport is gone, a DISCONNECT, a protocol violation
_NO = const(255)  # an event that cannot happen in that state
# ... and the inbound packet types each reads (bit t: packet type t), any other being a protocol
# violation (tern.fault.unexpected); DISCONNECTED reads what a feed under way still holds. The table of
# states and events is Session.go's (a constant in its bytecode, not a module global on the heap).
_READS_CONNECTING = const(1 << _CONNACK | 1 << _AUTH)
_READS_OTHERS = const(0xFFFF ^ 1 << _CONNACK)

# Events for on_event(kind, a, b) (what a and b are: tern.events).
_EV_CONNACK = const(1)
_EV_PUBLISHED = const(2)
_EV_SUBACK = const(3)
_EV_UNSUBACK = const(4)
_EV_DISCONNECT = const(5)
_EV_AUTH = const(7)
_EV_LOST = const(8)

# Ring entry flags (the states they make and the transitions between them: tern.replay's docstring).
_SENT = const(1)  # sent on this connection
_QOS2 = const(2)
_MARKED = const(4)  # PUBREC seen
_CTRL = const(8)  # SUBSCRIBE or UNSUBSCRIBE
_EVER = const(16)  # sent on some connection (a resend carries DUP)
_OLD = const(32)  # an MQTT 5 PUBLISH stored before this connection: sent without its Topic Alias (tern.v5.unaliased)
_GONE = const(64)  # given back at a CONNACK, released once the application was told (with _SENT | _CTRL: never sent)
_TOLD = const(128)  # and told

_WOULD_BLOCK = const(-1)
_SLOW = const(-2)  # pub0: not the steady case, publish() is to do it (the drivers know the value)

_BUFFERS = (bytes, bytearray, memoryview)  # what a payload may be (a tuple built once: see publish)


def __getattr__(name):  # the public states, events and WOULD_BLOCK (tern.events: why not globals)
    from . import events
    return getattr(events, name)


class NotConnected(OSError):
    pass


class Session:
    """One MQTT session. See the module docstring for the I/O contract.

    rx_size: the receive buffer, the largest packet taken (1 KiB, esp-mqtt's default: a board's
    commands and settings; announced as Maximum Packet Size under MQTT 5; a PUBLISH over it under
    3.1.x is dropped and acknowledged: stats_dropped); tx_size: the transmit buffer (a longer packet
    leaves in two writes). topic_alias_max: topic aliases the server may use towards us (inbound,
    announced in CONNECT). outbound_aliases: how many we may use towards the server (MQTT 5; 0 = off,
    the default), capped by the Topic Alias Maximum in its CONNACK; only QoS 0 messages carry one
    (tern.v5.alias_out says why and how). auth: enhanced authentication (MQTT 5), a hook,
    auth(reason, props) -> props (tern.handshake's docstring says how it is called).

    Counters: stats_recovered (messages found in the store at start), stats_resent (messages
    replayed after reconnects), stats_dropped (inbound messages over the receive buffer, MQTT 3.1.x:
    discarded and acknowledged), stats_deferred (inbound QoS 2 messages over receive_max on a
    persistent session, left for the broker to resend: see _admit).

    The helper modules (tern.handshake, tern.v5, tern.fault, tern.manual, tern.refused: paths a
    plain connected client never runs, loaded on first use) are functions of the session and use
    this interface of it, and nothing that starts with an underscore (but tern.replay, the send
    ring's cold half, which works on the ring itself: _ring, _rflags, _head, _n, _cap, _unsent,
    _uctl, _inflight, _limit, _late, _gone, _next_sid, _oalias, _oalias_cap (and tern.v5.alias_out
    these two); _push, _free, _find, _alloc_pid, _pump; its docstring has the ring's lifecycle): go(event) (the state table),
    violation(), send_packet(), send_ack(), out(), emit(); the records conn (what CONNECT carries),
    subs (the subscriptions), in_aliases (inbound topic aliases), inq (manual acknowledgements), inids; the
    counters in2 (inbound QoS 2 ids held) and deferred; stale, ephemeral; skip and skip_id (an oversize PUBLISH
    being discarded); tx and last_tx."""

    def __init__(self, client_id="", version=4, clean=True, keepalive=60, store=None,
                 window=16, rx_size=1024, tx_size=512, max_pending=256, session_expiry=None,
                 username=None, password=None, will_topic=None, will_payload=b"", will_qos=0,
                 will_retain=False, will_props=None, connect_props=None, topic_alias_max=0,
                 manual_ack=False, auth=None, ping_timeout=None, outbound_aliases=0, receive_max=32):
        if version not in (3, 4, 5):
            raise ValueError("protocol version must be 3 (3.1), 4 (3.1.1) or 5")
        if not client_id and version < _V5 and not clean:
            # [MQTT-3.1.3-7] (an MQTT 3.1 client gets a random one: tern.refused.set_version)
            raise ValueError("an empty client id needs a clean session before MQTT 5")
        if will_topic is not None:
            try:
                validate_name(will_topic)
            except ValueError as e:
                raise ValueError("will " + e.args[0])
        self.client_id = client_id
        self.version = version
        self.keepalive = keepalive
        if store is None:  # loaded only when used: a board with a flash store does not carry it
            from .store import MemoryStore

            store = MemoryStore()
        self.store = self.inids = store  # inids: where inbound QoS 2 ids are looked up (tern.fault.InOverflow)
        self.window = window
        self._limit = window  # what may be in flight: the window, capped by the server's Receive Maximum
        # What CONNECT carries besides client_id (which the server may assign in CONNACK), keepalive
        # last: a CONNACK's Server Keep Alive replaces self.keepalive for that connection only; its
        # properties are connect_props as given plus what the session announces (MQTT 5).
        self.conn = (clean, username, password, will_topic, will_payload, will_qos, will_retain, will_props, keepalive)
        props = dict(connect_props) if connect_props else {}
        if version == _V5:
            if session_expiry:
                props[_P_SESSION_EXPIRY] = session_expiry
            props[_P_MAX_PACKET] = rx_size - 8  # (slack for brokers that count short: README, "larger than")
            # the inbound QoS 2 cap (see _admit); one given in connect_props is the cap
            receive_max = props.setdefault(_P_RECEIVE_MAX, receive_max)
            if topic_alias_max:
                props[_P_ALIAS_MAX] = topic_alias_max
        self.connect_props = props or None
        self.topic_alias_max = topic_alias_max
        self.receive_max = receive_max
        self._in_cap = 4 * receive_max if receive_max > 32 else 128  # see _admit
        self.in2 = 0  # inbound QoS 2 ids recorded on this session and not yet released
        self.deferred = 0  # inbound QoS 2 messages over receive_max on this connection (not taken)
        self.stale = False  # inbound QoS 2 ids of a broker session that is gone, not yet cleared (tern.handshake)
        self.auth = auth  # enhanced authentication hook: auth(reason, props) -> props
        self.outbound_aliases = outbound_aliases
        self._oalias = None  # topic bytes -> encoded property block with its alias (this connection)
        self._oalias_cap = 0
        self.reauthing = False  # a re-authentication is under way (the drivers wait for its end)
        self.ping_timeout = ping_timeout
        self.send = None  # send(buf, off, n), set by the driver
        self.on_message = None  # default handler
        self.on_event = None
        self.state = _DISCONNECTED
        self._reads = _READS_OTHERS  # the packet types this state reads (see go)
        # Message is imported here, where it is used once: a module global fewer (see tern.events).
        from .message import Message

        self.rx = bytearray(rx_size)
        self.rx_len = 0
        self._rpos = -1  # where feed_n reads next; -1: no feed under way
        self.rxmv = memoryview(self.rx)  # rx as a view: drivers read into rxmv[rx_len:] (see feed_n)
        self.tx = bytearray(tx_size)
        self._txmv = memoryview(self.tx)  # a slice store into a view allocates nothing on MicroPython
        self._txn = 0  # bytes of packets queued at the start of _tx while a feed is under way (see flush)
        self._msg = Message()
        self._depth = 0  # message handlers under way: >0 while a handler's blocking call reads on
        self._held = []  # acks of messages read under a handler: they leave after its own (arrival order)
        self._cache = {}  # steady-path allocations made once, by topic (str or bytes): see publish
        self._hviews = {}  # views of the transmit buffer by header length (see publish): not in _cache, where an int topic would find one
        # the ring: its head; slots in use (released ones inside count until trimmed); messages in
        # flight; entries not sent on this connection, and of those SUBSCRIBE or UNSUBSCRIBE ones
        self._head = self._n = self._inflight = self._unsent = self._uctl = 0
        self.subs = []
        self._gone = []  # filters unsubscribed while offline: UNSUBSCRIBE when the broker kept the session
        self._late = False  # False: nothing waits for _send_late (it ran to its end since)
        self._next_sid = 1
        self.in_aliases = None
        # With manual_ack, the queue of acknowledgements in arrival order: [pid, ack type, reason
        # code to send, or -1 until the app's ack()].
        self.inq = [] if manual_ack else None
        self.last_tx = 0
        self._ping_sent = -1
        self.server = {}  # the last CONNACK's properties (MQTT 5)
        self.max_qos = 2
        self.retain_ok = self.sid_ok = self.wildcard_ok = self.shared_ok = True
        self.session_present = False
        self.stats_resent = self.stats_dropped = self.stats_deferred = 0
        self.skip = 0  # bytes of an oversize inbound PUBLISH still to discard
        self.skip_id = 0  # its QoS << 16 | packet id
        # The send ring, rebuilt from what the store recovered (after a reboot): tern.replay.
        import tern.replay

        tern.replay.boot(self, max_pending)

    # ------------------------------------------------------------- send ring

    def _push(self, pid, f):
        i = (self._head + self._n) % self._cap
        self._ring[i] = pid
        self._rflags[i] = f
        self._n += 1
        self._unsent += 1
        if f & _CTRL:
            self._uctl += 1

    def _find(self, pid):
        cap = self._cap
        i = self._head
        k = self._n
        ring = self._ring
        while k:
            if ring[i] == pid:
                return i
            i += 1
            if i == cap:
                i = 0
            k -= 1
        return -1

    def _free(self, i):
        # Release ring slot i and its record; trim released slots off the head.
        ring = self._ring
        self.store.release(ring[i])
        ring[i] = 0
        self._rflags[i] = 0
        while self._n and ring[self._head] == 0:
            self._head = (self._head + 1) % self._cap
            self._n -= 1

    def pending(self):
        """Packet identifiers of everything not yet acknowledged, in send order."""
        out = []
        i = self._head
        for _ in range(self._n):
            if self._ring[i]:
                out.append(self._ring[i])
            i = (i + 1) % len(self._rflags)
        return out

    def _alloc_pid(self):
        p = self._last_pid
        st = self.store
        for _ in range(65535):
            p = p % 65535 + 1
            if not st.has(p):
                self._last_pid = p
                return p
        raise OSError("no free packet identifier")

    # ------------------------------------------------------------------ output

    # While a feed is under way (_rpos >= 0), what the acknowledgements of our own messages trigger
    # (PUBREL, and the messages an acknowledgement lets out of the window) is queued in _tx, one
    # packet behind the other, and handed over in one write when the feed ends: one write per read
    # of acknowledgements rather than one per packet. Whatever else is sent (an acknowledgement of
    # an inbound message, publish, CONNECT, PINGREQ) flushes the queue first, so order is kept.

    def flush(self):
        """Hand over the packets queued during a feed. feed_n does it when it ends; a driver that waits
        for input inside a feed (a handler's blocking call) does it before it waits."""
        n = self._txn
        if n:
            self._txn = 0
            self.out(self.tx, 0, n)

    def out(self, buf, off, n):
        # The write-ahead rule, for every packet in one place: whatever the store holds uncommitted
        # (group commit: the mark a PUBREL announces, the inbound id a PUBREC does, its release a
        # PUBCOMP does, the record of a PUBLISH, SUBSCRIBE or UNSUBSCRIBE) is made durable before a
        # byte leaves, and after a storage failure the ring follows what the store holds (_settle).
        # A store with nothing buffered answers by an attribute.
        if self.store.dirty:
            self._settle()
        self.send(buf, off, n)

    def _settle(self):
        # Commit; and when the store read its medium again after a failure (epoch moved on: see
        # lib/tern/store.py), follow it before anything more is built from the ring.
        st = self.store
        st.commit()
        if st.epoch != st.seen:
            import tern.replay  # (the ring's cold half: it releases itself after)

            tern.replay.follow(self)

    def send_ack(self, ptype, pid, reason, now):
        # A PUBREL (our QoS 2 flow) waits with the rest of what the read released; the
        # acknowledgement of an inbound message leaves at once: the broker may be holding its next
        # messages until it comes (a full window), and QoS 0 ones would then overtake them. Either
        # goes after the messages that acknowledgements read before its trigger let out of the
        # window (trigger order; see _on_ack): a PUBREL from the ring (_send_ring) is not pumped
        # for, the others are.
        if ptype != _PUBREL:
            self._pump(now)
        q = ptype == _PUBREL and self._rpos >= 0
        k = self._txn
        if not q or k + 5 > len(self.tx):
            self.flush()
            k = 0
        k += pkt.ack_into(self.tx, ptype, pid, reason, self.version, k)
        if q:
            self._txn = k
        else:
            self.out(self.tx, 0, k)
        self.last_tx = now

    def send_packet(self, p, now):
        b = pkt.encode(p, self.version)
        mx = self.server.get(_P_MAX_PACKET, 268435460)
        if len(b) > mx:
            raise ValueError("packet of %d bytes is over the server's maximum packet size %d" % (len(b), mx))
        self.flush()
        self.out(b, 0, len(b))
        self.last_tx = now

    def violation(self, code, msg, now):
        """The server broke the protocol: tell it why (MQTT 5) and stop."""
        if self.state != _DISCONNECTED and self.version == _V5 and self.send:
            try:
                self.send_packet(pkt.Packet(_DISCONNECT, reason=code), now)
            except Exception:
                pass
        self.connection_lost()
        raise MQTTError(code, msg)

    # ---------------------------------------------------------------- connect

    def connect_packet(self, now):
        """Send CONNECT; the driver calls this right after the socket opens."""
        # Unread bytes belong to the old connection; under a feed (a handler that reconnected) what
        # it has read stays, for the handlers under way.
        self.rx_len = self._rpos if self._rpos > 0 else 0
        self._txn = 0
        self._ping_sent = -1
        self.reauthing = False
        import tern.handshake  # (it releases itself once the CONNACK is read)

        tern.handshake.connect(self, now)  # CONNECTING, and the CONNECT sent

    def _pump(self, now):
        """Send what the window allows, oldest first: a PUBREL for a QoS 2 message whose PUBREC was
        seen, else the stored packet as it is (with DUP when a PUBLISH went out before). Nothing can
        while the window is full and no SUBSCRIBE waits (PUBRELs count in the window): told here, in
        a call that costs little."""
        if self.state == _CONNECTED and self._unsent and (self._inflight < self._limit or self._uctl):
            self._send_ring(now)

    def _send_ring(self, now):
        st = self.store
        if st.dirty:
            self._settle()  # (the records are read below, before out() would)
        limit = self._limit
        tx = self.tx
        flags = self._rflags
        ring = self._ring
        cap = self._cap
        # Messages leave in ring order and the pump stops at the first that may not (a SUBSCRIBE
        # beyond a full window may go on: it is outside it), and only sent ones are released on a
        # live connection: the unsent ones are the last _unsent slots. Start there when the slot
        # before them is a sent message, not a control packet (the steady state), else (released
        # slots among unsent ones, after a CONNACK, a SUBSCRIBE sent past a full window) from the
        # head.
        d = self._n - self._unsent
        i = (self._head + d - 1) % cap
        if d <= 0 or not (ring[i] and flags[i] & _SENT and not flags[i] & _CTRL):
            d = 0
        i = (self._head + d) % cap
        for _ in range(self._n - d):
            pid = ring[i]
            f = flags[i]
            if pid and not f & _SENT:
                if f & _CTRL:
                    self._uctl -= 1
                elif self._inflight < limit:
                    self._inflight += 1
                elif self._uctl:  # the window is full; a SUBSCRIBE further on is outside it
                    i = (i + 1) % cap
                    continue
                else:
                    return
                if f & _MARKED:
                    self.send_ack(_PUBREL, pid, 0, now)
                elif f & _OLD and __import__("tern.v5").v5.unaliased(self, pid, f & _EVER, now):
                    # (tern.v5.unaliased sent it; __import__, not a method: one function object
                    # fewer on a board's heap)
                    pass
                else:
                    size = st.size(pid)
                    k = self._txn
                    q = self._rpos >= 0 and size <= len(tx)  # queued (see flush)
                    if k and (not q or k + size > len(tx)):
                        self.flush()
                        k = 0
                    off = 0
                    while off < size:
                        at = k + off if q else 0
                        n = st.read(pid, off, self._txmv[at:] if at else tx)
                        if not n:
                            raise OSError("store returned a short record for packet %d" % pid)
                        if off == 0 and f & _EVER and not f & _CTRL:
                            tx[at] |= 8  # DUP
                        off += n
                        if not q:
                            self.out(tx, 0, n)
                    if q:
                        self._txn = k + size
                    self.last_tx = now
                flags[i] = (f | _SENT | _EVER) & ~_OLD
                self._unsent -= 1
                if not self._unsent:
                    return
            i += 1
            if i == cap:
                i = 0

    # ---------------------------------------------------------------- publish

    def publish(self, topic, payload, qos, retain, now, props=None):
        """Queue or send one message. Returns its packet id (0 for QoS 0), or WOULD_BLOCK when ordering
        or the outbox's size says to wait. A QoS 1/2 message once stored is accepted even if the
        connection fails while it is sent (the session disconnects and reports EV_LOST).

        topic: bytes (zero allocation) or str; props: a dict of MQTT 5 properties or None."""
        # (The steady path counts calls: on a Cortex-M3 a Python call costs some 700 instructions, a
        # builtin such as len() 450, an attribute 150; what a message does not need is off it.) The
        # steady route first, as Client.publish takes it (pub0, pub1: their guards, the
        # store-then-send order, and send_failed, the one error contract); what it does not take
        # (-2, nothing stored or sent) goes on here.
        if (qos == 0 or qos == 1) and not (retain or props) and isinstance(payload, _BUFFERS) and (
                isinstance(topic, str) or isinstance(topic, bytes)):
            try:
                pid = self.pub1(topic, payload) if qos else self.pub0(topic, payload)
            except OSError as e:
                if qos:
                    raise  # pub1: the store failed, nothing accepted
                self.send_failed(e, 0)  # pub0: the send failed (raises)
            if pid != _SLOW:
                self.last_tx = now
                if pid:
                    try:
                        self.flush()  # pub1's packet
                    except OSError as e:
                        self.send_failed(e, 1)
                return pid
        if qos < 0 or qos > 2:
            raise ValueError("QoS must be 0, 1 or 2")
        if not isinstance(payload, _BUFFERS) or isinstance(payload, memoryview) and (
                getattr(payload, "itemsize", 1) != 1 or getattr(payload, "format", "B") != "B"):
            # (before anything is stored: a bad record corrupts the log; a memoryview's len() counts items)
            raise TypeError("payload must be bytes, bytearray, str or a memoryview of bytes, not %s" % type(payload).__name__)
        if self._txn:
            self.flush()  # called from a handler: what the feed queued goes first (the header takes _tx)
        # Devices publish to a handful of topics: validate (and encode) each once, so a str or bytes
        # topic costs no allocation on the steady path.
        try:
            t = self._cache.get(topic)
        except TypeError:  # a bytearray or memoryview: not a key, checked every time
            t = None
        topic = self._topic(topic, props) if t is None else t
        # What the server's last CONNACK said it supports (MQTT 5; before any CONNACK everything is
        # allowed): refused here, before a byte is sent or stored, rather than by a DISCONNECT from
        # the server.
        if qos > self.max_qos:
            raise ValueError("the server accepts QoS up to %d (CONNACK Maximum QoS)" % self.max_qos)
        if retain and not self.retain_ok:
            raise ValueError("the server does not support retained messages (CONNACK Retain Available = 0)")
        tx = self.tx
        pblock = None  # the encoded properties: MQTT 5 only (b"\x00": none)
        if props:
            import tern.v5

            pblock = tern.v5.publish_props(self, topic, payload, qos, props)
        elif self.version == _V5:
            pblock = b"\x00"
        plen = len(payload)
        mx = self.server.get(_P_MAX_PACKET)  # (only an MQTT 5 CONNACK sets one)
        size = 0  # the packet's, when the server said its maximum
        if mx:
            size = 2 + len(topic) + (2 if qos else 0) + len(pblock) + plen  # the remaining length
            size += 1 + pkt.varint_size(size)  # and the fixed header
            if size > mx:
                raise ValueError("packet of %d bytes is over the server's maximum packet size %d" % (size, mx))
        if not qos:
            if self.state != _CONNECTED:
                raise NotConnected("not connected: QoS 0 messages are not kept")
            # Keep order behind queued messages (and, with a window of 1, behind the one in flight).
            if self._unsent or (self._inflight and self._limit == 1):
                return _WOULD_BLOCK
            if self._oalias_cap and not (props and _P_ALIAS in props):
                import tern.v5  # (an outbound Topic Alias: see the class docstring)

                topic, pblock = tern.v5.alias_out(self, topic, props, pblock, size, mx)
            n = pkt.pub_head(tx, topic, 0x31 if retain else 0x30, 0, plen, pblock)
            pid = 0
        else:
            if self._n >= self._cap:
                return _WOULD_BLOCK
            pid = self._alloc_pid()
            n = pkt.pub_head(tx, topic, 0x30 | qos << 1 | (1 if retain else 0), pid, plen, pblock)
            if n + plen <= len(tx):  # the payload in first: one it cannot copy (a memoryview of wider
                self._txmv[n : n + plen] = payload  # items, where it has no itemsize) raises unstored
            # The store takes the header as a buffer of n bytes: one view of tx per header length, kept.
            c = self._hviews
            v = c.get(n)
            if v is None:
                if len(c) >= 24:
                    c.clear()
                v = c[n] = memoryview(tx)[:n]
            st = self.store
            st.append(_PUBLISH, pid, v, payload)
            # Durable before publish() returns, online or not (group commit: offline, no packet
            # would commit it until the next CONNACK); a store failure is not an acceptance.
            if st.dirty:
                st.commit()
            self._push(pid, _QOS2 if qos == 2 else 0)
            if self.state != _CONNECTED:
                return pid
            if self._unsent > 1 or self._inflight >= self._limit:
                try:
                    self._pump(now)  # (whatever the window lets out, in ring order)
                except OSError as e:
                    self.send_failed(e, qos)
                return pid
            # The only message waiting, inside the window: sent as _send_ring would send it, from
            # the header still in tx and the payload (the record's bytes, now stored), rather than
            # read back from the store.
            self._rflags[(self._head + self._n - 1) % self._cap] |= _SENT | _EVER
            self._unsent = 0
            self._inflight += 1
        if n + plen <= len(tx):
            # One write per packet: a header and a payload written apart leave as two segments, and
            # where Nagle's algorithm is on the second waits for the peer's (delayed) ACK of the first.
            if not qos:  # (QoS 1/2: copied in before it was stored)
                self._txmv[n : n + plen] = payload
            n += plen
            plen = 0
        try:
            self.out(tx, 0, n)
            if plen:
                self.out(payload, 0, plen)
        except OSError as e:
            self.send_failed(e, qos)
        self.last_tx = now
        return pid

    def send_failed(self, e, qos):
        """The error contract of a publish whose send failed (OSError e), for every route (publish(),
        Client.publish's steady one): part of the packet may have left, so the connection is over
        (EV_LOST: the driver drops it and reconnects). A QoS 1/2 message was stored first: accepted,
        it goes out after the next CONNACK (raising would say "not accepted", and a caller that
        publishes it again would send it twice). QoS 0 is not kept: the error goes on to the caller."""
        self.connection_lost()
        self.emit(_EV_LOST, 0, e)
        if not qos:
            raise e

    def pub0(self, topic, payload):
        """publish() of a QoS 0 message without retain or properties, the steady way, in a frame of 11
        words (publish()'s comes from the heap, some 2,000+ instructions a call on a Cortex-M3):
        MQTT 3.1.x, connected, nothing queued ahead of it or for a feed (_txn), no outbound aliases,
        a topic publish() has cached, the packet within the transmit buffer; sent in one write.
        Returns 0 once sent (the caller then sets last_tx: one argument fewer keeps the frame within
        11 words), or -2 with nothing sent: anything else goes through the general route, which does
        it or says what is wrong. A topic that is no dict key (a bytearray, a memoryview) raises
        TypeError before anything is written. An OSError from the send: the caller calls send_failed
        (the one error contract)."""
        if self._txn or self._unsent or self._oalias_cap or self.state != _CONNECTED or self.version == _V5:
            return _SLOW
        if self._inflight and self._limit == 1:
            return _SLOW
        topic = self._cache.get(topic)  # (encoded)
        if topic is None:
            return _SLOW
        plen = len(payload)
        n = pub_head(self.tx, topic, 0x30, 0, plen)  # the header's length
        if n + plen > len(self.tx):
            return _SLOW
        self._txmv[n : n + plen] = payload
        self.out(self.tx, 0, n + plen)
        return 0

    def pub1(self, topic, payload):
        """pub0's QoS 1 sibling (same conditions, and room in the window and the ring): the message
        stored and committed (write-ahead), in the ring as sent, the packet left in the transmit
        buffer as a feed's queued packets are (_txn): the caller hands it over with flush(), sets
        last_tx and calls send_failed when that send fails (accepted: the connection is over).
        Returns its packet id, or -2 with nothing stored. An OSError from the store: not accepted,
        nothing queued. (The packet id is the session's last, _last_pid: a name of its own would
        take the frame over 11 words.)"""
        if self._txn or self._unsent or self.state != _CONNECTED or self.version == _V5:
            return _SLOW
        if self._inflight >= self._limit or self._n >= self._cap:
            return _SLOW
        topic = self._cache.get(topic)  # (encoded)
        if topic is None:
            return _SLOW
        self._alloc_pid()
        n = pub_head(self.tx, topic, 0x32, self._last_pid, len(payload))  # the header's length
        if n + len(payload) > len(self.tx) or self._hviews.get(n) is None:
            # (publish() makes the header's view the store takes: see there) the id given back
            self._last_pid = (self._last_pid - 2) % 65535 + 1
            return _SLOW
        # The payload into the packet first: one that is no buffer raises TypeError here, before
        # anything is stored (the general route then says what is wrong).
        self._txmv[n : n + len(payload)] = payload
        self.store.append(_PUBLISH, self._last_pid, self._hviews.get(n), payload)
        if self.store.dirty:
            self.store.commit()
        # _push's work and publish()'s direct send in one: sent (by the caller) and in flight
        self._ring[(self._head + self._n) % self._cap] = self._last_pid
        self._rflags[(self._head + self._n) % self._cap] = _SENT | _EVER
        self._n += 1
        self._inflight += 1
        self._txn = n + len(payload)
        return self._last_pid

    def _topic(self, topic, props):
        # A topic not in publish's cache: checked, encoded, and (str or bytes) cached. The transmit
        # buffer must hold its header (properties: checked with them).
        if not topic and props and _P_ALIAS in props:
            return b""  # by an alias set on this connection
        t = validate_name(topic)
        if 2 + len(t) + 2 + 5 + 1 > len(self.tx):
            raise ValueError("topic and properties too long for the transmit buffer (%d bytes)" % len(self.tx))
        if isinstance(topic, str) or isinstance(topic, bytes):
            c = self._cache
            if len(c) >= 24:
                c.clear()
            c[topic] = t
        return t

    def outbox_full(self):
        return self._n >= len(self._rflags)

    def is_pending(self, pid):
        """Whether the message (or SUBSCRIBE, UNSUBSCRIBE) with this packet id awaits its
        acknowledgement; pid -1: whether anything does (0, a QoS 0 message's: never)."""
        # (the oldest, mostly: answered without _find's walk)
        return self._n > 0 and pid != 0 and (pid < 0 or self._ring[self._head] == pid or self._find(pid) >= 0)

    # ---------------------------------------------------------- subscriptions

    def subscribe(self, flt, qos, now, handler=None, no_local=False, retain_as_published=False,
                  retain_handling=0, sub_id=None, user_props=None):
        """Register a subscription (and its handler) and send SUBSCRIBE when connected. Returns the
        SUBSCRIBE's packet id, or 0 if not connected (it is sent on connect) or the outbox has no
        room (it is sent once an acknowledgement frees some: a SUBSCRIBE takes a place in the send
        ring and the store as a message does, and never one that is taken). A filter subscribed
        again replaces the old entry: its handler and its identifier. Under MQTT 5 every
        subscription gets an identifier (sub_id, or an automatic one no other subscription holds;
        sub_id=0: none): the README's dispatch rules.

        What the server's last CONNACK said it lacks is refused here with ValueError, before
        anything is registered or sent: wildcards, shared subscriptions, an explicit sub_id. A
        handler alone does not need identifiers: without them, dispatch falls back to topic matching
        (a documented downgrade, not an error). A subscription registered before the first CONNACK
        is sent as it is; a server that lacks the feature refuses it in SUBACK."""
        import tern.replay  # (the ring's cold half: it releases itself after)

        return tern.replay.subscribe(self, flt, qos, now, handler, no_local, retain_as_published, retain_handling,
                                     sub_id, user_props)

    def unsubscribe(self, flt, now, user_props=None):
        """Forget the filter's handler and send UNSUBSCRIBE now when connected, else after the next
        CONNACK if the broker kept the session. (user_props=0: only forget; subscribe() replacing an
        entry.)"""
        import tern.replay

        return tern.replay.unsubscribe(self, flt, now, user_props)

    def _send_late(self, now):
        # What waits for room or a connection (a SUBSCRIBE, an UNSUBSCRIBE): tern.replay sends it.
        import tern.replay

        tern.replay.send_late(self, now)

    # ------------------------------------------------------------------- input

    def feed(self, data, now):
        """Take received bytes (any slicing of the stream)."""
        n = len(data)
        off = 0
        while off < n:
            room = len(self.rx) - self.rx_len
            if room <= 0:
                # frame_size already bounded the packet; a full buffer with no frame is impossible
                self.violation(0x95, "receive buffer overflow", now)
            k = n - off if n - off < room else room
            self.rx[self.rx_len : self.rx_len + k] = data[off : off + k]
            off += k
            self.feed_n(k, now)

    def feed_n(self, n, now):
        """The driver wrote n more bytes into rx at rx_len (zero-copy receive).

        Re-entrant: a handler or event callback that waits (a blocking subscribe from on_connect, a
        publish and wait_published from a message handler) makes the driver read and feed again from
        inside this call. The inner call goes on from the shared read position `_rpos`, after the
        frame being handled, and leaves that frame in place (the outer handler may still hold a view
        of its payload): each call moves the unread rest down to where it started reading, so a
        handler that waits while more arrives does not fill the buffer. n = 0 handles frames left
        behind by a handler that raised."""
        self.rx_len += n
        if n:
            self._ping_sent = -1
        base = self._rpos
        top = base < 0
        if top:
            base = self._rpos = 0
        try:
            self._frames(now)
            self._pump(now)  # what the acknowledgements read let out of the window (see _on_ack)
        except MQTTError as e:
            self.violation(e.code, e.args[0], now)  # the unread rest is dropped
        finally:
            n = self._rpos
            self._rpos = -1 if top else base
            if n > base:
                self._compact(base, n)
            if top:
                self.flush()
                self._pump(now)  # (only after an exception has something to do: sent as it is, not queued)

    def _compact(self, base, pos):
        # What feed_n read is done with: the unread rest moves down to where it started reading.
        end = self.rx_len
        end = end - pos if end > pos else 0
        if end:
            self.rx[base : base + end] = self.rxmv[pos : pos + end]
        self.rx_len = base + end

    def _frames(self, now):
        # Handle the whole frames from _rpos on (feed_n's loop, apart: feed_n's exception handling
        # makes its frame one the heap gives; this one, of 11 words, the stack).
        while True:
            if self.skip and self._skip(now):
                return
            rx = self.rx
            pos = self._rpos
            if pos + 1 < self.rx_len and rx[pos] > 15 and rx[pos + 1] < 128:
                k = rx[pos + 1] + 2  # (a one-byte remaining length: acknowledgements, short messages)
            elif pos >= self.rx_len:
                return  # all read: every feed ends here (without _size's call)
            else:
                k = self._size(pos)
            if k > len(rx):
                from .fault import oversize

                if oversize(self, pos, self.rx_len, k):
                    continue
                return
            if k < 0 or pos + k > self.rx_len:
                return
            self._rpos = pos + k  # consumed even if a handler raises: never handled twice
            self._handle(pos, pos + k, now)

    def _size(self, pos):
        # The size of the frame at pos (-1: its fixed header is not all there yet).
        return pkt.frame_size(self.rx, pos, self.rx_len, 268435460) if pos < self.rx_len else -1

    def _skip(self, now):
        # An oversize PUBLISH (see tern.fault.oversize), discarded as it arrives; True while more of
        # it is to come.
        pos = self._rpos
        k = self.skip
        if self.rx_len - pos < k:
            k = self.rx_len - pos
        self._rpos = pos + k
        self.skip -= k
        if self.skip:
            return True
        k = self.skip_id
        self.stats_dropped += 1
        if k >> 16 == 2 and not self.inids.in_has(k & 0xFFFF) and not self._admit(k & 0xFFFF, 1, now):
            return False  # (kept as for any QoS 2 message, until PUBREL; else not acknowledged)
        if k >> 16:
            self._answer(_PUBACK if k >> 16 == 1 else _PUBREC, k & 0xFFFF, now)
        return False

    def _handle(self, pos, end, now):
        # The steady path's frames, in a frame of 11 words (one larger comes from the heap, some
        # 2,000 instructions a call on a Cortex-M3): a PUBLISH, a PUBACK without a reason code (MQTT
        # 3.1.1's; MQTT 5's for success). Everything else, and anything odd in these, goes to
        # _handle_any, which says what is wrong.
        t = self.rx[pos]
        if t == 0x40 and end - pos == 4 and self._reads & 1 << _PUBACK:
            t = self.rx[pos + 2] << 8 | self.rx[pos + 3]
            if t:
                self._on_ack(_PUBACK, t, 0, now)
                return
        elif t >> 4 == _PUBLISH and self._reads & 1 << _PUBLISH:
            self._on_publish(pos, end, now)
            return
        self._handle_any(pos, end, now)

    def _handle_any(self, pos, end, now):
        rx = self.rx
        b0 = rx[pos]
        t = b0 >> 4
        if not self._reads >> t & 1:
            from .fault import unexpected

            unexpected(self, t, pos, end, now)
        if t == _PUBLISH:
            self._on_publish(pos, end, now)
            return
        body = end - pos
        if _PUBACK <= t <= _PUBCOMP and (body == 4 or (body == 5 and self.version == _V5)):
            # Fast path, allocating nothing: fixed header, packet id and (MQTT 5) a reason code.
            # Anything odd in them goes on to the full decoder below, which says what is wrong.
            pid = rx[pos + 2] << 8 | rx[pos + 3]
            reason = rx[pos + 4] if body == 5 else 0
            if pid and b0 & 15 == (2 if t == _PUBREL else 0) and (
                    body == 4 or reason in (pkt.PUBREL_RC if t >= _PUBREL else pkt.PUBACK_RC)):
                self._on_ack(t, pid, reason, now)
                return
        if t == _PINGRESP and body == 2 and b0 == 0xD0:
            return
        if t == _CONNACK or t == _AUTH:
            # The packets of connecting and authenticating: tern.handshake reads them (and has
            # tern.replay replay the ring at a CONNACK that accepts); both release themselves after.
            import tern.handshake

            tern.handshake.read(self, pos, end, now)
            if self.state == _CONNECTED:  # the CONNACK's cold code (handshake, replay) released:
                import gc  # collected before the steady state on MicroPython (docs/benchmarks.md, issue 39)

                gc.collect() if hasattr(gc, "mem_free") else None  # (CPython: a full collection per connect)
            return
        p = pkt.decode(self.rxmv[pos:end], self.version, len(rx))
        if t == _DISCONNECT:
            if self.version != _V5 or p.reason == 0x04:  # only a client sends DISCONNECT before MQTT 5, and 0x04
                self.violation(_PROTOCOL_ERROR, "DISCONNECT (reason 0x%02X) from the server" % p.reason, now)
            self.connection_lost()
            self.emit(_EV_DISCONNECT, p.reason, p)
        elif t != _PINGRESP:  # PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK
            self._on_ack(t, p.pid, p.reasons if t > _PUBCOMP else p.reason, now)

    def go(self, event):
        """Move the connection to the state `event` (_E_*) leads to."""
        # The state machine as a table, in the manner of h11: one row per state, one column per
        # event, the next state in each cell; 255 (_NO): the event cannot happen in that state (a
        # CONNACK outside CONNECTING never gets here: _reads turns it away first).
        n = (
            # CONNECT  ACCEPT  REFUSE  LOST
            b"\x01"   b"\xff" b"\xff" b"\x00"  # DISCONNECTED
            b"\x01"   b"\x02" b"\x00" b"\x00"  # _CONNECTING
            b"\x01"   b"\xff" b"\xff" b"\x00"  # CONNECTED
        )[self.state << 2 | event]
        if n == _NO:
            raise MQTTError(_PROTOCOL_ERROR, "event %d in state %d" % (event, self.state))
        self.state = n
        self._reads = _READS_CONNECTING if n == _CONNECTING else _READS_OTHERS

    def reauthenticate(self, now, props=None):
        """Start a re-authentication on the open connection (MQTT 5 enhanced authentication): AUTH 0x19
        with the Authentication Method and `props` (e.g. fresh Authentication Data). The hook
        answers the server's challenges; EV_AUTH (a = 0) reports success, a refusal comes as a
        server DISCONNECT."""
        if self.state != _CONNECTED:
            raise NotConnected("not connected")
        import tern.handshake

        tern.handshake.reauthenticate(self, now, props)

    def _on_ack(self, t, pid, reason, now):
        # An acknowledgement from the server; for SUBACK and UNSUBACK, reason is the list of reason
        # codes. The steady case first, in a small frame (see _handle): the PUBACK of the oldest
        # message, a QoS 1 PUBLISH sent on this connection, ends it as _ack_any would.
        if t == _PUBACK and self._n and self._ring[self._head] == pid and (
                self._rflags[self._head] & (_SENT | _QOS2 | _CTRL) == _SENT):
            self._free(self._head)
            if self._late and self._n < self._cap:
                self._send_late(now)  # what waited for room goes first
            self._inflight -= 1
            self.emit(_EV_PUBLISHED, pid, reason)
            return
        self._ack_any(t, pid, reason, now)

    def _ack_any(self, t, pid, reason, now):
        st = self.store
        if t == _PUBREL:
            # The server releases an inbound QoS 2 message.
            known = self.inids.in_has(pid)
            if known:
                self.inids.in_release(pid)
                if self.in2:  # ids recovered after a reboot were not counted
                    self.in2 -= 1
            r = 0 if known else 0x92
            if self.inq is not None:
                self.inq.append([pid, _PUBCOMP, r])  # in order with other acks
                self.ack(0, now)  # no message has id 0: this only sends what the queue allows
            else:
                self.send_ack(_PUBCOMP, pid, r, now)
            if self.deferred and not self.in2:
                from .fault import redeliver

                redeliver(self, now)
            return
        i = self._head
        if self._ring[i] != pid or not self._n:  # (acknowledgements come in send order: the oldest, mostly)
            i = self._find(pid)
        f = self._rflags[i] if i >= 0 else 0
        if t == _PUBREC:
            self._pump(now)  # (its PUBREL goes after what earlier acknowledgements let out: see _ack)
        if i < 0 or not f & _SENT:
            # Unknown identifier: nothing pending changes (a late ack after a reboot or a confused
            # server). PUBREC still needs an answer.
            if t == _PUBREC:
                self.send_ack(_PUBREL, pid, 0x92, now)
            return
        if t > _PUBCOMP:
            done = f & _CTRL and st.kind(pid) == t - 1
        elif f & _CTRL:
            done = False
        elif t == _PUBREC and f & _QOS2 and reason < 0x80:
            if not f & _MARKED:
                st.mark(pid)
                self._rflags[i] = f | _MARKED
            self.send_ack(_PUBREL, pid, 0, now)
            return
        else:
            # PUBACK of a QoS 1 message, PUBCOMP after PUBREC, or a PUBREC refusing a QoS 2 message.
            done = not f & _QOS2 if t == _PUBACK else f & _QOS2 and (t == _PUBREC or f & _MARKED)
        if not done:
            from .fault import wrong_ack

            if not f & _CTRL:  # given back failed: see tern.fault.wrong_ack
                self._free(i)
                self._inflight -= 1
                self.emit(_EV_PUBLISHED, pid, _PROTOCOL_ERROR)
            wrong_ack(self, t, pid, f, now)
        if t > _PUBCOMP:
            import tern.replay  # (the subscription's side: it releases itself after)

            tern.replay.answered(self, t, pid, reason, now)
        self._free(i)
        if self._late and self._n < self._cap:
            self._send_late(now)  # what waited for room goes first
        if t > _PUBCOMP:
            self.emit(_EV_SUBACK if t == _SUBACK else _EV_UNSUBACK, pid, reason)
        else:
            self._inflight -= 1
            self.emit(_EV_PUBLISHED, pid, reason)
            # What this lets out of the window leaves when the read is handled (feed_n pumps once
            # for all the acknowledgements in it, in one pass) or before a message handler runs,
            # whichever comes first.

    def _answer(self, t, pid, now):
        # Acknowledge an inbound message that is not delivered, in its place among the
        # acknowledgements (arrival order).
        if self.inq is not None:
            self.inq.append([pid, t, 0])
            self.ack(0, now)
        elif self._depth:
            self._held.append(pid << 4 | t)
        else:
            self.send_ack(t, pid, 0, now)

    def _on_publish(self, pos, end, now):
        d = self._depth
        # Read under a handler that waits: a Message of its own (the handler's stays as it was)
        m = type(self._msg)() if d else self._msg
        rx = self.rx
        v = self.version
        pkt.parse_publish(m, rx, pos, end, v)
        m.buf = m.tbuf = rx
        m.version = v
        if v == _V5:
            # tern.props is loaded when a property block is not empty: a connected client whose
            # messages carry none does not hold it (the handshake lets it go after the CONNACK).
            if m.props_end > m.props_start:
                import tern.props

                tern.props.scan_publish(m, rx, m.sub_ids)
            else:
                m.alias = m.n_sub_ids = m.pfi = 0
            if m.alias or m.topic_end == m.topic_start:
                # `import tern.v5`, not `from .v5 import alias_in`: that one builds its tuple of
                # names (32 bytes) at every message.
                import tern.v5

                tern.v5.alias_in(self, m, now)
        else:
            m.n_sub_ids = 0
        q = m.qos
        pid = m.pid
        st = self.store
        t = _PUBACK if q == 1 else _PUBREC
        if q == 2 and self.inids.in_has(pid):
            self._answer(_PUBREC, pid, now)  # a repeat of a message already delivered: not delivered again
            return
        manual = self.inq is not None and q
        if q == 2 and not self._admit(pid, not manual, now):
            return
        if manual:  # acknowledged by ack(), in arrival order
            self.inq.append([pid, t, -1])
        elif q:
            if d:  # its ack waits for the handler under way: slot taken now, in arrival order
                self._held.append(pid << 4 | t)
        # Dispatch (the rules are in the README, "Which handlers a message reaches"). A copy
        # carrying identifiers stands for the subscriptions holding them: each one's handler
        # (on_message when it has none) runs once per identifier, which is the same whether the
        # broker sends one copy with several identifiers or one copy per subscription; an identifier
        # no subscription holds goes to on_message. A copy without identifiers stands for
        # subscriptions without one (when the server takes identifiers): each matching one's handler
        # runs once, and on_message once when one of them has no handler or none matches.
        n_ids = m.n_sub_ids
        ids = m.sub_ids
        sids = v == _V5 and self.sid_ok
        dflt = self.on_message
        # What the read let out of the window (see _on_ack), then what it queued, leaves before
        # application code runs; a send that fails there (the connection broke) does not keep the
        # message from its handler (a QoS 2 one's id is recorded: it would never be delivered).
        err = self._first(now) if self._txn or self._unsent else None
        self._depth = d + 1
        try:
            if n_ids and sids:
                k = n_ids if n_ids < len(ids) else len(ids)
                for j in range(k):
                    i = ids[j]
                    rep = False
                    for jj in range(j):
                        if ids[jj] == i:
                            rep = True  # a repeated identifier counts once
                    if rep:
                        continue
                    hit = False
                    for s in self.subs:  # identifiers may be shared: the filter must match too
                        if s.sid == i and matches_bytes(s.match, m.tbuf, m.topic_start, m.topic_end):
                            hit = True
                            h = s.handler or dflt
                            if h:
                                h(m)
                    if not hit and dflt:
                        dflt(m)
            else:
                took = 0  # 1: a handler took it; 2: a subscription without a handler matched
                for s in self.subs:
                    if sids and s.sid:
                        continue  # not this copy's: it would carry the identifier
                    if matches_bytes(s.match, m.tbuf, m.topic_start, m.topic_end):
                        h = s.handler
                        if h:
                            h(m)
                            took |= 1
                        else:
                            took = 2
                if took != 1 and dflt:
                    dflt(m)
        finally:
            # Acknowledged even when a handler raised (the exception goes on to the driver's
            # caller): acknowledgements keep arrival order, so those of messages read meanwhile
            # follow this one's.
            self._depth = d
            if not d and err is None:  # (not over a connection that broke)
                if q and not manual:
                    self.send_ack(t, pid, 0, now)
                h = self._held
                while h:
                    a = h.pop(0)
                    self.send_ack(a & 15, a >> 4, 0, now)
        if err is not None:
            raise err

    def _first(self, now):
        # _on_publish's sends before a handler runs; the OSError of one that fails is returned
        try:
            self._pump(now)
            self.flush()
        except OSError as e:
            return e
        return None

    def _admit(self, pid, rec, now):
        # One more inbound QoS 2 message awaiting PUBREL: its id is kept (in the store; rec = 0: by
        # ack(), later) until then, so the store's share is capped (_in_cap; why not at receive_max,
        # what over it does: tern.fault.over_cap). False: not taken (deferred; or the store could
        # not record its id, then deferred as well, or kept in RAM: see tern.fault.unrecorded).
        n = self.in2
        if n >= self._in_cap:
            import tern.fault  # (a from-import builds its names' tuple at each call)

            return tern.fault.over_cap(self, pid, rec, now)
        if rec:
            try:
                self.store.in_add(pid)
                self.store.commit()  # durable before the handler runs (group commit too): delivered once
            except OSError as e:
                from .fault import unrecorded

                return unrecorded(self, pid, e, now)
        self.in2 = n + 1
        return True

    def ack(self, ack_id, now):
        """Manual acknowledgement: the application is done with a message. Acknowledgements still leave
        in the order the messages arrived: this sends those at the head of the queue that are ready."""
        if self.inq is not None:
            import tern.manual  # (not `from .manual import`: see _on_publish)

            tern.manual.ack(self, ack_id, now)

    def emit(self, kind, a, b):
        if self.on_event:
            self.on_event(kind, a, b)

    # ------------------------------------------------------------------ timers

    def poll(self, now):
        """Keepalive. Returns ms until the next call is needed; raises OSError when the server stopped
        answering."""
        if self.state == _DISCONNECTED:
            return 1000
        ka = self.keepalive * 1000
        if self.state == _CONNECTING:
            limit = ka or 30000
            if ticks_diff(now, self.last_tx) > limit:
                self.connection_lost()
                raise OSError("no %s within %d ms" % ("CONNACK", limit))
            return 100
        if not ka:
            return 60000
        if self._ping_sent >= 0:
            limit = int(self.ping_timeout * 1000) if self.ping_timeout else ka  # whole ms: drivers poll with it
            waited = ticks_diff(now, self._ping_sent)
            if waited >= limit:
                self.connection_lost()
                raise OSError("no %s within %d ms" % ("PINGRESP", limit))
            return limit - waited
        idle = ticks_diff(now, self.last_tx)
        if idle >= ka:
            self.flush()
            self.out(pkt.PINGREQ_BYTES, 0, 2)
            self.last_tx = self._ping_sent = now
            return ka
        return ka - idle

    def disconnect(self, now, reason=0, props=None):
        """Send DISCONNECT (the will is discarded) and close the session."""
        if self.version == _V5 and (reason or props):
            from . import props as P

            P.client_disconnect(reason, props, self.connect_props)
        if self.state == _CONNECTED:
            self.send_packet(pkt.Packet(_DISCONNECT, reason=reason, props=props), now)
        self.connection_lost()
        self.store.commit()

    def connection_lost(self):
        """The transport is gone: nothing is lost, everything pending waits."""
        self.go(_E_LOST)
        self._txn = 0  # queued for a connection that is gone
        self.rx_len = self._rpos if self._rpos > 0 else 0  # as in connect_packet
        self._inflight = 0
        self._ping_sent = -1
        self.reauthing = False
        self.skip = 0
        self.deferred = 0  # the broker resends them after the reconnect
        del self._held[:]  # for the old connection: the broker sends those messages again
        if self.inq is not None:
            from .manual import lost

            lost(self)
