"""The asyncio client: the same Session as the blocking `tern.client.Client`,
driven by asyncio streams. One file for MicroPython's asyncio and CPython's.

Over 600 lines because its methods are the asyncio client's public API and the tasks that move
bytes between the streams and the session, on the same waiters: split, every asyncio board would
load a second module.

    c = Client("dev1", "broker.local")
    await c.connect()
    await c.subscribe("cmd/#", 1)
    await c.publish("tele/dev1", b"21.5", qos=1)
    async for m in c.messages():      # m.topic, m.payload, m.qos, m.retain ...
        ...
    await c.disconnect()

Transport: a TCP connection (TLS when asked), or with `stream=` any open
byte stream, as in the blocking client (a UART to a modem; see Client).

Tasks. `connect()` starts three: a reader (stream -> session), a writer
(session -> stream) and a supervisor (keepalive, and with reconnect=True the
reconnect loop with exponential backoff and jitter, as the blocking client).
The session's output goes through one write buffer that only the writer task
hands to the stream, so writes from the reader (acknowledgements), the
supervisor (PINGREQ) and the application (publish) never interleave
(MicroPython's StreamWriter must not be written while it drains).

Received messages reach the application two ways:
- a subscription with `handler=fn`: fn(msg) is called in the reader task with
  the session's preallocated Message, valid only during the call (copy what
  you keep). Handlers are plain functions; an exception a handler raises is
  reported (`on_error`, else printed), stored in `last_error`, and the message
  counts as handled (it is acknowledged: a message that always fails would
  otherwise come back forever).
- everything else: `messages()`, an async iterator of `Received` records
  (topic str, payload bytes, qos, retain, dup, properties, ack_id), copied as
  they arrive.

The messages() queue is bounded by `queue_size`. When it is full the reader
stops reading the socket until the application takes a message: the broker's
data waits in the kernel's buffers, TCP flow control slows the broker down,
and nothing is dropped. The queue can go past queue_size by the messages
contained in one read (at most `rx_size` bytes, a session option). A QoS 1/2
message is acknowledged when it enters the queue (or, with manual_ack=True,
when the application calls `ack(m.ack_id)`). A consumer that stalls for
longer than the keepalive interval also stops the client from reading
PINGRESP, so the connection is then declared dead and reconnected; the
broker sends the QoS 1/2 messages still unacknowledged again after that.

Allocation. This path allocates per operation (tasks, the records handed to
messages(), and on CPython the bytes that StreamReader.read returns); on
MicroPython it reads with StreamReader.readinto straight into the session's
receive buffer. The zero-allocation path is the blocking client.

TLS. `ssl` is True (CPython: the system's CAs; not on MicroPython, as in the
blocking client) or an ssl.SSLContext -- `tern.tls.context(ca=path)` makes
one that verifies on both runtimes (MicroPython's own starts at CERT_NONE and
reads DER only). It goes to open_connection with server_hostname; MicroPython
1.29's asyncio runs the handshake on the first read and write. A failed
verification is an OSError from connect(). tests/lib/test_tls.py checks both
clients on both runtimes against Mosquitto's TLS listener.

Reconnecting. Once connected, a lost connection is retried in the background
(reconnect=True) with exponential backoff and jitter until disconnect(),
close(), or a permanent refusal. A first attempt that fails raises, unless
connect(retry=True) (the default with a durable store): then connect()
returns None and the same loop dials on. Do not call connect() yourself while
that loop is running.
"""

import sys
import asyncio

from .client import ConnectError, GRACE_MS, MICROPYTHON, ticks_ms, ticks_diff, _Driver, _CLOSED, nodelay, \
    BACKOFF_MIN_MS, BACKOFF_MAX_MS
from .wire import MQTTError, const

