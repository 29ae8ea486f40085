"""The blocking (or polled) client: a socket, a clock and a Session.

Over 600 lines because it holds the blocking client and the driver base it shares with tern.aio
(_Driver): a module of its own for the base would add a module to the heap of every board, most of
which load only the blocking client.

It only moves bytes and time between the socket and the session; the protocol
lives in the session. The transport is a TCP socket, or any byte stream given
as `stream=` (a UART to a cellular or LoRa modem in transparent mode, say).
Runs unchanged on MicroPython and CPython; the few places the two differ
(reading into a buffer, TLS, the clock) are the small functions at the top.

The drivers' rule for errors: an OSError is connection or storage trouble (a
socket that failed, a store whose write failed: see lib/tern/store.py) and an
MQTTError a broker that broke the protocol; either ends the connection and
loop() reconnects. Anything else is a bug and goes on to the caller (tern.aio's
background tasks, which have no caller, end the connection on it too and keep it
as last_error). From publish(), an OSError means not accepted (OutboxUnknown:
the store could not tell).
"""

import sys
import select

from .session import Session, NotConnected
from .wire import MQTTError, const

MICROPYTHON = sys.implementation.name == "micropython"

if MICROPYTHON:
    from time import ticks_ms, ticks_diff, ticks_add, sleep_ms

    def _read_into(sock, buf, n):
        r = sock.readinto(buf, n) if n < len(buf) else sock.readinto(buf)
        return -1 if r is None else r

    def _write(sock, buf, off, n):
        r = sock.write(buf, off, n)
        return 0 if r is None else r

else:
    import time
    from operator import add as ticks_add  # the clock does not wrap
    from ssl import SSLWantReadError, SSLWantWriteError

    def ticks_ms():
        return int(time.monotonic() * 1000)  # pyright: ignore[reportAttributeAccessIssue]  (CPython)

    def ticks_diff(a, b):
        return a - b

    def sleep_ms(ms):
        time.sleep(ms / 1000)

    # The socket would block: try again later (TLS may need to read before it
    # can write, and the other way round).
    _AGAIN = (BlockingIOError, InterruptedError, SSLWantReadError, SSLWantWriteError)

    def _read_into(sock, buf, n):
        try:
            return sock.recv_into(buf, n)
        except _AGAIN:
            return -1

    def _write(sock, buf, off, n):
        try:
            return sock.send(memoryview(buf)[off : off + n])
        except _AGAIN:
            return 0

    class _Stream:
        # A file-like stream (readinto/write, fileno for poll: pyserial, a pipe) seen as a socket.
        def __init__(self, f):
            self.f = f
            self.fileno = f.fileno

        def recv_into(self, buf, n):
            r = self.f.readinto(memoryview(buf)[:n])
            if r is None:
                raise BlockingIOError
            return r

        def send(self, data):
            r = self.f.write(data)
            if r is None:
                raise BlockingIOError
            return r


def nodelay(sock):
    """Turn Nagle's algorithm off: with it on, a small packet waits for the
    peer's ACK of the one before, and a broker delays that ACK by up to 40 ms
    when it has nothing to send back (a QoS 0 message after any other).
    Boards' socket modules name the option (lwIP's value differs from
    Linux's); MicroPython's unix port lacks the names, not the option, and
    gets the values of Linux and BSD (6, 1). A socket that does not take it
    keeps its default."""
    import socket  # here, not at the top: a board that talks over a UART has none

    try:
        sock.setsockopt(getattr(socket, "IPPROTO_TCP", 6), getattr(socket, "TCP_NODELAY", 1), 1)
    except (OSError, AttributeError):
        pass


class ConnectError(OSError):
    """The broker refused the connection; `reason` is its code, `permanent`
    says whether retrying can help."""

    def __init__(self, reason, version=4):
        from .refused import describe  # a refusal is rare: its words are not loaded before one

        msg, permanent = describe(reason, version)
        super().__init__(msg)
        self.reason = reason
        self.permanent = permanent


_CLOSED = "connection closed by the broker"

# The reconnect backoff, the one policy of every reconnect a board makes (the drivers' broker
# reconnect, the telemetry app's config defaults, its Wi-Fi reconnect): backoff_ms. Its defaults,
# in ms: the first wait after a failed attempt, and the longest.
BACKOFF_MIN_MS = const(250)
BACKOFF_MAX_MS = const(30000)


