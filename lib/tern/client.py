"""The blocking (or polled) client: a socket, a clock and a Session.

It only moves bytes and time between the socket and the session; the protocol
lives in the session. Runs unchanged on MicroPython and CPython; the few
places the two differ (reading into a buffer, TLS, the clock) are the small
functions at the top.
"""

import sys
import select
import socket

from . import session as S
from .wire import MQTTError

MICROPYTHON = sys.implementation.name == "micropython"

if MICROPYTHON:
    import time
    from time import ticks_ms, ticks_diff, sleep_ms

    def _read_into(sock, mv, n):
        r = sock.readinto(mv, n) if n < len(mv) else sock.readinto(mv)
        return -1 if r is None else r

    def _write(sock, buf, off, n):
        r = sock.write(buf, off, n)
        return 0 if r is None else r

    def _rand():
        import random

        return random.getrandbits(16) / 65536

else:
    import time
    import random as _random

    def ticks_ms():
        return int(time.monotonic() * 1000)

    def ticks_diff(a, b):
        return a - b

    def sleep_ms(ms):
        time.sleep(ms / 1000)

    def _read_into(sock, mv, n):
        try:
            r = sock.recv_into(mv, n)
        except (BlockingIOError, InterruptedError):
            return -1
        except OSError as e:
            # ssl.SSLWantReadError is an OSError subclass
            if e.__class__.__name__ in ("SSLWantReadError", "SSLWantWriteError"):
                return -1
            raise
        return r

    def _write(sock, buf, off, n):
        try:
            return sock.send(memoryview(buf)[off : off + n])
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as e:
            if e.__class__.__name__ in ("SSLWantReadError", "SSLWantWriteError"):
                return 0
            raise

    def _rand():
        return _random.random()


# CONNACK refusals that a retry cannot fix: bad or unknown identity.
_PERMANENT = (2, 4, 5, 0x84, 0x85, 0x86, 0x87, 0x8A, 0x8C)
# Names for the refusals a user most often has to act on.
_WHY = {4: "bad user name or password", 5: "not authorized", 0x86: "bad user name or password",
        0x87: "not authorized", 0x8A: "banned", 0x8C: "bad authentication method"}


class ConnectError(OSError):
    """The broker refused the connection; `reason` is its code, `permanent`
    says whether retrying can help."""

    def __init__(self, reason, msg=None):
        if msg is None:
            w = _WHY.get(reason)
            msg = "connection refused by the broker: reason 0x%02X%s" % (reason, " (%s)" % w if w else "")
        super().__init__(msg)
        self.reason = reason
        self.permanent = reason in _PERMANENT


def server_disconnect(reason, p):
    """The error for a DISCONNECT from the server, with its reason string."""
    rs = p.props.get(0x1F) if p is not None and p.props else None
    return MQTTError(reason, "server sent DISCONNECT" + (": " + rs if rs else ""))


def reply_args(msg, props):
    """(topic, properties) to answer a request message `msg` (MQTT 5
    request/response): its Response Topic, with its Correlation Data copied."""
    mp = msg.properties or {}
    topic = mp.get(0x08)
    if not topic:
        raise ValueError("the message has no response topic to reply to")
    out = dict(props) if props else {}
    if 0x09 in mp:
        out[0x09] = mp[0x09]
    return topic, out


class _Driver:
    """What the blocking and the asyncio driver share: where to connect, how
    to back off, the session and the application's callbacks."""

    def __init__(self, client_id, server, port, version, keepalive, clean, store, ssl, server_hostname,
                 reconnect, backoff_min, backoff_max, connect_timeout, healthy_after, session_opts):
        self.server = server
        self.port = port or (8883 if ssl else 1883)
        self.ssl = ssl
        self.server_hostname = server_hostname or server
        self.reconnect = reconnect
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self.connect_timeout = connect_timeout
        self.healthy_after = healthy_after
        # A board gets 4 KiB; a host can afford packets up to 1 MiB (MQTT 3.1.1
        # has no way to tell the broker a smaller limit).
        session_opts.setdefault("rx_size", 4096 if MICROPYTHON else 1 << 20)
        s = S.Session(client_id, version, clean, keepalive, store, **session_opts)
        s.send = self._send
        s.on_event = self._on_event
        self.session = s
        self.on_connect = None  # on_connect(session_present, reason)
        self.on_disconnect = None  # on_disconnect(error) when an established connection is lost
        self.on_published = None  # on_published(pid, reason)
        self.last_error = None
        self._attempt = 0
        self._up = False  # an accepted connection is open (the session may already know it is gone)
        self._up_since = 0

    def _tls_context(self):
        # ssl=True: the system's CAs, verification on (CPython only)
        ctx = self.ssl
        if ctx is True:
            from .tls import context

            ctx = context()
        return ctx

    def _backoff_ms(self):
        d = self.backoff_min * (1 << min(self._attempt, 16))
        if d > self.backoff_max:
            d = self.backoff_max
        d = d * (0.5 + _rand() / 2)  # jitter: fleets must not reconnect in step
        self._attempt += 1
        return int(d * 1000)