# The session's states, events and publish()'s WOULD_BLOCK (tern.events), folded in as tern.client does.
_DISCONNECTED = const(0)
_CONNECTED = const(2)
_WOULD_BLOCK = const(-1)
_EV_CONNACK = const(1)
_EV_PUBLISHED = const(2)
_EV_SUBACK = const(3)
_EV_UNSUBACK = const(4)
_EV_DISCONNECT = const(5)
_EV_AUTH = const(7)

try:
    from collections import namedtuple
except ImportError:  # very small MicroPython builds
    from ucollections import namedtuple

# What messages() yields: an immutable copy of one received PUBLISH.
# properties: MQTT 5 properties as a dict, or None. ack_id: for ack() in
# manual acknowledgement mode.
Received = namedtuple("Received", ("topic", "payload", "qos", "retain", "dup", "properties", "ack_id"))

# The write buffer above which publish() waits for the writer to catch up.
_HIGH_WATER = 4096

_CancelledError = asyncio.CancelledError
_TimeoutError = asyncio.TimeoutError


async def _wait(ev, ms):
    """Wait for an Event at most ms milliseconds; True if it was set."""
    if ev.is_set():
        return True
    try:
        await _wait_for_ms(ev.wait(), ms)
        return True
    except _TimeoutError:
        return False


if MICROPYTHON:
    _wait_for_ms = asyncio.wait_for_ms

    def _open_connection(host, port, ssl=None, server_hostname=None):
        # asyncio.open_connection, but the socket is closed when the wait is
        # cancelled: MicroPython's leaks it, a socket for every attempt that
        # times out (a broker that does not answer), until none are left.
        import socket
        from errno import EINPROGRESS
        from asyncio import core  # pyright: ignore[reportAttributeAccessIssue]  (on boards; not in the stubs)

        ai = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)[0]
        s = socket.socket(ai[0], ai[1], ai[2])
        try:
            s.setblocking(False)
            try:
                s.connect(ai[-1])
            except OSError as e:
                if e.errno != EINPROGRESS:
                    raise
            nodelay(s)  # CPython's asyncio sets it on every TCP transport
            if ssl:
                s = ssl.wrap_socket(s, server_hostname=server_hostname, do_handshake_on_connect=False)
                s.setblocking(False)
            yield core._io_queue.queue_write(s)
        except BaseException:
            s.close()
            raise
        return _pair(s)

    def _pair(st):
        # A pollable stream (a socket, a machine.UART: readinto/write and ioctl) as asyncio's
        # reader and writer: MicroPython's Stream is both.
        s = asyncio.StreamReader(st)
        return s, s

    def _close_stream(w):
        # MicroPython's Stream.close() may leave the socket open (wait_closed
        # closes it); socket close is idempotent.
        try:
            w.close()
            w.s.close()
        except Exception:
            pass

    def _report(e):
        sys.print_exception(e)

else:
    _open_connection = asyncio.open_connection

    def _pair(st):
        # What stream= may be on CPython: an asyncio (reader, writer) pair, as it is; or a file-like
        # stream as the blocking client takes it (tern.filestream: a host-only module).
        if isinstance(st, tuple):
            return st
        from .filestream import FileStream

        f = FileStream(st)
        return f, f

    def _wait_for_ms(aw, ms):
        return asyncio.wait_for(aw, ms / 1000)

    def _close_stream(w):
        try:
            w.close()
        except Exception:
            pass

    def _report(e):
        import traceback

        traceback.print_exception(type(e), e, e.__traceback__)


class _Messages:
    # The async iterator messages() returns.
    def __init__(self, client):
        self.c = client

    def __aiter__(self):
        return self

    async def __anext__(self):
        c = self.c
        while not c._q:
            if c._closed:
                if c._fatal is not None:
                    e = c._fatal
                    c._fatal = None
                    raise e
                raise StopAsyncIteration
            c._qev.clear()
            await c._qev.wait()
        r = c._q.pop(0)
        c._qspace.set()
        return r


