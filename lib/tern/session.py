"""The MQTT protocol engine, without I/O: it is fed received bytes and the time
(milliseconds), and it hands bytes to `send(buf, off, n)`, messages to
handlers, events to `on_event(kind, a, b)`, and tells when it next needs the
clock. No sockets, no clocks, no files: drivers own those, which is what lets
the same engine run on a board, on a host and under fault injection.

Write-ahead: a QoS 1/2 PUBLISH, SUBSCRIBE or UNSUBSCRIBE goes into the store
before its first byte is sent and leaves it on its acknowledgement. The send
order lives in a ring of packet identifiers (3 bytes per pending message);
a reconnect replays the ring in order: PUBREL for QoS 2 messages whose PUBREC
was seen, the PUBLISH with DUP set for the rest. Nothing is resent on a live
connection.

Inbound QoS 2 is delivered once: the packet identifier is made durable before
the handler runs and PUBREC is sent after it; a repeat of that identifier is
answered with PUBREC again and not delivered. A power cut while the handler
runs therefore loses that one delivery rather than repeating it (which is what
keeps a `reboot` command from looping); manual acknowledgement reverses this
for applications that make their own write durable first.
"""

from array import array

from .wire import const, MQTTError, fail
from . import pkt
from .pkt import Packet
from .message import Message
from .topic import matches_bytes, parse_shared, validate_filter, validate_name

try:
    from time import ticks_diff
except ImportError:  # CPython: the driver's clock does not wrap

    def ticks_diff(a, b):
        return a - b


# Packet types and property identifiers as private constants: folded into the
# bytecode, so they cost no module globals on a board.
_CONNECT = const(1)
_CONNACK = const(2)
_PUBLISH = const(3)
_PUBACK = const(4)
_PUBREC = const(5)
_PUBREL = const(6)
_PUBCOMP = const(7)
_SUBSCRIBE = const(8)
_SUBACK = const(9)
_UNSUBSCRIBE = const(10)
_UNSUBACK = const(11)
_PINGRESP = const(13)
_DISCONNECT = const(14)
_AUTH = const(15)
_V5 = const(5)
_PROTOCOL_ERROR = const(0x82)
_P_SUB_ID = const(0x0B)
_P_SESSION_EXPIRY = const(0x11)
_P_ASSIGNED_ID = const(0x12)
_P_SERVER_KEEPALIVE = const(0x13)
_P_AUTH_METHOD = const(0x15)
_P_RECEIVE_MAX = const(0x21)
_P_ALIAS_MAX = const(0x22)
_P_ALIAS = const(0x23)
_P_MAX_QOS = const(0x24)
_P_RETAIN_OK = const(0x25)
_P_USER = const(0x26)
_P_MAX_PACKET = const(0x27)
_P_WILDCARD_OK = const(0x28)
_P_SUB_ID_OK = const(0x29)
_P_SHARED_OK = const(0x2A)

# Connection states.
DISCONNECTED = const(0)
CONNECTING = const(1)
CONNECTED = const(2)

# Events for on_event(kind, a, b).
EV_CONNACK = const(1)  # a = session present, b = CONNACK Packet
EV_PUBLISHED = const(2)  # a = pid, b = reason (acknowledged, or refused when >= 0x80)
EV_SUBACK = const(3)  # a = pid, b = list of reason codes
EV_UNSUBACK = const(4)  # a = pid, b = list of reason codes
EV_DISCONNECT = const(5)  # a = reason code, b = DISCONNECT Packet
EV_RESTORED = const(6)  # a = messages resent after a reconnect, b = broker lost the session
EV_AUTH = const(7)  # a = 0: a re-authentication succeeded, b = AUTH Packet
EV_LOST = const(8)  # a = 0, b = the OSError: sending an accepted message failed, the connection is over

# Ring entry flags.
_SENT = const(1)  # sent on this connection
_QOS2 = const(2)
_MARKED = const(4)  # PUBREC seen
_CTRL = const(8)  # SUBSCRIBE or UNSUBSCRIBE
_EVER = const(16)  # sent on some connection (a resend carries DUP)

WOULD_BLOCK = const(-1)


class NotConnected(OSError):
    pass


class _Sub:
    # One subscription: its filter as bytes (inner filter for $share), handler, id.
    def __init__(self, flt, match, qos, opts, handler, sid, user_props):
        self.user_props = user_props  # sent again with every resubscription
        self.filter = flt
        self.match = match
        self.qos = qos
        self.opts = opts
        self.handler = handler
        self.sid = sid