class Client(_Driver):
    """An MQTT client for MicroPython and CPython.

    store: where accepted messages live until acknowledged (default: RAM).
    ssl: True (verify the server with the system's CAs; CPython only), or an
    ssl.SSLContext. `tern.tls.context(ca=path)` makes one that verifies on
    both runtimes (a bare MicroPython SSLContext verifies nothing).
    reconnect: after a lost connection, `loop()` reconnects with exponential
    backoff and jitter between backoff_min and backoff_max seconds.
    Set handlers (on_message, subscribe(handler=...)) before connect():
    a persistent session's queued messages can arrive with the CONNACK.
    """

    def __init__(self, client_id="", server="127.0.0.1", port=None, version=4, keepalive=60,
                 clean=True, store=None, ssl=None, server_hostname=None, reconnect=True,
                 backoff_min=0.25, backoff_max=30, connect_timeout=10, healthy_after=10, **session_opts):
        _Driver.__init__(self, client_id, server, port, version, keepalive, clean, store, ssl, server_hostname,
                         reconnect, backoff_min, backoff_max, connect_timeout, healthy_after, session_opts)
        self.sock = None
        self._poll = None
        self._next_try = 0
        self._replies = {}
        self._connack = None
        self._authed = False
        self._can_publish = self._publish_unblocked  # bound once: no allocation per wait

    def _publish_unblocked(self):
        s = self.session
        return not s.outbox_full() and not s.wait_needed()

    # The session's default handler for messages no subscription handler took.
    @property
    def on_message(self):
        return self.session.on_message

    @on_message.setter
    def on_message(self, fn):
        self.session.on_message = fn

    @property
    def connected(self):
        return self.session.state == S.CONNECTED

    # ------------------------------------------------------------- transport

    def _open(self):
        err = None
        for ai in socket.getaddrinfo(self.server, self.port, 0, socket.SOCK_STREAM):
            sock = socket.socket(ai[0], socket.SOCK_STREAM)
            try:
                sock.settimeout(self.connect_timeout)
                sock.connect(ai[-1])
                break
            except OSError as e:  # try the next address (IPv6 first, broker on IPv4 ...)
                sock.close()
                err = e
        else:
            raise err or OSError("%s does not resolve" % self.server)
        try:
            if self.ssl:
                sock = self._wrap(sock)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)

    def _wrap(self, sock):
        ctx = self._tls_context()  # outside the try: a bad ssl argument stays a ValueError
        try:
            return ctx.wrap_socket(sock, server_hostname=self.server_hostname)
        except OSError:  # CPython's SSLCertVerificationError is a ValueError too: kept as it is
            raise
        except ValueError as e:  # MicroPython's mbedtls: the server failed verification
            raise OSError("TLS: " + str(e).strip())  # like CPython's SSLError: retried with backoff

    def _close(self):
        if self.sock is not None:
            try:
                self._poll.unregister(self.sock)
            except Exception:
                pass
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

    def _send(self, buf, off, n):
        sock = self.sock
        if sock is None:
            raise OSError("not connected")
        end = off + n
        deadline = ticks_ms() + self.connect_timeout * 1000
        while off < end:
            k = _write(sock, buf, off, end - off)
            if k:
                off += k
                continue
            if ticks_diff(deadline, ticks_ms()) <= 0:
                raise OSError("send timed out")
            p = select.poll()
            p.register(sock, select.POLLOUT)
            p.poll(50)

    def _lost(self, err):
        # The session may already have dropped to DISCONNECTED (a protocol
        # violation, a dead keepalive): the driver keeps its own flag.
        was = self._up
        self._up = False
        self.session.connection_lost()
        self._close()
        self.last_error = err
        if was:
            if ticks_diff(ticks_ms(), self._up_since) >= self.healthy_after * 1000:
                self._attempt = 0
            if self.on_disconnect:
                self.on_disconnect(err)
        self._schedule_retry()

    def _schedule_retry(self):
        self._next_try = ticks_ms() + self._backoff_ms()

    # --------------------------------------------------------------- session

    def _on_event(self, kind, a, b):
        if kind == S.EV_CONNACK:
            self._connack = b
            if self.on_connect:
                self.on_connect(a, b.reason)
        elif kind == S.EV_PUBLISHED:
            if self.on_published:
                self.on_published(a, b)
        elif kind == S.EV_SUBACK or kind == S.EV_UNSUBACK:
            self._replies[a] = b
        elif kind == S.EV_AUTH:
            self._authed = True
        elif kind == S.EV_LOST:
            self._lost(b)  # a write failed under publish(): the message is kept, the connection is over
        elif kind == S.EV_DISCONNECT:
            self._up = False
            self._close()
            self.last_error = server_disconnect(a, b)
            if self.on_disconnect:
                self.on_disconnect(self.last_error)
            self._schedule_retry()

    def connect(self, timeout=None):
        """Open the connection and wait for CONNACK; returns session present.
        Raises ConnectError on a refusal, OSError when unreachable."""
        self._close()
        self._connack = None
        self._open()
        s = self.session
        now = ticks_ms()
        try:
            s.connect_packet(now)
            limit = (timeout if timeout is not None else self.connect_timeout) * 1000
            while self._connack is None:
                left = limit - ticks_diff(ticks_ms(), now)
                if left <= 0:
                    raise OSError("no CONNACK from %s:%d within %d ms" % (self.server, self.port, limit))
                self._io(left if left < 100 else 100)
                if self.sock is None and self._connack is None:
                    raise OSError("connection closed by %s:%d before CONNACK" % (self.server, self.port))
        except (OSError, MQTTError) as e:
            if self._connack is None or self._connack.reason:
                s.connection_lost()
                self._close()
                raise
            # Accepted, then lost while reading what followed the CONNACK:
            # connect() succeeded; loop() deals with the loss.
            self._up_since = ticks_ms()
            self._up = True
            self._lost(e)
            return s.session_present
        p = self._connack
        if p.reason:
            self._close()
            raise ConnectError(p.reason)
        self._up_since = ticks_ms()
        self._up = True
        return s.session_present

    def _readable(self, wait_ms):
        if MICROPYTHON:
            for _ in self._poll.ipoll(wait_ms):  # ipoll: no list allocated
                return True
            return False
        return bool(self._poll.poll(wait_ms))

    def _io(self, wait_ms):
        """Wait up to wait_ms for data, feed it to the session."""
        sock = self.sock
        if sock is None:
            return
        s = self.session
        pend = getattr(sock, "pending", None)
        if not (pend and pend()) and not self._readable(wait_ms if wait_ms > 0 else 0):
            return
        while True:
            room = s.rx_space()
            if room <= 0:
                break
            rl = s.rx_len
            mv = s._rxmv if rl == 0 else s._rxmv[rl:]
            n = _read_into(sock, mv, room)
            if n < 0:
                break
            if n == 0:
                raise OSError("connection closed by the broker")
            s.feed_n(n, ticks_ms())
            if self.sock is None or n < room:
                break

    def loop(self, timeout_ms=0):
        """Do the client's work for up to timeout_ms (0: one pass without
        waiting): receive, keepalive, reconnect. Returns True while connected."""
        return self._run(timeout_ms, None)

    def _run(self, timeout_ms, done):
        # loop() that also returns as soon as done() holds after a pass
        start = ticks_ms()
        while True:
            now = ticks_ms()
            left = timeout_ms - ticks_diff(now, start)
            s = self.session
            if s.state == S.DISCONNECTED:
                if not self.reconnect:
                    return False
                wait = ticks_diff(self._next_try, now)
                if wait > 0:
                    if left <= 0:
                        return False
                    sleep_ms(wait if wait < left else left)
                    continue
                try:
                    self.connect()
                except ConnectError as e:
                    self.last_error = e
                    if e.permanent:
                        self.reconnect = False
                        raise
                    self._schedule_retry()
                except OSError as e:
                    self.last_error = e
                    self._schedule_retry()
                continue
            try:
                nxt = s.poll(now)
                w = nxt if nxt < left else left
                self._io(w if w > 0 else 0)
            except (OSError, MQTTError) as e:
                self._lost(e)
                continue
            if done is not None and done():
                return self.connected
            if ticks_diff(ticks_ms(), start) >= timeout_ms:
                return self.connected

    def _pump_until(self, done, timeout_ms, what):
        start = ticks_ms()
        while not done():
            left = timeout_ms - ticks_diff(ticks_ms(), start)
            if left <= 0:
                raise OSError("timed out waiting for " + what)
            self._run(left if left < 50 else 50, done)

    def publish(self, topic, payload, qos=0, retain=False, props=None, timeout=None):
        """Send a message. QoS 1/2: returns its packet id once the message is
        in the store (durable with a flash or file store); it is sent now or
        after the next connect. QoS 0: sent now (NotConnected when offline)."""
        if isinstance(payload, str):
            payload = payload.encode()
        s = self.session
        t = timeout if timeout is not None else self.connect_timeout
        start = ticks_ms()
        while True:
            pid = s.publish(topic, payload, qos, retain, ticks_ms(), props)
            if pid != S.WOULD_BLOCK:
                return pid
            if ticks_diff(ticks_ms(), start) > t * 1000:
                raise OSError("outbox full: %d messages await acknowledgement" % s._n)
            if s.state != S.CONNECTED and qos:
                if not self.reconnect:
                    raise OSError("outbox full while offline")
            self._run(20, self._can_publish)

    def wait_published(self, pid, timeout=None):
        """Block until the message with this packet id is acknowledged."""
        t = timeout if timeout is not None else self.connect_timeout
        self._pump_until(lambda: not self.session.is_pending(pid), t * 1000, "acknowledgement of %d" % pid)

    def wait_all(self, timeout=None):
        """Block until nothing is pending (everything published is acknowledged)."""
        t = timeout if timeout is not None else self.connect_timeout
        self._pump_until(lambda: not self.session.pending(), t * 1000, "all acknowledgements")

    def _await_reply(self, pid, timeout):
        if not pid:
            return None
        t = timeout if timeout is not None else self.connect_timeout
        self._pump_until(lambda: pid in self._replies, t * 1000, "SUBACK/UNSUBACK")
        return self._replies.pop(pid)

    def subscribe(self, topic_filter, qos=0, handler=None, timeout=None, **opts):
        """Subscribe and wait for SUBACK; returns its reason codes (granted QoS
        or a failure >= 0x80). Offline: registers it, and it is sent on connect.
        handler(msg) gets each message of this subscription (MQTT 5:
        by subscription identifier; otherwise by topic matching)."""
        pid = self.session.subscribe(topic_filter, qos, ticks_ms(), handler, **opts)
        return self._await_reply(pid, timeout)

    def unsubscribe(self, topic_filter, timeout=None, **opts):
        pid = self.session.unsubscribe(topic_filter, ticks_ms(), **opts)
        return self._await_reply(pid, timeout)

    def ack(self, ack_id):
        """Manual acknowledgement mode: acknowledge a message (msg.ack_id)."""
        self.session.ack(ack_id, ticks_ms())

    def reply(self, msg, payload, qos=0, props=None, timeout=None):
        """Answer a request (MQTT 5): publish to msg's Response Topic with its
        Correlation Data. ValueError when msg has no Response Topic."""
        topic, props = reply_args(msg, props)
        return self.publish(topic, payload, qos, False, props, timeout)

    def reauthenticate(self, props=None, timeout=None):
        """Re-authenticate on the open connection (MQTT 5 enhanced
        authentication; the auth hook answers the server's challenges).
        Returns once the server accepted; raises MQTTError with the server's
        DISCONNECT reason when it refused."""
        s = self.session
        self._authed = False
        s.reauthenticate(ticks_ms(), props)
        t = timeout if timeout is not None else self.connect_timeout
        self._pump_until(lambda: self._authed or not s._reauth, t * 1000, "re-authentication")
        if not self._authed:
            raise self.last_error or OSError("re-authentication failed")

    def disconnect(self, reason=0, props=None, linger_ms=1000):
        """Send DISCONNECT, then half-close and read until the broker closes
        (at most linger_ms): closing a socket with unread bytes in it makes
        the kernel reset the connection, and the broker then drops our last
        acknowledgements and the DISCONNECT itself."""
        try:
            if self.sock is not None:
                self.session.disconnect(ticks_ms(), reason, props)
                self._linger(linger_ms)
        except OSError:
            pass
        self.session.connection_lost()
        self.reconnect = False
        self._close()

    def _linger(self, linger_ms):
        sock = self.sock
        shut = getattr(sock, "shutdown", None)
        if shut is not None:
            try:
                shut(1)  # SHUT_WR: the broker reads our end of stream
            except OSError:
                return
        mv = self.session._rxmv  # the session is done with it: what arrives now is discarded
        end = ticks_ms() + linger_ms
        while ticks_diff(end, ticks_ms()) > 0 and self._readable(ticks_diff(end, ticks_ms())):
            if _read_into(sock, mv, len(mv)) == 0:
                return  # the broker closed: everything we sent was read

    def close(self):
        """Drop the connection without DISCONNECT (the broker sends the will)."""
        self.session.connection_lost()
        self.reconnect = False
        self._close()