def backoff_ms(n, lo, hi):
    """The wait before attempt n + 1 after n failed ones (n >= 1), ms: lo ms doubling up to hi ms,
    with jitter (50-100 %: fleets must not reconnect in step)."""
    import random  # only a reconnect needs it: not imported at start

    d = lo * (1 << min(n - 1, 16))
    if d > hi:
        d = hi
    return int(d * (0.5 + random.getrandbits(16) / 131072))


class _Driver:
    """What the blocking and the asyncio driver share: where to connect, how
    to back off, the session and the application's callbacks."""

    def __init__(self, client_id, server, port, version, keepalive, clean, store, ssl, server_hostname,
                 reconnect, backoff_min, backoff_max, connect_timeout, healthy_after, opts):
        self.server = server
        self.port = port or (8883 if ssl else 1883)
        self.ssl = ssl
        self.server_hostname = server_hostname or server
        self.reconnect = reconnect
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self.connect_timeout = connect_timeout
        self.healthy_after = healthy_after
        if "user" in opts:  # umqtt's and mqtt_as's spelling
            opts["username"] = opts.pop("user")
        # A board takes the Session's buffers (1 KiB in, 512 bytes out: see its docstring); a host
        # can afford packets up to 1 MiB (MQTT 3.1.1 has no way to tell the broker a smaller limit)
        # and a transmit buffer that holds any usual packet, so each leaves in one write.
        if not MICROPYTHON:
            opts.setdefault("rx_size", 1 << 20)
            opts.setdefault("tx_size", 1 << 16)
        # version=(5, 4): MQTT 5, and 3.1.1 when the broker refuses 5 as
        # unsupported (see _fallback).
        vs = tuple(version) if isinstance(version, (tuple, list)) else (version,)
        if not vs or list(vs) != sorted(set(vs), reverse=True):
            raise ValueError("version: one protocol version, or several from the newest down, e.g. (5, 4)")
        self._versions = vs
        s = Session(client_id, vs[0], clean, keepalive, store, **opts)
        s.send = self._send
        s.on_event = self._on_event
        self.session = s
        v = s.store.meta("version") if len(vs) > 1 else None
        if v and int(v) in vs[1:]:
            v = int(v)  # what this store's broker took last time
        elif vs[0] == 3:
            v = 3  # an empty client id gets one
        else:
            v = 0
        if v:
            from .refused import set_version

            set_version(s, v)
        self.on_connect = None  # on_connect(session_present, reason)
        self.on_disconnect = None  # on_disconnect(error) when an established connection is lost
        self.on_published = None  # on_published(pid, reason)
        self.last_error = None
        self._attempt = 1  # 0 only after a connection that served healthy_after: see _backoff_ms
        # When the open connection was accepted (ticks_ms); None: no accepted
        # connection is open (the session may already know it is gone).
        self._up = None

    def _fallback(self, reason):
        # After a failed connect (reason: the CONNACK's refusal code, or the
        # error that ended the connection before a CONNACK, the broker closing
        # it counting as -1): True when the next version of version=(5, 4) is
        # to be tried now; else False, or ConnectError for a refusal (tern.refused).
        if not isinstance(reason, int):
            if reason.args != (_CLOSED,):
                return False  # another error (unreachable, reset, a protocol error): nothing to load for it
            reason = -1  # an end of stream
        from .refused import fallback

        return fallback(self, reason, ConnectError)

    def _retry(self, retry):
        # connect()'s retry: as given, else on for a durable store (FileStore, FlashStore: they are there
        # to hold messages while the broker is away); never without reconnect.
        return (getattr(self.session.store, "durable", False) if retry is None else retry) and self.reconnect

    def _ms(self, timeout):
        # A call's timeout in seconds (None: connect_timeout), in ms.
        return int((timeout if timeout is not None else self.connect_timeout) * 1000)

    def _mark(self, p):
        # The connection as the driver sees it (one method, not two: each
        # costs RAM). p: the CONNACK that arrived; the connection is up
        # unless it refused. p None: the connection is over; True if it had
        # been accepted, and one that lasted healthy_after seconds starts the
        # backoff afresh.
        if p is not None:
            self._connack = p
            if not p.reason:
                self._up = ticks_ms()
            return
        t = self._up
        self._up = None
        if t is None:
            return False
        if ticks_diff(ticks_ms(), t) >= self.healthy_after * 1000:
            self._attempt = 0
        return True

    def _full(self, qos, start, t, stop):
        # publish() found the outbox full: raises when waiting (t ms from
        # start) is over, or cannot help (QoS 1/2 while offline, and `stop`:
        # not reconnecting).
        late = ticks_diff(ticks_ms(), start) >= t
        if late or qos and stop and not self.connected:
            raise OSError("outbox full%s: %d messages await acknowledgement"
                           % ("" if late else " (offline)", len(self.session.pending())))

    def _backoff_ms(self, e):
        # After a lost connection or a failed attempt (e, kept as
        # last_error): the wait before the next attempt, ms; None, and no
        # more reconnecting, when retrying cannot help (a permanent refusal).
        self.last_error = e
        if isinstance(e, ConnectError) and e.permanent:
            self.reconnect = False
            return None
        # The first try after a connection that served healthy_after seconds
        # goes at once: a dropped link or a broker back from a restart is met
        # without a wait. Then backoff_min doubling up to backoff_max. A
        # connection that ends sooner keeps the count (from 1 at the start),
        # so a broker that drops clients soon after accepting them (shedding
        # load) sees backed-off, jittered retries, not a storm.
        n = self._attempt
        self._attempt += 1
        return backoff_ms(n, self.backoff_min * 1000, self.backoff_max * 1000) if n else 0