class Session:
    """One MQTT session. See the module docstring for the I/O contract.

    topic_alias_max: how many topic aliases the server may use towards us
    (inbound, announced in CONNECT). outbound_aliases: how many we may use
    towards the server (MQTT 5; 0 = off, the default), capped by the Topic
    Alias Maximum in its CONNACK. Only QoS 0 messages carry an outbound alias:
    aliases live only as long as one network connection, and a QoS 1/2 message
    is stored as first sent and resent byte for byte after a reconnect, when
    any alias it used would mean nothing (or something else) to the server.
    The first message to a topic carries the topic and the alias; later ones
    only the alias. Aliases are handed out until the cap is reached (no
    replacement) and forgotten on every new connection.

    auth: enhanced authentication (MQTT 5) as a hook, auth(reason, props) ->
    props. Put the Authentication Method (and any initial data) in
    connect_props; each AUTH the server sends (reason 0x18, continue) calls the
    hook with its reason and properties, and what it returns goes back in an
    AUTH packet (the method is added when missing). It is also called with
    reason 0 when a re-authentication (`reauthenticate`) succeeds. A hook that
    raises ends the connection (DISCONNECT 0x80) and its exception reaches the
    driver as MQTTError 0x80 naming it. A refusal arrives as a CONNACK reason code (the driver raises
    ConnectError) or, during re-authentication, as a server DISCONNECT.
    """

    def __init__(self, client_id="", version=4, clean=True, keepalive=60, store=None,
                 window=16, rx_size=4096, tx_size=512, max_pending=256, session_expiry=None,
                 username=None, password=None, will_topic=None, will_payload=b"", will_qos=0,
                 will_retain=False, will_props=None, connect_props=None, topic_alias_max=0,
                 manual_ack=False, auth=None, ping_timeout=None, outbound_aliases=0):
        if version not in (3, 4, 5):
            raise ValueError("protocol version must be 3 (3.1), 4 (3.1.1) or 5")
        self.client_id = client_id
        self.version = version
        self.clean = clean
        self.keepalive = keepalive
        if store is None:  # loaded only when used: a board with a flash store does not carry it
            from .store import MemoryStore

            store = MemoryStore()
        self.store = store
        self.window = window
        self.session_expiry = session_expiry
        self.username = username
        self.password = password
        self.will = (will_topic, will_payload, will_qos, will_retain, will_props)
        self.connect_props = connect_props
        self.topic_alias_max = topic_alias_max
        self.manual_ack = manual_ack
        self.auth = auth  # enhanced authentication hook: auth(reason, props) -> props
        self.outbound_aliases = outbound_aliases
        self._oalias = None  # topic bytes -> encoded property block with its alias (this connection)
        self._oalias_cap = 0
        self._reauth = False  # a re-authentication is under way
        # MQTT 5 properties are loaded only for MQTT 5 (or when properties are given)
        self._P = None
        if version == 5:
            from . import props

            self._P = props
        self.ping_timeout = ping_timeout
        self.send = None  # send(buf, off, n), set by the driver
        self.on_message = None  # default handler
        self.on_event = None
        self.state = DISCONNECTED
        self.rx = bytearray(rx_size)
        self.rx_len = 0
        self._rxmv = memoryview(self.rx)
        self._tx = bytearray(tx_size)
        self._txmv = memoryview(self._tx)
        self._msg = Message()
        self._tcache = {}
        self._hviews = {}
        self._cap = max_pending
        self._ring = array("H", bytes(2 * max_pending))  # zeroed, without a list of max_pending items
        self._rflags = bytearray(max_pending)
        self._head = 0
        self._n = 0  # ring slots in use (released ones inside count until trimmed)
        self._inflight = 0
        self._unsent = 0
        self._subs = []
        self._next_sid = 1
        self._aliases = None
        self._inq = None  # manual acknowledgement queue: [pid, qos, acked]
        self._last_pid = 0
        self._last_tx = 0
        self._last_rx = 0
        self._ping_sent = -1
        self.server = None  # CONNACK properties (MQTT 5)
        self.server_keepalive = None
        self.receive_max = 65535
        self.max_qos = 2
        self.retain_ok = True
        self.sid_ok = True
        self.wildcard_ok = True
        self.shared_ok = True
        self.server_max_packet = 268435460
        self.session_present = False
        self.stats_sent = 0
        self.stats_resent = 0
        self.stats_acked = 0
        self.stats_recovered = 0
        self._restore()

    # ------------------------------------------------------------ store replay

    def _restore(self):
        """Rebuild the send ring from what the store recovered (after a reboot)."""
        st = self.store
        st.open()
        self._last_pid = st.last_pid()
        for pid in st.pending():
            if self._n >= self._cap:
                raise ValueError("store holds more pending messages than max_pending=%d" % self._cap)
            f = _EVER
            if st.kind(pid) != _PUBLISH:
                f |= _CTRL
            else:
                st.read(pid, 0, self._tx)
                if (self._tx[0] >> 1) & 3 == 2:
                    f |= _QOS2
                if st.marked(pid):
                    f |= _MARKED
            self._push(pid, f)
            self.stats_recovered += 1

    def _push(self, pid, f):
        i = (self._head + self._n) % self._cap
        self._ring[i] = pid
        self._rflags[i] = f
        self._n += 1
        self._unsent += 1

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

    def _drop(self, i):
        # Release ring slot i; trim released slots off the head.
        self._ring[i] = 0
        self._rflags[i] = 0
        ring = self._ring
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
            i = (i + 1) % self._cap
        return out

    def _alloc_pid(self):
        p = self._last_pid
        has = self.store.has
        for _ in range(65535):
            p = p % 65535 + 1
            if not has(p):
                self._last_pid = p
                return p
        raise OSError("no free packet identifier")

    # ------------------------------------------------------------------ output

    def _out(self, buf, off, n, now):
        self.send(buf, off, n)
        self._last_tx = now

    def _ack(self, ptype, pid, reason, now):
        n = pkt.ack_into(self._tx, ptype, pid, reason, self.version)
        self._out(self._tx, 0, n, now)

    def _packet(self, p, now):
        b = pkt.encode(p, self.version)
        if len(b) > self.server_max_packet:
            raise ValueError("packet type %d of %d bytes is over the server's maximum packet size %d" % (
                p.type, len(b), self.server_max_packet))
        self._out(b, 0, len(b), now)
        return b

    def _violation(self, code, msg, now):
        """The server broke the protocol: tell it why (MQTT 5) and stop."""
        if self.state != DISCONNECTED and self.version == _V5 and self.send:
            try:
                self._packet(Packet(_DISCONNECT, reason=code), now)
            except Exception:
                pass
        self.connection_lost()
        raise MQTTError(code, msg)

    # ---------------------------------------------------------------- connect

    def connect_packet(self, now):
        """Send CONNECT; the driver calls this right after the socket opens."""
        self.rx_len = 0
        self.state = CONNECTING
        self._ping_sent = -1
        props = dict(self.connect_props) if self.connect_props else {}
        if self.version == _V5:
            if self.session_expiry:
                props[_P_SESSION_EXPIRY] = self.session_expiry
            props[_P_MAX_PACKET] = len(self.rx)
            if self.topic_alias_max:
                props[_P_ALIAS_MAX] = self.topic_alias_max
        wt, wp, wq, wr, wprops = self.will
        self._reauth = False
        self._last_rx = now
        self._packet(Packet(
            _CONNECT, version=self.version, clean=self.clean, keepalive=self.keepalive,
            client_id=self.client_id, props=props or None, username=self.username,
            password=self.password, will_topic=wt, will_payload=wp, will_qos=wq,
            will_retain=wr, will_props=wprops), now)

    def _on_connack(self, p, now):
        if p.reason:
            self.state = DISCONNECTED
            self._event(EV_CONNACK, False, p)
            return
        self.state = CONNECTED
        self.session_present = sp = p.session_present
        props = p.props or {}
        self.server = props
        self.receive_max = props.get(_P_RECEIVE_MAX, 65535)
        self.max_qos = props.get(_P_MAX_QOS, 2)
        self.retain_ok = props.get(_P_RETAIN_OK, 1) == 1
        self.sid_ok = props.get(_P_SUB_ID_OK, 1) == 1
        self.wildcard_ok = props.get(_P_WILDCARD_OK, 1) == 1
        self.shared_ok = props.get(_P_SHARED_OK, 1) == 1
        self.server_max_packet = props.get(_P_MAX_PACKET, 268435460)
        if _P_ASSIGNED_ID in props:
            self.client_id = props[_P_ASSIGNED_ID]
        self.server_keepalive = props.get(_P_SERVER_KEEPALIVE)
        if self.server_keepalive is not None:
            self.keepalive = self.server_keepalive
        self._aliases = None
        # Outbound aliases start afresh on every connection.
        self._oalias = None
        c = props.get(_P_ALIAS_MAX, 0)
        self._oalias_cap = c if c < self.outbound_aliases else self.outbound_aliases
        lost = not sp and self._n > 0
        if not sp:
            # The broker has no session for us (clean start, expiry, or it
            # forgot): accepted messages still go out; a QoS 2 message whose
            # PUBREC was seen is published again, since the broker no longer
            # holds it (at least once rather than lost); inbound QoS 2 ids
            # and the broker's copies of our subscriptions are gone.
            self.store.in_clear()
            i = self._head
            for _ in range(self._n):
                if self._rflags[i] & _MARKED:
                    self.store.unmark(self._ring[i])
                    self._rflags[i] &= ~_MARKED
                i = (i + 1) % self._cap
        self._event(EV_CONNACK, sp, p)
        # Replay the ring in its original order.
        self._inflight = 0
        self._unsent = 0
        i = self._head
        for _ in range(self._n):
            if self._ring[i]:
                self._rflags[i] &= ~_SENT
                self._unsent += 1
            i = (i + 1) % self._cap
        resent = self._unsent
        if not sp and self._subs:
            self._resubscribe(now)
        self._pump(now)
        if resent or lost:
            self.stats_resent += resent
            self._event(EV_RESTORED, resent, lost)

    def _limit(self):
        w = self.window
        return w if w < self.receive_max else self.receive_max

    def _pump(self, now):
        """Send what the window allows, oldest first."""
        if self.state != CONNECTED or not self._unsent:
            return
        self.store.commit()  # write-ahead: durable before the first byte leaves (group commit)
        limit = self._limit()
        i = self._head
        cap = self._cap
        for _ in range(self._n):
            pid = self._ring[i]
            f = self._rflags[i]
            if pid and not f & _SENT:
                if not f & _CTRL:
                    if self._inflight >= limit:
                        return
                    self._inflight += 1
                self._send_record(pid, f, now)
                self._rflags[i] = f | _SENT | _EVER
                self._unsent -= 1
                if not self._unsent:
                    return
            i += 1
            if i == cap:
                i = 0

    def _send_record(self, pid, f, now):
        if f & _MARKED:
            self._ack(_PUBREL, pid, 0, now)
            return
        st = self.store
        size = st.size(pid)
        off = 0
        tx = self._tx
        while off < size:
            n = st.read(pid, off, tx)
            if not n:
                raise OSError("store returned a short record for packet %d" % pid)
            if off == 0 and f & _EVER and not f & _CTRL:
                tx[0] |= 8  # DUP: this PUBLISH went out before
            self.send(tx, 0, n)
            off += n
        self._last_tx = now
        self.stats_sent += 1

    # ---------------------------------------------------------------- publish

    def publish(self, topic, payload, qos, retain, now, props=None):
        """Queue or send one message. Returns its packet id (0 for QoS 0), or
        WOULD_BLOCK when ordering or the outbox's size says to wait. A QoS
        1/2 message once stored is accepted even if the connection fails
        while it is sent (the session disconnects and reports EV_LOST).

        topic: bytes (zero allocation) or str; props: a dict of MQTT 5
        properties or None.
        """
        if qos < 0 or qos > 2:
            raise ValueError("QoS must be 0, 1 or 2")
        if isinstance(topic, str):
            # Devices publish to a handful of topics: validate and encode each
            # once, so a str topic costs no allocation on the steady path.
            t = self._tcache.get(topic)
            if t is None:
                t = validate_name(topic)
                if len(self._tcache) >= 8:
                    self._tcache.clear()
                self._tcache[topic] = t
            topic = t
        # What the server's last CONNACK said it supports (MQTT 5; before any
        # CONNACK everything is allowed): refused here, before a byte is sent
        # or stored, rather than by a DISCONNECT from the server.
        if qos > self.max_qos:
            raise ValueError("the server accepts QoS up to %d (CONNACK Maximum QoS)" % self.max_qos)
        if retain and not self.retain_ok:
            raise ValueError("the server does not support retained messages (CONNACK Retain Available = 0)")
        pblock = None
        if props:
            if self.version != _V5:
                raise ValueError("properties need MQTT 5")
            pblock = self._P.encode(props, _PUBLISH)
        plen = len(payload)
        hlen = 2 + len(topic) + 2 + 5 + (len(pblock) if pblock else 1)
        if hlen > len(self._tx):
            raise ValueError("topic and properties too long for the transmit buffer (%d bytes)" % len(self._tx))
        if hlen + plen > self.server_max_packet:
            raise ValueError("message of %d bytes exceeds the server's maximum packet size %d" % (
                hlen + plen, self.server_max_packet))
        if not qos:
            if self.state != CONNECTED:
                raise NotConnected("not connected: QoS 0 messages are not kept")
            if self._unsent or (self._inflight and self._limit() == 1):
                return WOULD_BLOCK  # keep order behind queued messages
            if self._oalias_cap and not (props and _P_ALIAS in props):
                # Outbound topic alias (see the class docstring): the
                # property block for each topic is built once, so a repeat
                # allocates nothing.
                d = self._oalias
                if d is None:
                    d = self._oalias = {}
                blk = d.get(topic)
                if blk is not None:
                    topic = b""
                elif len(d) < self._oalias_cap:
                    a = len(d) + 1
                    blk = d[topic] = bytes((3, _P_ALIAS, a >> 8, a & 0xFF))
                if blk is not None:
                    if props:
                        pp = dict(props)
                        pp[_P_ALIAS] = blk[2] << 8 | blk[3]
                        blk = self._P.encode(pp, _PUBLISH)
                    pblock = blk
            n = pkt.publish_header_into(self._tx, topic, 0, retain, False, 0, plen, self.version, pblock)
            self.send(self._tx, 0, n)
            if plen:
                self.send(payload, 0, plen)
            self._last_tx = now
            self.stats_sent += 1
            return 0
        if self._n >= self._cap:
            return WOULD_BLOCK
        pid = self._alloc_pid()
        n = pkt.publish_header_into(self._tx, topic, qos, retain, False, pid, plen, self.version, pblock)
        self.store.append(_PUBLISH, pid, self._head_view(n), payload)
        self._push(pid, _QOS2 if qos == 2 else 0)
        if self.state == CONNECTED:
            self.store.commit()  # durable before a byte leaves; a store failure is not an acceptance
            try:
                self._pump(now)
            except OSError as e:
                # Accepted: stored and queued; only the connection failed
                # under the send. It goes out after the next CONNACK. Raising
                # would say "not accepted", and a caller that publishes it
                # again would send the message twice.
                self.connection_lost()
                self._event(EV_LOST, 0, e)
        return pid

    def _head_view(self, n):
        # The store takes the encoded header as a buffer of exactly n bytes; one
        # view of the transmit buffer per header length (a device has few
        # topics) keeps that allocation out of the steady path.
        v = self._hviews.get(n)
        if v is None:
            if len(self._hviews) >= 16:
                self._hviews.clear()
            v = self._hviews[n] = self._txmv[:n]
        return v

    def wait_needed(self):
        """True while a QoS 0 publish would have to wait (see publish)."""
        return bool(self._unsent or (self._inflight and self._limit() == 1))

    def outbox_full(self):
        return self._n >= self._cap

    def is_pending(self, pid):
        return self._find(pid) >= 0

    # ---------------------------------------------------------- subscriptions

    def subscribe(self, flt, qos, now, handler=None, no_local=False, retain_as_published=False,
                  retain_handling=0, sub_id=None, user_props=None):
        """Register a subscription (and its handler) and send SUBSCRIBE when
        connected. Returns the SUBSCRIBE's packet id, or 0 if not connected
        (it is sent on connect). A filter subscribed again replaces the old
        entry: its handler and its identifier.

        What the server's last CONNACK said it lacks is refused here with
        ValueError, before anything is registered or sent: wildcards,
        shared subscriptions, an explicit sub_id. A handler alone does not
        need identifiers: without them, dispatch falls back to topic
        matching (a documented downgrade, not an error). A subscription
        registered before the first CONNACK is sent as it is; a server that
        lacks the feature refuses it in SUBACK."""
        validate_filter(flt)
        if qos < 0 or qos > 2:
            raise ValueError("QoS must be 0, 1 or 2")
        if retain_handling not in (0, 1, 2):
            raise ValueError("retain handling must be 0, 1 or 2")
        shared = parse_shared(flt)
        if shared and no_local:
            raise ValueError("No Local cannot be set on a shared subscription")
        match = (shared[1] if shared else flt).encode()
        if shared and not self.shared_ok:
            raise ValueError("the server does not support shared subscriptions (CONNACK: Shared Subscription Available = 0)")
        if not self.wildcard_ok and (b"+" in match or b"#" in match):
            raise ValueError("the server does not support wildcard subscriptions (CONNACK: Wildcard Subscription Available = 0)")
        if sub_id is not None:
            if not 0 < sub_id <= 268435455:
                raise ValueError("subscription identifier must be 1..268435455")
            if not self.sid_ok:
                raise ValueError("the server does not support subscription identifiers (CONNACK: Subscription Identifiers Available = 0)")
        elif handler is not None and self.version == _V5 and self.sid_ok:
            sub_id = self._next_sid
            self._next_sid += 1
        opts = qos | (4 if no_local else 0) | (8 if retain_as_published else 0) | retain_handling << 4
        self._subs = [s for s in self._subs if s.filter != flt]
        s = _Sub(flt, match, qos, opts, handler, sub_id, user_props)
        self._subs.append(s)
        if self.state != CONNECTED:
            return 0
        return self._send_subscribe(s, now)

    def _send_subscribe(self, s, now):
        props = {}
        if self.version == _V5 and s.sid and self.sid_ok:
            props[_P_SUB_ID] = s.sid
        if s.user_props:
            props[_P_USER] = list(s.user_props)
        return self._store_ctrl(_SUBSCRIBE, (s.filter, s.opts & (0xFF if self.version == _V5 else 3)), props, now)

    def _store_ctrl(self, t, topic, props, now):
        pid = self._alloc_pid()
        b = pkt.encode(Packet(t, pid=pid, topics=[topic], props=props or None), self.version)
        self.store.append(t, pid, b, b"")
        self._push(pid, _CTRL)
        self._pump(now)
        return pid

    def _resubscribe(self, now):
        # One SUBSCRIBE per subscription: each may carry its own identifier.
        for s in self._subs:
            self._send_subscribe(s, now)

    def unsubscribe(self, flt, now, user_props=None):
        """Forget the filter's handler and send UNSUBSCRIBE (when connected)."""
        validate_filter(flt)
        self._subs = [s for s in self._subs if s.filter != flt]
        if self.state != CONNECTED:
            return 0
        return self._store_ctrl(_UNSUBSCRIBE, flt, {_P_USER: list(user_props)} if user_props else None, now)

    # ------------------------------------------------------------------- input

    def feed(self, data, now):
        """Take received bytes (any slicing of the stream)."""
        n = len(data)
        off = 0
        while off < n:
            room = len(self.rx) - self.rx_len
            if room <= 0:
                # frame_size already bounded the packet; a full buffer with no frame is impossible
                self._violation(0x95, "receive buffer overflow", now)
            k = n - off if n - off < room else room
            self.rx[self.rx_len : self.rx_len + k] = data[off : off + k]
            off += k
            self.feed_n(k, now)

    def feed_n(self, n, now):
        """The driver wrote n more bytes into rx at rx_len (zero-copy receive)."""
        self.rx_len += n
        self._last_rx = now
        self._ping_sent = -1
        rx = self.rx
        end = self.rx_len
        pos = 0
        try:
            while pos < end:
                size = pkt.frame_size(rx, pos, end, len(rx))
                if size < 0 or pos + size > end:
                    break
                start = pos
                pos += size  # consumed even if a handler raises: never handled twice
                self._handle(start, pos, now)
        except MQTTError as e:
            self.rx_len = 0
            pos = 0
            self._violation(e.code, e.args[0], now)
        finally:
            if pos and self.rx_len:
                left = end - pos
                if left:
                    rx[0:left] = self._rxmv[pos:end]
                self.rx_len = left

    def rx_space(self):
        """How many bytes the driver may write at rx[rx_len:]."""
        return len(self.rx) - self.rx_len

    def _handle(self, pos, end, now):
        rx = self.rx
        b0 = rx[pos]
        t = b0 >> 4
        if self.state == CONNECTING and t != _CONNACK and t != _AUTH:
            self._violation(_PROTOCOL_ERROR, "packet type %d before CONNACK" % t, now)
        if t == _PUBLISH:
            self._on_publish(pos, end, now)
            return
        body = end - pos
        if _PUBACK <= t <= _PUBCOMP and (body == 4 or (body == 5 and self.version == _V5)):
            # Fast path: fixed header, packet id and (MQTT 5) a reason code.
            if b0 & 15 != (2 if t == _PUBREL else 0):
                fail("reserved flags of packet type %d" % t)
            pid = rx[pos + 2] << 8 | rx[pos + 3]
            if not pid:
                fail("packet id 0")
            reason = rx[pos + 4] if body == 5 else 0
            if body == 5 and reason not in (pkt.PUBREL_RC if t >= _PUBREL else pkt.PUBACK_RC):
                raise MQTTError(_PROTOCOL_ERROR, "protocol error: reason code 0x%02X in packet type %d" % (
                    reason, t))
            self._on_ack(t, pid, reason, now)
            return
        if t == _PINGRESP and body == 2 and b0 == 0xD0:
            return
        p = pkt.decode(self._rxmv[pos:end], self.version, len(rx))
        if _PUBACK <= t <= _PUBCOMP:
            self._on_ack(t, p.pid, p.reason, now)
        elif t == _CONNACK:
            if self.state != CONNECTING:
                self._violation(_PROTOCOL_ERROR, "unexpected CONNACK", now)
            self._on_connack(p, now)
        elif t == _SUBACK or t == _UNSUBACK:
            i = self._find(p.pid)
            if i < 0 or not self._rflags[i] & _CTRL:
                return  # not ours (any more): nothing to update
            self.store.release(p.pid)
            self._drop(i)
            self._event(EV_SUBACK if t == _SUBACK else EV_UNSUBACK, p.pid, p.reasons)
        elif t == _DISCONNECT:
            self.connection_lost()
            self._event(EV_DISCONNECT, p.reason, p)
        elif t == _AUTH:
            self._on_auth(p, now)

    # ------------------------------------------------- enhanced authentication

    def _auth_method(self):
        cp = self.connect_props
        return cp.get(_P_AUTH_METHOD) if cp else None

    def _on_auth(self, p, now):
        # AUTH from the server: a challenge (0x18) while connecting or
        # re-authenticating, or success (0) at the end of a re-authentication.
        r = p.reason
        if not self.auth or not self._auth_method():
            self._violation(_PROTOCOL_ERROR, "AUTH without enhanced authentication", now)
        if not (self.state == CONNECTING or self._reauth) or r == 0x19 or (r == 0 and not self._reauth):
            self._violation(_PROTOCOL_ERROR, "unexpected AUTH (reason 0x%02X)" % r, now)
        try:
            out = self.auth(r, p.props)
        except Exception as e:
            self._violation(0x80, "authentication hook failed: %r" % e, now)
        if not r:
            self._reauth = False
            self._event(EV_AUTH, 0, p)
            return
        out = dict(out) if out else {}
        if _P_AUTH_METHOD not in out:
            out[_P_AUTH_METHOD] = self._auth_method()
        self._packet(Packet(_AUTH, reason=0x18, props=out), now)

    def reauthenticate(self, now, props=None):
        """Start a re-authentication on the open connection (MQTT 5 enhanced
        authentication): AUTH 0x19 with the Authentication Method and `props`
        (e.g. fresh Authentication Data). The hook answers the server's
        challenges; EV_AUTH (a = 0) reports success, a refusal comes as a
        server DISCONNECT."""
        if self.state != CONNECTED:
            raise NotConnected("not connected")
        m = self._auth_method()
        if not m or not self.auth:
            raise ValueError("re-authentication needs auth= and an Authentication Method (0x15) in connect_props")
        out = dict(props) if props else {}
        out[_P_AUTH_METHOD] = m
        self._reauth = True
        self._packet(Packet(_AUTH, reason=0x19, props=out), now)

    def _on_ack(self, t, pid, reason, now):
        if t == _PUBREL:
            # The server releases an inbound QoS 2 message.
            known = self.store.in_has(pid)
            if known:
                self.store.in_release(pid)
            if self._inq is not None:
                self._inq.append([pid, 7, 1])  # PUBCOMP, in order with other acks
                self._flush_acks(now)
            else:
                self._ack(_PUBCOMP, pid, 0 if known else 0x92, now)
            return
        i = self._find(pid)
        f = self._rflags[i] if i >= 0 else 0
        if i < 0 or f & _CTRL or not f & _SENT:
            # Unknown identifier: nothing pending changes (a late ack after a
            # reboot or a confused server). PUBREC still needs an answer.
            if t == _PUBREC:
                self._ack(_PUBREL, pid, 0x92, now)
            return
        if t == _PUBACK and not f & _QOS2 or t == _PUBCOMP and f & _QOS2 and f & _MARKED:
            self._complete(i, pid, reason, now)
        elif t == _PUBREC and f & _QOS2:
            if reason >= 0x80:
                self._complete(i, pid, reason, now)
                return
            if not f & _MARKED:
                self.store.mark(pid)
                self._rflags[i] = f | _MARKED
            self._ack(_PUBREL, pid, 0, now)
        # other combinations (PUBACK for QoS 2, PUBCOMP before PUBREC) change nothing

    def _complete(self, i, pid, reason, now):
        self.store.release(pid)
        self._drop(i)
        self._inflight -= 1
        self.stats_acked += 1
        self._event(EV_PUBLISHED, pid, reason)
        self._pump(now)

    def _on_publish(self, pos, end, now):
        m = self._msg
        rx = self.rx
        pkt.parse_publish(m, rx, pos, end, self.version)
        m.buf = rx
        m.tbuf = rx
        m.version = self.version
        if self.version == _V5:
            self._P.scan_publish(m, rx, m.sub_ids)
            a = m.alias
            if a:
                if a > self.topic_alias_max:
                    self._violation(0x94, "topic alias %d above the maximum %d" % (a, self.topic_alias_max), now)
                if self._aliases is None:
                    self._aliases = {}
                if m.topic_end > m.topic_start:
                    self._aliases[a] = bytes(self._rxmv[m.topic_start : m.topic_end])
                else:
                    t = self._aliases.get(a)
                    if t is None:
                        self._violation(_PROTOCOL_ERROR, "unknown topic alias %d" % a, now)
                    m.tbuf = t
                    m.topic_start = 0
                    m.topic_end = len(t)
            elif m.topic_end == m.topic_start:
                self._violation(_PROTOCOL_ERROR, "empty topic without a topic alias", now)
        else:
            m.n_sub_ids = 0
        q = m.qos
        pid = m.pid
        if q == 2 and self.store.in_has(pid):
            # A repeat of a message already delivered: answer, do not deliver.
            if self._inq is not None:
                self._inq.append([pid, 5, 1])
                self._flush_acks(now)
            else:
                self._ack(_PUBREC, pid, 0, now)
            return
        if self.manual_ack and q:
            if self._inq is None:
                self._inq = []
            self._inq.append([pid, 4 if q == 1 else 5, 0])
            self._dispatch(m)
            return
        if q == 2:
            self.store.in_add(pid)
        self._dispatch(m)
        if q:
            self._ack(_PUBACK if q == 1 else _PUBREC, pid, 0, now)

    def _dispatch(self, m):
        delivered = False
        n_ids = m.n_sub_ids
        ids = m.sub_ids
        for s in self._subs:
            h = s.handler
            if h is None:
                continue
            if n_ids and s.sid:
                k = 0
                hit = False
                while k < n_ids and k < len(ids):
                    if ids[k] == s.sid:
                        hit = True
                        break
                    k += 1
                if not hit:
                    continue
                # identifiers may be shared: the filter must match too
            if matches_bytes(s.match, m.tbuf, m.topic_start, m.topic_end):
                h(m)
                delivered = True
        if not delivered and self.on_message:
            self.on_message(m)

    def ack(self, ack_id, now):
        """Manual acknowledgement: the application is done with a message.
        Acknowledgements still leave in the order the messages arrived."""
        if self._inq is None:
            return
        pid = ack_id & 0xFFFF
        q = ack_id >> 16
        for e in self._inq:
            if e[0] == pid and e[2] == 0 and e[1] == (4 if q == 1 else 5):
                e[2] = 1
                break
        self._flush_acks(now)

    def _flush_acks(self, now):
        q = self._inq
        while q and q[0][2]:
            pid, t, _ = q.pop(0)
            if self.state != CONNECTED:
                continue
            if t == 5 and not self.store.in_has(pid):
                self.store.in_add(pid)
            self._ack(t, pid, 0, now)

    def _event(self, kind, a, b):
        if self.on_event:
            self.on_event(kind, a, b)

    # ------------------------------------------------------------------ timers

    def poll(self, now):
        """Keepalive. Returns ms until the next call is needed; raises
        OSError when the server stopped answering."""
        if self.state == DISCONNECTED:
            return 1000
        ka = self.keepalive * 1000
        if self.state == CONNECTING:
            if ticks_diff(now, self._last_tx) > (ka or 30000):
                self.connection_lost()
                raise OSError("no CONNACK within the keepalive interval")
            return 100
        if not ka:
            return 60000
        if self._ping_sent >= 0:
            limit = self.ping_timeout * 1000 if self.ping_timeout else ka
            waited = ticks_diff(now, self._ping_sent)
            if waited >= limit:
                self.connection_lost()
                raise OSError("no PINGRESP within %d ms: connection dead" % limit)
            return limit - waited
        idle = ticks_diff(now, self._last_tx)
        if idle >= ka:
            self._out(pkt.PINGREQ_BYTES, 0, 2, now)
            self._ping_sent = now
            return ka
        return ka - idle

    def disconnect(self, now, reason=0, props=None):
        """Send DISCONNECT (the will is discarded) and close the session."""
        if self.state == CONNECTED:
            if self.version == _V5 and (reason or props):
                self._packet(Packet(_DISCONNECT, reason=reason, props=props), now)
            else:
                self._out(b"\xe0\x00", 0, 2, now)
        self.connection_lost()
        self.store.commit()

    def connection_lost(self):
        """The transport is gone: nothing is lost, everything pending waits."""
        self.state = DISCONNECTED
        self.rx_len = 0
        self._inflight = 0
        self._ping_sent = -1
        self._reauth = False
        if self._inq is not None:
            self._inq = []