class Client(_Driver):
    """An MQTT client on asyncio, for MicroPython and CPython.

    Arguments as tern.client.Client, plus queue_size: how many received
    messages messages() holds before the reader stops reading (backpressure,
    see the module docstring). Further keyword arguments go to the Session
    (window, rx_size, will_topic, username, manual_ack, session_expiry ...).

    stream: as the blocking client's, an open byte stream used instead of a
    TCP connection (a UART to a cellular or LoRa modem in transparent mode);
    each connect() and reconnect sends CONNECT over it, and the client never
    closes it. MicroPython: an object asyncio can poll (readinto/write and
    ioctl: a machine.UART, a socket). CPython: an asyncio (reader, writer)
    pair (asyncio.open_connection, open_unix_connection, pyserial-asyncio's
    open_serial_connection ...), or a file-like stream as the blocking client
    takes it (non-blocking readinto/write and fileno: a pyserial Serial with
    timeout=0, a pty, a socket's makefile), waited on with the event loop's
    add_reader/add_writer (the default loop on Unix).
    """

    def __init__(self, client_id="", server="127.0.0.1", port=None, version=4, keepalive=60,
                 clean=True, store=None, ssl=None, server_hostname=None, reconnect=True,
                 backoff_min=BACKOFF_MIN_MS / 1000, backoff_max=BACKOFF_MAX_MS / 1000, connect_timeout=10,
                 healthy_after=10, queue_size=16, stream=None, **session_opts):
        if queue_size < 1:
            raise ValueError("queue_size must be at least 1")
        _Driver.__init__(self, client_id, server, port, version, keepalive, clean, store, ssl, server_hostname,
                         reconnect, backoff_min, backoff_max, connect_timeout, healthy_after, session_opts)
        self.queue_size = queue_size
        self.stream = stream
        self.session.on_message = self._enqueue
        self.on_error = None  # on_error(exception) for an exception a handler raised
        self._r = self._w = None
        self._gen = 0  # connection generation: tasks of an older one do nothing
        self._tasks = []  # reader and writer of the current connection
        self._sup = None  # the supervisor task
        self._obuf = bytearray()
        self._obuf2 = bytearray()
        self._wev = asyncio.Event()  # the write buffer has data
        self._drained = asyncio.Event()  # the writer handed everything to the stream
        self._cev = asyncio.Event()  # CONNACK arrived or the connection failed
        self._wake = asyncio.Event()  # the supervisor should look again
        self._progress = asyncio.Event()  # an acknowledgement or a connect: the outbox moved
        self._connack = None
        self._closing = False
        self._waiters = {}  # pid -> Event, for publish(wait_ack) and (un)subscribe
        self._authed = False  # the server accepted a re-authentication
        self._results = {}  # pid -> reason code(s)
        self._q = []
        self._qev = asyncio.Event()  # the queue has a message (or the client closed)
        self._qspace = asyncio.Event()  # the queue has room
        self._closed = False
        self._fatal = None

    @property
    def connected(self):
        return self._up is not None and self.session.state == _CONNECTED

    async def __aenter__(self):
        await self.connect()
        return self

    async def __aexit__(self, *exc):
        await self.disconnect()

    # ------------------------------------------------------------- transport

    def _send(self, buf, off, n):
        # The session's output: into the write buffer, for the writer task.
        if self._w is None:
            raise OSError("not connected")
        if off == 0 and n == len(buf):
            self._obuf.extend(buf)
        else:
            self._obuf.extend(memoryview(buf)[off : off + n])
        self._drained.clear()
        self._wev.set()

    async def _writer_task(self, w, gen):
        try:
            while gen == self._gen:
                if not self._obuf:
                    self._drained.set()
                    self._wev.clear()
                    await self._wev.wait()
                    continue
                buf = self._obuf
                self._obuf = self._obuf2
                self._obuf2 = buf
                # MicroPython's write() sends what the socket takes and copies
                # the rest; CPython's transport may keep what it is given.
                w.write(buf if MICROPYTHON else bytes(buf))
                buf[:] = b""
                await w.drain()
        except _CancelledError:
            raise
        except Exception as e:
            if gen == self._gen:
                self._lost(e)

    async def _reader_task(self, r, gen):
        s = self.session
        try:
            while gen == self._gen:
                while len(self._q) >= self.queue_size:
                    # Backpressure: leave the data in the socket.
                    self._qspace.clear()
                    await self._qspace.wait()
                    if gen != self._gen:
                        return
                room = len(s.rx) - s.rx_len  # what the driver may write at rx[rx_len:]
                if MICROPYTHON:
                    rl = s.rx_len
                    n = await r.readinto(s.rxmv[rl:] if rl else s.rxmv)
                    if n is None:
                        continue  # woken without data (TLS record not complete)
                    if gen != self._gen:
                        return
                    if n == 0:
                        raise OSError(_CLOSED)
                    s.feed_n(n, ticks_ms())
                else:
                    data = await r.read(room)
                    if gen != self._gen:
                        return
                    if not data:
                        raise OSError(_CLOSED)
                    s.feed(data, ticks_ms())
        except _CancelledError:
            raise
        except Exception as e:  # OSError, MQTTError (the session disconnected the broker)
            if gen == self._gen:
                self._lost(e)

    def _teardown(self):
        """Close the current connection's stream and stop its tasks."""
        self._gen += 1
        try:
            cur = asyncio.current_task()
        except Exception:
            cur = None
        for t in self._tasks:
            if t is not cur:
                t.cancel()
        self._tasks = []
        w = self._w
        self._w = self._r = None
        if w is not None:
            if self._obuf:
                # What the session queued last goes out before the close: the
                # DISCONNECT telling a broker which rule it broke (MQTT 5).
                try:
                    w.write(bytes(self._obuf))
                except Exception:
                    pass
            if self.stream is None:  # the application's stream stays open
                _close_stream(w)
        # Bytes for a dead connection never go out on the next one (nor what
        # a failed write left in the writer's buffer): the session resends
        # from its store after CONNACK.
        self._obuf[:] = self._obuf2[:] = b""
        self._drained.set()

    def _lost(self, err):
        was_up = self._mark(None)
        self.session.connection_lost()
        self._teardown()
        self.last_error = err
        self._cev.set()
        self._wake.set()
        self._progress.set()
        if was_up and self.on_disconnect:
            self._call(self.on_disconnect, err)

    async def _open(self, t_ms):
        # The connection's (reader, writer): the application's stream, or a dialled socket.
        if self.stream is not None:
            return _pair(self.stream)
        return await self._dial(t_ms)

    async def _dial(self, t_ms):
        kw = {}
        if self.ssl:
            from .tls import given

            kw["ssl"] = given(self.ssl)
            kw["server_hostname"] = self.server_hostname
        coro = _open_connection(self.server, self.port, **kw)
        try:
            if MICROPYTHON:
                return await asyncio.wait_for_ms(coro, t_ms)
            return await asyncio.wait_for(coro, t_ms / 1000)
        except _TimeoutError:
            raise OSError("could not reach %s:%d within %d ms" % (self.server, self.port, t_ms))

    async def _connect_once(self, timeout):
        s = self.session
        if self._w is not None or s.state != _DISCONNECTED:
            self._up = None
            s.connection_lost()
            self._teardown()
        t_ms = self._ms(timeout)
        start = ticks_ms()
        r, w = await self._open(t_ms)
        self._teardown()
        gen = self._gen
        err = self.last_error
        self._r = r
        self._w = w
        self._connack = None
        self._cev.clear()
        self._tasks = [asyncio.create_task(self._reader_task(r, gen)),
                       asyncio.create_task(self._writer_task(w, gen))]
        try:
            s.connect_packet(ticks_ms())
            left = t_ms - ticks_diff(ticks_ms(), start)
            while self._connack is None and gen == self._gen:
                if left <= 0 or not await _wait(self._cev, left):
                    if self._fallback(-1):  # no answer to MQTT 5 (amqtt): 3.1.1 with version=(5, 4)
                        s.connection_lost()
                        self._teardown()
                        return await self._connect_once(timeout)
                    raise OSError("no CONNACK from %s:%d within %d ms" % (self.server, self.port, t_ms))
                self._cev.clear()
                left = t_ms - ticks_diff(ticks_ms(), start)
            if self._connack is None:
                e = self.last_error
                if e is not err and isinstance(e, MQTTError):
                    raise e  # the broker broke the protocol: as the blocking client, not an OSError
                if e is not err and self._fallback(e):
                    s.connection_lost()
                    self._teardown()
                    return await self._connect_once(timeout)
                raise OSError("connection to %s:%d lost before CONNACK: %s" % (self.server, self.port, str(e).strip()))
        except BaseException:
            if gen == self._gen:
                s.connection_lost()
                self._teardown()
            raise
        r = self._connack.reason
        if r:
            if gen == self._gen:
                s.connection_lost()
                self._teardown()
            self._fallback(r)  # raises ConnectError unless the next version is to be tried
            return await self._connect_once(timeout)
        # Accepted. A loss right after the CONNACK does not make connect()
        # fail (as in the blocking client): the supervisor reconnects.
        return s.session_present

    # --------------------------------------------------------------- session

    def _call(self, fn, *args):
        try:
            fn(*args)
        except Exception as e:
            self._handler_error(e)

    def _handler_error(self, e):
        self.last_error = e
        if self.on_error:
            try:
                self.on_error(e)
                return
            except Exception as e2:
                e = e2
        _report(e)

    def _guard(self, handler):
        def run(msg):
            try:
                handler(msg)
            except Exception as e:
                self._handler_error(e)

        return run

    def _enqueue(self, m):
        # The default handler: copy the reused Message into a record.
        self._q.append(Received(m.topic, bytes(m.payload), m.qos, bool(m.retain), bool(m.dup),
                                m.properties, m.ack_id))
        self._qev.set()

    def _wake_waiter(self, pid, result):
        ev = self._waiters.pop(pid, None)
        if ev is not None:
            self._results[pid] = result
            ev.set()

    def _on_event(self, kind, a, b):
        if kind == _EV_CONNACK:
            self._mark(b)
            self._cev.set()
            self._progress.set()
            if self.on_connect:
                self._call(self.on_connect, a, b.reason)
        elif kind == _EV_PUBLISHED:
            self._wake_waiter(a, b)
            self._progress.set()
            if self.on_published:
                self._call(self.on_published, a, b)
        elif kind == _EV_SUBACK or kind == _EV_UNSUBACK:
            self._wake_waiter(a, b)
            self._progress.set()
        elif kind == _EV_AUTH:
            self._authed = True
            self._progress.set()
        elif kind == _EV_DISCONNECT:
            from .v5 import server_disconnect

            self._lost(server_disconnect(a, b))

    # ------------------------------------------------------------ supervisor

    async def _nap(self, ms):
        await _wait(self._wake, ms if ms > 0 else 1)  # whole ms (MicroPython's wait_for_ms takes no float)
        self._wake.clear()

    async def _supervise(self):
        s = self.session
        fatal = None
        try:
            while not self._closing:
                if self._up is not None and s.state == _CONNECTED:
                    try:
                        nxt = s.poll(ticks_ms())
                    except OSError as e:
                        self._lost(e)
                        continue
                    await self._nap(nxt)
                    continue
                if not self.reconnect:
                    fatal = self.last_error or OSError("connection lost")
                    break
                d = self._backoff_ms(self.last_error)
                if d is None:  # a permanent refusal
                    fatal = self.last_error
                    break
                until = ticks_add(ticks_ms(), d)
                while not self._closing:
                    left = ticks_diff(until, ticks_ms())
                    if left <= 0:
                        break
                    await self._nap(left)
                if self._closing:
                    break
                try:
                    await self._connect_once(None)
                except (OSError, MQTTError) as e:  # a ConnectError too: see _backoff_ms above
                    self.last_error = e
                except Exception as e:  # e.g. a bad ssl argument: retrying cannot help
                    self.last_error = fatal = e
                    self.reconnect = False
                    break
        finally:
            # Not after _stop(): a connect() that followed it may already run
            # (and own messages()) by the time the cancellation lands here.
            if self._sup is asyncio.current_task():
                self._sup = None
                if not self._closing:
                    # Nothing will reconnect: messages() ends with the reason.
                    self._fatal = fatal
                    self._closed = True
                    self._qev.set()
                    self._progress.set()

    # ------------------------------------------------------------------- API

    async def connect(self, timeout=None, retry=None):
        """Open the connection and wait for CONNACK; returns session present.
        Raises ConnectError on a refusal, MQTTError when the broker breaks
        the protocol (0x82: a packet before CONNACK, session present after a
        clean start), OSError when unreachable (no background retry is
        started then). Once connected, a lost connection is reconnected in
        the background when reconnect=True.
        retry (default: True for a durable store): when the first attempt
        fails as a reconnect would be retried (unreachable, no CONNACK, not
        a permanent refusal), return None and dial on in the background with
        the reconnect policy; last_error says why, publish() stores QoS 1/2
        messages meanwhile."""
        self._closing = False
        self._closed = False
        self._fatal = None
        try:
            sp = await self._connect_once(timeout)
        except (OSError, MQTTError) as e:
            if not self._retry(retry) or isinstance(e, ConnectError) and e.permanent:
                raise
            self.last_error = e
            sp = None
        if self._sup is None:
            self._sup = asyncio.create_task(self._supervise())
        else:
            self._wake.set()
        return sp

    async def _await_progress(self, ms):
        await _wait(self._progress, ms if ms < 100 else 100)

    def publish(self, topic, payload, *extra, qos=0, retain=False, props=None, wait_ack=False, timeout=None):
        """Send a message. Returns its packet id (0 for QoS 0) once the
        message is in the store (QoS 1/2: sent now, or after the next
        (re)connect when offline; QoS 0 offline raises NotConnected).
        wait_ack=True: return once the broker acknowledged it (PUBACK, or
        PUBCOMP for QoS 2); a refusal (reason >= 0x80) raises MQTTError.
        timeout (default connect_timeout) bounds the wait for room in the
        outbox and for the acknowledgement; on an acknowledgement timeout
        OSError is raised and the message stays pending. Cancelled after the
        message is stored (asyncio.wait_for), it returns the id: accepted,
        its acknowledgement not awaited (README, "Cancelling publish()").
        qos and retain are keywords: umqtt's publish(t, m, True) is refused
        at the call with a TypeError that says so."""
        if extra:
            from .refused import positional

            positional(extra)
        return self._publish(topic, payload, qos, retain, props, wait_ack, timeout)

    async def _publish(self, topic, payload, qos, retain, props, wait_ack, timeout):
        if isinstance(payload, str):
            payload = payload.encode()
        s = self.session
        t_ms = self._ms(timeout)
        start = ticks_ms()
        while True:
            self._progress.clear()
            pid = s.publish(topic, payload, qos, retain, ticks_ms(), props)
            if pid != _WOULD_BLOCK:
                break
            self._full(qos, start, t_ms, self._closing or not self.reconnect)
            await self._await_progress(t_ms - ticks_diff(ticks_ms(), start))
        ev = None
        if pid and wait_ack:
            ev = asyncio.Event()
            self._waiters[pid] = ev  # before any await: the ack cannot have come yet
        try:
            # Let the writer catch up when the stream is slow.
            while len(self._obuf) > _HIGH_WATER and self._w is not None:
                left = t_ms - ticks_diff(ticks_ms(), start)
                if left <= 0 or not await _wait(self._drained, left):
                    break
            if ev is not None:
                await _wait(ev, t_ms - ticks_diff(ticks_ms(), start))
        except _CancelledError:
            # Cancelled once the message is stored (asyncio.wait_for on a slow
            # link): it is accepted and will be sent, so publish() returns its
            # id as it does without wait_ack; raising would read as "not
            # accepted" and a caller that publishes again sends it twice.
            return pid
        finally:
            if ev is not None:
                reason = self._done(pid)
        if ev is not None:
            if reason is None:
                raise OSError("no acknowledgement of message %d within %d ms" % (pid, t_ms))
            if reason >= 0x80:
                raise MQTTError(reason, "the broker refused message %d: reason 0x%02X" % (pid, reason))
        return pid

    def _done(self, pid):
        # The end of a wait for pid's reply, however it ended (a timeout, a
        # cancellation by wait_for): the waiter goes, and the reply (None if
        # none came) is taken. A cancelled wait used to leave both for good.
        self._waiters.pop(pid, None)
        return self._results.pop(pid, None)

    async def _until(self, cond, timeout, what):
        # Wait for cond() (checked after each piece of progress); OSError
        # naming what did not happen in time.
        t_ms = self._ms(timeout)
        start = ticks_ms()
        while not cond():
            left = t_ms - ticks_diff(ticks_ms(), start)
            if left <= 0:
                raise OSError("%s within %d ms" % (what(), t_ms))
            self._progress.clear()
            if not cond():
                await self._await_progress(left)

    async def wait_published(self, pid, timeout=None):
        """Wait until the message with this packet id is acknowledged."""
        s = self.session
        await self._until(lambda: not s.is_pending(pid), timeout,
                          lambda: "no acknowledgement of message %d" % pid)

    async def wait_all(self, timeout=None):
        """Wait until everything published is acknowledged."""
        s = self.session
        await self._until(lambda: not s.pending(), timeout,
                          lambda: "%d messages still unacknowledged" % len(s.pending()))

    async def reauthenticate(self, props=None, timeout=None):
        """Re-authenticate on the open connection (MQTT 5 enhanced
        authentication; the auth hook answers the server's challenges).
        Returns once the server accepted; raises MQTTError with the server's
        DISCONNECT reason when it refused."""
        s = self.session
        self._authed = False
        s.reauthenticate(ticks_ms(), props)
        await self._until(lambda: self._authed or not s.reauthing, timeout,
                          lambda: "no answer to re-authentication")
        if not self._authed:
            raise self.last_error or OSError("re-authentication failed")

    async def _reply(self, pid, timeout):
        if not pid:
            return None
        ev = asyncio.Event()
        self._waiters[pid] = ev
        t_ms = self._ms(timeout)
        try:
            await _wait(ev, t_ms)
        finally:
            r = self._done(pid)
        if r is None:
            raise OSError("no SUBACK/UNSUBACK for packet %d within %d ms" % (pid, t_ms))
        return r

    async def subscribe(self, topic_filter, qos=0, handler=None, timeout=None, **opts):
        """Subscribe and wait for SUBACK; returns its reason codes (granted QoS
        or a failure >= 0x80). Offline, or with the outbox full: registers
        it, it is sent on connect (or once an acknowledgement makes room), and
        None is returned. handler(msg) gets this subscription's messages
        in the reader task (the Message is reused: copy what you keep);
        without a handler they go to messages()."""
        h = self._guard(handler) if handler is not None else None
        pid = self.session.subscribe(topic_filter, qos, ticks_ms(), h, **opts)
        return await self._reply(pid, timeout)

    async def unsubscribe(self, topic_filter, timeout=None, **opts):
        pid = self.session.unsubscribe(topic_filter, ticks_ms(), **opts)
        return await self._reply(pid, timeout)

    def ack(self, ack_id):
        """Manual acknowledgement mode: acknowledge a message (its ack_id)."""
        self.session.ack(ack_id, ticks_ms())

    async def reply(self, msg, payload, qos=0, props=None, wait_ack=False, timeout=None):
        """Answer a request (MQTT 5): publish to msg's Response Topic with its
        Correlation Data (msg: a Message or a Received record)."""
        from .v5 import reply_args

        topic, props = reply_args(msg, props)
        return await self.publish(topic, payload, qos=qos, props=props, wait_ack=wait_ack, timeout=timeout)

    def messages(self):
        """An async iterator of received messages (`Received` records) that no
        handler took. It ends after disconnect(); when the connection is gone
        for good (reconnect=False, or a permanent refusal) it raises the
        reason once the queue is empty."""
        return _Messages(self)

    def _stop(self):
        self._closing = True  # until connect(): reconnect keeps its setting for then
        sup = self._sup
        self._sup = None
        try:
            cur = asyncio.current_task()
        except Exception:
            cur = None
        if sup is not None and sup is not cur:
            sup.cancel()

    def _finish(self):
        self._up = None
        self.session.connection_lost()
        self._teardown()
        self._closed = True
        self._qev.set()
        self._qspace.set()
        self._progress.set()

    async def disconnect(self, reason=0, props=None, linger_ms=1000):
        """Send DISCONNECT (the broker discards the will), let the broker
        close first, and stop reconnecting. Messages still pending stay in
        the store. As the blocking client: what still arrives is read and
        dropped until the far end hangs up, at most linger_ms, and over TCP
        our end of stream goes only after client.GRACE_MS (CPython's
        write_eof; MicroPython's streams have none: it only waits). Over a
        stream= (which stays open) what the broker sent before it read the
        DISCONNECT must not reach the next connection over that stream."""
        self._stop()
        s = self.session
        w = self._w
        if w is not None and s.state == _CONNECTED:
            # Stop reading, queue DISCONNECT behind what is buffered, and let
            # the writer task hand it all to the stream (cancelling a drain
            # half way could repeat bytes on MicroPython).
            rt = self._tasks[0] if self._tasks else None
            if rt is not None:
                rt.cancel()
            try:
                s.disconnect(ticks_ms(), reason, props)
                t_ms = self._ms(None)
                start = ticks_ms()
                while self._w is w and (self._obuf or not self._drained.is_set()):
                    left = t_ms - ticks_diff(ticks_ms(), start)
                    if left <= 0 or not await _wait(self._drained, left):
                        break
                if self._w is w:
                    if rt is not None:
                        try:
                            await rt  # its read ends before ours starts (CPython's reader takes one)
                        except _CancelledError:
                            pass
                    eof = None  # half-closes after GRACE_MS: TCP on CPython, not TLS (no write_eof there)
                    if self.stream is None and not MICROPYTHON and w.can_write_eof():
                        eof = w.write_eof
                    await self._linger(self._r, int(linger_ms), eof)
            except OSError:
                pass
        self._finish()
        if w is not None and not MICROPYTHON and self.stream is None:
            try:
                await asyncio.wait_for(w.wait_closed(), 1)
            except Exception:
                pass

    async def _linger(self, r, ms, eof=None):
        # Read and drop until end of stream, at most ms; eof() after GRACE_MS.
        mv = self.session.rxmv  # the session is done with it
        t0 = ticks_ms()
        while True:
            gone = ticks_diff(ticks_ms(), t0)
            if eof is not None and gone >= GRACE_MS:
                eof()
                eof = None
            left = min(GRACE_MS if eof is not None else ms, ms) - gone
            if left <= 0:
                return
            try:
                n = await _wait_for_ms(r.readinto(mv) if MICROPYTHON else r.read(len(mv)), left)
            except _TimeoutError:
                continue
            if n is not None and not n:
                return  # end of stream (0, b""): the far end hung up

    def close(self):
        """Drop the connection without DISCONNECT (the broker publishes the
        will) and stop reconnecting; what the store holds uncommitted is committed."""
        self._stop()
        self._finish()
        self.session.store.commit()


if MICROPYTHON:
    from time import ticks_add
else:

    def ticks_add(a, b):
        return a + b