# What _wait() waits for, as a number rather than a closure (a closure is a
# function object more, and an allocation per wait).
_ACKED = const(1)  # the message with packet id `pid` is acknowledged (pid -1: every message)
_REPLIED = const(3)  # the SUBACK/UNSUBACK for packet id `pid` arrived
_AUTHED = const(4)  # the re-authentication ended, accepted or not

# session.py's states and events (its public constants), folded here.
# After DISCONNECT the client waits this long for the broker to close before
# it half-closes (then waits out linger_ms). A broker may read the DISCONNECT
# and the end of stream behind it in one go and take the end of stream first:
# amqtt 0.12 then publishes the will of a clean disconnect. On DISCONNECT the
# server must discard the will and should close the connection (MQTT 3.1.1 and
# 5.0, section 3.14.4), so a broker that does costs nothing; one that waits
# for the client to close costs GRACE_MS. Shared with tern.aio.
GRACE_MS = const(250)
_DISCONNECTED = const(0)
_CONNECTED = const(2)
_WOULD_BLOCK = const(-1)
_SLOW = const(-2)
_EV_CONNACK = const(1)
_EV_PUBLISHED = const(2)
_EV_SUBACK = const(3)
_EV_UNSUBACK = const(4)
_EV_DISCONNECT = const(5)
_EV_AUTH = const(7)
_EV_LOST = const(8)


class Client(_Driver):
    """An MQTT client for MicroPython and CPython.

    version: 3 (3.1), 4 (3.1.1) or 5; (5, 4): MQTT 5, or 3.1.1 with a broker
    that turns MQTT 5 down (kept in the store's meta; see the README).
    store: where accepted messages live until acknowledged (default: RAM).
    ssl: True (verify the server with the system's CAs; CPython only), or an
    ssl.SSLContext. `tern.tls.context(ca=path)` makes one that verifies on
    both runtimes (a bare MicroPython SSLContext verifies nothing).
    reconnect: after a lost connection, `loop()` reconnects: at once when the
    connection had served healthy_after seconds, then with exponential
    backoff and jitter between backoff_min and backoff_max seconds; not
    after close() or disconnect() until connect() is called again. The
    same policy dials a broker that was away when connect() was called
    (connect's `retry`, on by default with a durable store).
    Set handlers (on_message, subscribe(handler=...)) before connect():
    a persistent session's queued messages can arrive with the CONNACK.
    stream: use this open byte stream instead of a TCP connection (non-blocking
    readinto/write, pollable: a machine.UART to a modem in transparent mode);
    each connect() sends CONNECT over it, and it is never closed by the client.
    """

    def __init__(self, client_id="", server="127.0.0.1", port=None, version=4, keepalive=60,
                 clean=True, store=None, ssl=None, server_hostname=None, reconnect=True,
                 backoff_min=BACKOFF_MIN_MS / 1000, backoff_max=BACKOFF_MAX_MS / 1000, connect_timeout=10,
                 healthy_after=10, stream=None, **opts):
        _Driver.__init__(self, client_id, server, port, version, keepalive, clean, store, ssl, server_hostname,
                         reconnect, backoff_min, backoff_max, connect_timeout, healthy_after, opts)
        self.sock = None
        self.stream = stream
        # When loop() may reconnect (not 0: half a period on, 0 is in the
        # future); None after close() or disconnect(): not until connect().
        self._next_try = ticks_ms()
        self._replies = {}  # pid -> SUBACK/UNSUBACK reason codes, while a call waits for them
        # _poll, _pend, _due, _connack and _authed are set before use, by connect() and
        # reauthenticate(): a smaller instance until then.

    # The session's default handler for messages no subscription handler took.
    @property
    def on_message(self):
        return self.session.on_message

    @on_message.setter
    def on_message(self, handler):
        self.session.on_message = handler

    @property
    def connected(self):
        return self.session.state == _CONNECTED

    # ------------------------------------------------------------- transport

    def _drop(self, e=None):
        # Close the transport; the session keeps everything pending. The poll
        # object goes with the socket: connect() makes a new one. With e, a
        # connection was lost: kept as last_error, reported if it had been
        # accepted (the driver's own flag: the session may already have
        # dropped to DISCONNECTED on a protocol violation, a dead keepalive or
        # the server's DISCONNECT), and a reconnect scheduled.
        was = self._mark(None)
        self.session.connection_lost()
        sock = self.sock
        self.sock = None
        if sock is not None and self.stream is None:  # the application's stream stays open
            try:
                sock.close()
            except OSError:
                pass
        if e is None:
            return
        self.last_error = e  # before on_disconnect, which may read it
        if was and self.on_disconnect:
            self.on_disconnect(e)
        if self._next_try is not None:  # not after close() (a handler's, under a feed)
            self._next_try = ticks_add(ticks_ms(), self._backoff_ms(e))

    def _send(self, buf, off, n):
        if self.sock is None:
            raise OSError("not connected")
        k = _write(self.sock, buf, off, n)
        if k < n:  # the socket pushed back: the rest waits for room (kept apart: a small frame for this one)
            self._send_rest(buf, off + k, n - k)

    def _send_rest(self, buf, off, n):
        sock = self.sock
        end = off + n
        deadline = ticks_add(ticks_ms(), self._ms(None))
        while off < end:
            k = _write(sock, buf, off, end - off)
            if k:
                off += k
                continue
            if ticks_diff(deadline, ticks_ms()) <= 0:
                raise OSError("send timed out")
            p = self._poll  # the connection's own, for writing a moment: no poll object per wait
            p.modify(sock, select.POLLOUT)
            p.poll(50)
            p.modify(sock, select.POLLIN)

    # --------------------------------------------------------------- session

    def _on_event(self, kind, a, b):
        if kind == _EV_CONNACK:
            self._mark(b)
            if self.on_connect:
                self.on_connect(a, b.reason)
        elif kind == _EV_PUBLISHED:
            if self.on_published:
                self.on_published(a, b)
        elif kind == _EV_SUBACK or kind == _EV_UNSUBACK:
            if a in self._replies:  # someone waits for it: a late reply to a call that timed out is dropped
                self._replies[a] = b
        elif kind == _EV_AUTH:
            self._authed = True
        elif kind == _EV_LOST:
            # a write failed under publish() (a QoS 1/2 message is kept); the connection is over
            self._drop(b)
        elif kind == _EV_DISCONNECT:
            from .v5 import server_disconnect

            self._drop(server_disconnect(a, b))

    def connect(self, timeout=None, retry=None):
        """Open the connection and wait for CONNACK; returns session present.
        Raises ConnectError on a refusal, OSError when unreachable.
        retry (default: True for a durable store, FileStore or FlashStore):
        when the broker cannot be reached (refused, unreachable, a name that
        does not resolve, no CONNACK in time), return None instead of raising;
        loop() dials on with the reconnect policy (as after a lost
        connection), last_error says why, and publish() stores QoS 1/2
        messages meanwhile. A permanent refusal (credentials) still raises."""
        try:
            return self._connect(timeout)
        except (OSError, MQTTError) as e:  # a ConnectError too
            if not self._retry(retry):
                raise
            self._later(e)  # (raises a permanent refusal)

    def _later(self, e):
        # A failed attempt (e): the next one after the backoff; e raised when retrying cannot help.
        d = self._backoff_ms(e)
        if d is None:
            raise e
        self._next_try = ticks_add(ticks_ms(), d)

    def _connect(self, timeout):
        self._drop()
        self._next_try = ticks_ms()
        self._connack = None
        if self.stream is None:
            sock = self._dial()
        else:
            sock = self.stream if MICROPYTHON else _Stream(self.stream)
        self.sock = sock
        self._pend = getattr(sock, "pending", None)  # TLS: bytes it holds decrypted (looked up once: see _io)
        self._due = ticks_ms()  # the keepalive poll: due at once (see loop)
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        s = self.session
        now = ticks_ms()
        mute = False
        try:
            s.connect_packet(now)
            limit = self._ms(timeout)
            while self._connack is None:
                left = limit - ticks_diff(ticks_ms(), now)
                if left <= 0:
                    mute = True
                    raise OSError("no CONNACK from %s:%d within %d ms" % (self.server, self.port, limit))
                self._io(left if left < 100 else 100)
                if self.sock is None and self._connack is None:
                    raise OSError(_CLOSED)
        except (OSError, MQTTError) as e:
            if self._up is None:  # refused, or no CONNACK: connect() failed
                self._drop()
                if self._connack is None and self._fallback(-1 if mute else e):
                    return self._connect(timeout)
                raise
            # Accepted, then lost while reading what followed the CONNACK:
            # connect() succeeded; loop() deals with the loss.
            self._drop(e)
        r = self._connack.reason
        if r:
            self._drop()
            self._fallback(r)  # raises ConnectError unless the next version is to be tried
            return self._connect(timeout)
        return s.session_present

    def _dial(self):
        # A TCP connection to server:port (TLS when asked), non-blocking.
        import socket

        err = None
        for ai in socket.getaddrinfo(self.server, self.port, 0, socket.SOCK_STREAM):
            sock = socket.socket(ai[0], socket.SOCK_STREAM)
            try:
                sock.settimeout(self.connect_timeout)
                sock.connect(ai[-1])
                nodelay(sock)
                break
            except OSError as e:  # try the next address (IPv6 first, broker on IPv4 ...)
                sock.close()
                err = e
        else:
            raise err or OSError("%s does not resolve" % self.server)
        try:
            if self.ssl:
                from .tls import wrap

                sock = wrap(sock, self.ssl, self.server_hostname)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    def _io(self, ms):
        """Wait up to ms for data, feed it to the session. False: nothing came."""
        s = self.session
        s.flush()  # inside a handler's blocking call: what the feed under way queued goes out before we wait
        if s.rx_len:  # whole frames may wait there, behind a handler that raised
            s.feed_n(0, ticks_ms())
        sock = self.sock
        if sock is None:
            return False
        pend = self._pend
        if not (pend and pend()):  # TLS may hold decrypted bytes the socket no longer shows
            if ms < 0:
                ms = 0
            if MICROPYTHON:
                for _ in self._poll.ipoll(ms):  # ipoll: no list allocated
                    break
                else:
                    return False
            elif not self._poll.poll(ms):
                return False
        while self._read(s, sock):
            pass
        return True

    def _read(self, s, sock):
        # One read into the session's receive buffer, fed to it; True: there may be more to read.
        # (Apart from _io: each of the two keeps a frame small enough for the stack.)
        rl = s.rx_len
        room = len(s.rx) - rl  # what the driver may write at rx[rx_len:]
        if room <= 0:
            return False
        n = _read_into(sock, s.rxmv[rl:] if rl else s.rxmv, room)
        if n < 0:
            return False
        if n == 0:
            raise OSError(_CLOSED)
        s.feed_n(n, ticks_ms())
        return self.sock is not None and n == room

    def loop(self, timeout_ms=0, brief=False):
        """Do the client's work for up to timeout_ms (0: one pass without
        waiting): receive, keepalive, reconnect. Returns True while connected.
        brief: return after the first pass that received something (the
        blocking calls then look whether what they wait for came)."""
        start = ticks_ms()
        timeout_ms = int(timeout_ms)
        while True:
            now = ticks_ms()
            left = timeout_ms - ticks_diff(now, start)
            s = self.session
            if s.state == _DISCONNECTED:
                if self._next_try is None or not self.reconnect:
                    return False
                wait = ticks_diff(self._next_try, now)
                if wait > 0:
                    if left <= 0:
                        return False
                    sleep_ms(wait if wait < left else left)
                    continue
                try:
                    self.connect()  # (with retry on, it schedules the next try itself: the same _later)
                except (OSError, MQTTError) as e:  # a ConnectError too; MQTTError: a broker that broke the protocol
                    self._later(e)
                continue
            try:
                nxt = s.poll(now)
                self._due = ticks_add(now, nxt)  # when poll() is next needed (see wait_published)
                got = self._io(nxt if nxt < left else left)
            except (OSError, MQTTError) as e:
                self._drop(e)
                continue
            if brief and got or ticks_diff(ticks_ms(), start) >= timeout_ms:
                return self.connected

    def _wait(self, kind, pid, t, what):
        # loop() until the condition holds; OSError "<what> timed out" after
        # t ms. Returns the reason codes of the SUBACK/UNSUBACK it waited for.
        s = self.session
        r = self._replies
        start = ticks_ms()
        if kind == _REPLIED:
            r[pid] = None  # awaited: _on_event fills it in
        try:
            while True:
                if kind == _ACKED:
                    if not s.is_pending(pid):
                        return
                elif kind == _REPLIED:
                    if r[pid] is not None:
                        return r[pid]
                elif self._authed or not s.reauthing:  # _AUTHED
                    return
                left = t - ticks_diff(ticks_ms(), start)
                if left <= 0:
                    raise OSError(what + " timed out")
                if s.state == _DISCONNECTED and (self._next_try is None or not self.reconnect):
                    # Nothing can change: loop() would return at once, and
                    # waiting on would spin the CPU for the whole timeout.
                    raise NotConnected(what + ": not connected, and not reconnecting")
                self.loop(left if left < 50 else 50, True)
        finally:
            if kind == _REPLIED:
                r.pop(pid, None)

    def publish(self, topic, payload, *extra, qos=0, retain=False, props=None, timeout=None):
        """Send a message. QoS 1/2: returns its packet id once the message is
        in the store (durable with a flash or file store); it is sent now or
        after the next connect. QoS 0: sent now (NotConnected when offline).
        qos and retain are keywords: umqtt's publish(t, m, True) means retain,
        and is refused with a TypeError that says so (nothing stored)."""
        if extra:
            from .refused import positional

            positional(extra)
        if isinstance(payload, str):
            payload = payload.encode()
        s = self.session
        if (qos == 0 or qos == 1) and not (retain or props):
            # The steady route as Session.publish takes it first (pub0, pub1; the error contract
            # send_failed), here without publish()'s frame from the heap; else, or -2 from them,
            # Session.publish's general route.
            try:
                pid = s.pub1(topic, payload) if qos else s.pub0(topic, payload)
            except (TypeError, NotImplementedError):
                # a topic that is no dict key, a payload that is no buffer (MicroPython's slice
                # store says NotImplementedError), both before anything is stored or sent:
                # Session.publish says what is wrong
                pid = _SLOW
            except OSError as e:
                if qos:
                    raise  # pub1: the store failed, nothing accepted
                s.send_failed(e, 0)  # pub0: the send failed (raises; EV_LOST drops the connection)
            if pid != _SLOW:
                s.last_tx = ticks_ms()
                if pid:
                    try:
                        s.flush()  # pub1's packet
                    except OSError as e:
                        s.send_failed(e, 1)  # accepted (stored): it goes out after the next CONNACK
                return pid
        start = None  # the wait for room, timed from the first refusal (no clock read for a message that goes)
        while True:
            pid = s.publish(topic, payload, qos, retain, ticks_ms(), props)
            if pid != _WOULD_BLOCK:
                return pid
            if start is None:
                start = ticks_ms()
            self._full(qos, start, self._ms(timeout), self._next_try is None or not self.reconnect)
            self.loop(20, True)

    def wait_published(self, pid, timeout=None):
        """Block until the message with this packet id is acknowledged (0, what publish() returns
        for QoS 0: at once)."""
        # The steady case in a frame of 11 words (see Session.pub0): while connected, what
        # arrives is read and handled (_recv) without loop()'s clock reads and keepalive poll;
        # loop() runs a pass when the keepalive is due. Offline, and at the deadline: _wait's.
        s = self.session
        timeout = self._ms(timeout)
        if timeout > 0x1FFFFFFF:  # beyond what ticks_add takes on MicroPython (2**29 ms, 6.2 days)
            return self._wait(_ACKED, pid, timeout, "wait_published" if pid > 0 else "wait_all")
        timeout = ticks_add(ticks_ms(), timeout)  # the deadline
        while s.is_pending(pid):  # (pid -1, from wait_all: any message)
            left = ticks_diff(timeout, ticks_ms())
            if left <= 0 or s.state != _CONNECTED:
                return self._wait(_ACKED, pid, left if left > 0 else 0, "wait_published" if pid > 0 else "wait_all")
            if ticks_diff(self._due, ticks_ms()) < 50:
                self.loop()  # one pass: the keepalive poll (and what it reads)
            else:
                self._recv(left if left < 50 else 50)

    def _recv(self, ms):
        # loop()'s read step for wait_published: what arrives within ms read and handled; a lost
        # connection dropped as loop() drops it (loop() then reconnects).
        try:
            self._io(ms)
        except (OSError, MQTTError) as e:
            self._drop(e)

    def wait_all(self, timeout=None):
        """Block until nothing is pending (everything published is acknowledged)."""
        self.wait_published(-1, timeout)

    def subscribe(self, topic_filter, qos=0, handler=None, timeout=None, **opts):
        """Subscribe and wait for SUBACK; returns its reason codes (granted QoS
        or a failure >= 0x80). Offline, or with the outbox full: registers it
        and returns None; it is sent on connect, or once an acknowledgement
        makes room.
        handler(msg) gets each message of this subscription (MQTT 5:
        by subscription identifier; otherwise by topic matching)."""
        pid = self.session.subscribe(topic_filter, qos, ticks_ms(), handler, **opts)
        return self._wait(_REPLIED, pid, self._ms(timeout), "subscribe") if pid else None

    def unsubscribe(self, topic_filter, timeout=None, **opts):
        pid = self.session.unsubscribe(topic_filter, ticks_ms(), **opts)
        return self._wait(_REPLIED, pid, self._ms(timeout), "unsubscribe") if pid else None

    def ack(self, ack_id):
        """Manual acknowledgement mode: acknowledge a message (msg.ack_id)."""
        self.session.ack(ack_id, ticks_ms())

    def reply(self, msg, payload, qos=0, props=None, timeout=None):
        """Answer a request (MQTT 5): publish to msg's Response Topic with its
        Correlation Data. ValueError when msg has no Response Topic."""
        from .v5 import reply_args

        topic, props = reply_args(msg, props)
        return self.publish(topic, payload, qos=qos, props=props, timeout=timeout)

    def reauthenticate(self, props=None, timeout=None):
        """Re-authenticate on the open connection (MQTT 5 enhanced
        authentication; the auth hook answers the server's challenges).
        Returns once the server accepted; raises MQTTError with the server's
        DISCONNECT reason when it refused."""
        self._authed = False
        self.session.reauthenticate(ticks_ms(), props)
        self._wait(_AUTHED, 0, self._ms(timeout), "reauthenticate")
        if not self._authed:
            raise self.last_error or OSError("re-authentication failed")

    def disconnect(self, reason=0, props=None, linger_ms=1000):
        """Send DISCONNECT and let the broker close first: read (and drop)
        until its end of stream, at most linger_ms, then close. Our own end
        of stream (a half-close) goes only after GRACE_MS (see there); where
        the socket has no shutdown() (MicroPython) we only wait. Closing with
        unread bytes would make the kernel reset the connection, and the
        broker drop our last acknowledgements and the DISCONNECT itself."""
        sock = self.sock
        try:
            if sock is not None:
                self.session.disconnect(ticks_ms(), reason, props)
                shut = getattr(sock, "shutdown", None)
                mv = self.session.rxmv  # the session is done with it: what arrives now is discarded
                t0 = ticks_ms()
                while True:
                    gone = ticks_diff(ticks_ms(), t0)
                    if shut is not None and gone >= GRACE_MS:
                        shut(1)  # SHUT_WR: a broker that waits for the client to close reads it now
                        shut = None
                    wait = min(GRACE_MS if shut is not None else linger_ms, linger_ms) - gone
                    if wait <= 0:
                        break
                    if self._poll.poll(wait) and _read_into(sock, mv, len(mv)) == 0:
                        break  # the broker closed: everything we sent was read
        except OSError:
            pass
        self.close()

    def close(self):
        """Drop the connection without DISCONNECT (the broker sends the will).
        loop() then stays offline until connect() is called again. What the
        store holds uncommitted (group commit: acknowledgements) is committed."""
        self._drop()
        self._next_try = None
        self.session.store.commit()
