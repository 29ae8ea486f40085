"""tern.aio.Client against a real Mosquitto, under CPython's asyncio and
MicroPython's (each test runs on both runtimes; see conftest.py)."""

import asyncio
import sys
import time

from check import MICROPYTHON
from tern.aio import Client
from tern.client import ConnectError
from tern.session import NotConnected
from tern.wire import MQTTError
from tern import props as P
from tern.codec import Packet, encode
from tern.wire import CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, SUBACK, PINGREQ, DISCONNECT

T = 5  # seconds: the bound on every wait in this file


def run(coro):
    asyncio.run(coro)


async def take(it, n, t=T):
    """The next n records of a messages() iterator, each within t seconds."""
    out = []
    for _ in range(n):
        out.append(await asyncio.wait_for(it.__anext__(), t))
    return out


async def until(cond, what, t=T):
    """Poll cond() every 10 ms until it is true; fail after t seconds."""
    for _ in range(int(t * 100)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out waiting for " + what)


async def listen(serve, seed):
    """A server on a free loopback port; returns (server, port).
    MicroPython's server object cannot say which port it got: try some."""
    for k in range(64):
        p = 20000 + (seed * 31 + k * 7919) % 40000
        try:
            return await asyncio.start_server(serve, "127.0.0.1", p), p
        except OSError:
            continue
    raise OSError("no free port")


def _close(w):
    w.close()
    s = getattr(w, "s", None)  # MicroPython's Stream.close may not close the socket
    if s is not None:
        s.close()


async def _relay(r, w):
    """Copy r to w until r ends or either fails."""
    try:
        while True:
            d = await r.read(1024)
            if not d:
                break
            w.write(d)
            await w.drain()
    except Exception:
        pass


class Proxy:
    """A TCP relay between the client and the broker that can cut every
    connection it carries (the client sees the broker close the socket)."""

    def __init__(self, host, port):
        self.up = (host, port)
        self.accepted = 0
        self.links = []  # (client writer, broker writer, tasks)

    async def start(self, seed):
        self.server, self.port = await listen(self._serve, seed)
        return self

    async def _serve(self, cr, cw):
        self.accepted += 1
        ur, uw = await asyncio.open_connection(*self.up)
        link = (cw, uw, [])
        self.links.append(link)
        link[2].append(asyncio.create_task(_relay(cr, uw)))
        link[2].append(asyncio.create_task(_relay(ur, cw)))

    def stall(self):
        """Stop relaying but keep the sockets open: a silent, dead link."""
        for cw, uw, tasks in self.links:
            for t in tasks:
                t.cancel()
            del tasks[:]

    def drop(self):
        self.stall()
        for cw, uw, tasks in self.links:
            for w in (cw, uw):
                _close(w)
        self.links = []

    def stop(self):
        self.drop()
        self.server.close()


def _frame_len(b):
    """The length of the whole MQTT packet at the start of b, or None while incomplete."""
    n = shift = 0
    for i in range(1, min(len(b), 5)):
        n |= (b[i] & 127) << shift
        shift += 7
        if b[i] < 128:
            return i + 1 + n if len(b) >= i + 1 + n else None
    return None


class Modem:
    """A modem in transparent mode for the stream tests: the client's stream is a connection to it
    (the line, opened once); following the MQTT framing of what comes down the line, it dials the
    broker for each CONNECT and relays both ways; when the broker hangs up it keeps the line open and
    drops what the client sends until its next CONNECT (as the qemu board's link bridge does)."""

    def __init__(self, host, port):
        self.up = (host, port)
        self.lines = 0  # connections made to the modem: one per stream
        self.dials = 0  # connections the modem made to the broker
        self.line_open = False  # the client's end of the line has not closed it
        self.bw = None  # the writer to the broker while a call is up

    async def start(self, seed):
        self.server, self.port = await listen(self._serve, seed)
        return self

    async def _serve(self, lr, lw):
        self.lines += 1
        self.line_open = True
        buf = b""
        try:
            while True:
                d = await lr.read(1024)
                if not d:
                    break
                buf += d
                n = _frame_len(buf)
                while n:
                    pkt, buf = buf[:n], buf[n:]
                    if self.bw is None and pkt[0] >> 4 == CONNECT:
                        br, self.bw = await asyncio.open_connection(*self.up)
                        self.dials += 1
                        asyncio.create_task(self._down(br, lw, self.bw))
                    if self.bw is not None:
                        self.bw.write(pkt)
                        await self.bw.drain()
                    n = _frame_len(buf)
        except Exception:
            pass
        self.line_open = False
        self.hang_up()
        _close(lw)

    async def _down(self, br, lw, bw):
        await _relay(br, lw)
        if self.bw is bw:
            self.hang_up()

    def hang_up(self):
        bw = self.bw
        self.bw = None
        if bw is not None:
            _close(bw)

    def stop(self):
        self.hang_up()
        self.server.close()


async def _line(port, kind):
    """(close, stream): an open stream to the modem. "socket": a non-blocking socket (MicroPython's
    asyncio polls it as it polls a machine.UART); "pair": asyncio's (reader, writer); "file": a
    file-like stream (a socket's makefile: non-blocking readinto/write, fileno), as the blocking
    client takes it."""
    if kind == "pair":
        r, w = await asyncio.open_connection("127.0.0.1", port)
        return w.close, (r, w)
    import socket

    s = socket.socket()
    s.connect(socket.getaddrinfo("127.0.0.1", port)[0][-1])
    s.setblocking(False)
    if kind == "socket":
        return s.close, s
    f = s.makefile("rwb", buffering=0)

    def close():
        f.close()  # the socket closes with the last file made from it
        s.close()

    return close, f


# --------------------------------------------------------------------------


def test_pubsub_qos_0_1_2_versions_3_4_5(broker_addr):
    host, port = broker_addr

    async def main():
        for v in (3, 4, 5):
            sub = Client("sub%d" % v, host, port, version=v)
            pub = Client("pub%d" % v, host, port, version=v)
            assert await sub.connect() is False
            await pub.connect()
            assert sub.connected and pub.connected
            assert await sub.subscribe("t%d/#" % v, 2) == [2]
            it = sub.messages()
            props = {P.CONTENT_TYPE: "text/plain"} if v == 5 else None
            for q in (0, 1, 2):
                pid = await pub.publish("t%d/q%d" % (v, q), ("p%d" % q).encode(), qos=q, props=props)
                assert (pid > 0) == (q > 0)
            got = await take(it, 3)
            got.sort(key=lambda m: m.qos)
            for q in (0, 1, 2):
                m = got[q]
                assert m.topic == "t%d/q%d" % (v, q), m
                assert m.payload == ("p%d" % q).encode() and isinstance(m.payload, bytes), m
                assert m.qos == q and m.retain is False and m.dup is False, m
                if v == 5:
                    assert m.properties[P.CONTENT_TYPE] == "text/plain", m
                else:
                    assert m.properties is None
            # The records are copies: immutable and independent of the receive buffer.
            try:
                got[0].payload = b"x"
                raise AssertionError("a Received record could be changed")
            except AttributeError:
                pass
            # A retained message reaches a later subscriber flagged retained.
            await pub.publish("t%d/r" % v, "kept", qos=1, retain=True, wait_ack=True)
            late = Client("late%d" % v, host, port, version=v)
            await late.connect()
            assert await late.subscribe("t%d/r" % v, 1) == [1]
            (r,) = await take(late.messages(), 1)
            assert r.topic == "t%d/r" % v and r.payload == b"kept" and r.retain is True and r.qos == 1, r
            (live,) = await take(it, 1)  # the existing subscriber got it live
            assert live.payload == b"kept"
            for c in (sub, pub, late):
                await c.disconnect()
            assert not sub.connected
            # After disconnect() the iterator ends.
            try:
                await asyncio.wait_for(it.__anext__(), T)
                raise AssertionError("messages() went on after disconnect")
            except StopAsyncIteration:
                pass

    run(main())


def test_handler_subscription(broker_addr):
    host, port = broker_addr

    async def main():
        for v in (4, 5):
            seen = []
            errors = []

            def handler(m):
                # The Message is reused: copy while the call lasts.
                p = bytes(m.payload)
                if p == b"boom":
                    raise ValueError("handler failed")
                seen.append((m.topic, p, m.qos))

            c = Client("h%d" % v, host, port, version=v)
            c.on_error = errors.append
            pub = Client("hp%d" % v, host, port, version=v)
            await c.connect()
            await pub.connect()
            assert await c.subscribe("h/a", 1, handler=handler) == [1]
            assert await c.subscribe("other/#", 1) == [1]
            await pub.publish("h/a", b"boom", qos=1)
            await pub.publish("h/a", b"one", qos=1)
            await pub.publish("other/x", b"two", qos=1)
            await pub.publish("h/a", b"three", qos=2)
            (m,) = await take(c.messages(), 1)
            assert m.topic == "other/x" and m.payload == b"two", m
            await until(lambda: len(seen) == 2, "the handler")
            assert seen == [("h/a", b"one", 1), ("h/a", b"three", 1)], seen  # granted QoS 1
            # The handler's exception was reported, the connection lived on.
            assert len(errors) == 1 and isinstance(errors[0], ValueError), errors
            assert c.connected
            # After unsubscribe the handler gets nothing more.
            assert await c.unsubscribe("h/a") is not None
            await pub.publish("h/a", b"gone", qos=1)
            await pub.publish("other/y", b"marker", qos=1)
            (m,) = await take(c.messages(), 1)
            assert m.payload == b"marker" and len(seen) == 2, (m, seen)
            await c.disconnect()
            await pub.disconnect()

    run(main())


def test_publish_wait_ack_returns_after_the_ack(broker_addr):
    host, port = broker_addr

    async def main():
        acked = []
        c = Client("wa", host, port, version=5)
        c.on_published = lambda pid, reason: acked.append(pid)
        await c.connect()
        # Without wait_ack: stored, not yet acknowledged when publish returns.
        p0 = await c.publish("w/0", b"a", qos=1)
        assert c.session.is_pending(p0) and p0 not in acked
        for q in (1, 2):
            pid = await c.publish("w/%d" % q, b"b", qos=q, wait_ack=True)
            assert pid > 0 and not c.session.is_pending(pid), (q, pid)
            assert pid in acked, (pid, acked)
        assert p0 in acked and not c.session.pending()
        # QoS 0 has nothing to wait for.
        assert await c.publish("w/x", b"c", qos=0, wait_ack=True) == 0
        await c.disconnect()

    run(main())


def test_200_qos1_messages_arrive_in_order(broker_addr):
    host, port = broker_addr
    N = 200

    async def main():
        sub = Client("ord-sub", host, port)  # queue_size 16: the reader pauses often
        pub = Client("ord-pub", host, port)
        await sub.connect()
        await pub.connect()
        assert await sub.subscribe("seq", 1) == [1]
        it = sub.messages()
        got = []

        async def consume():
            for m in await take(it, N, T):
                got.append(m)

        task = asyncio.create_task(consume())
        for i in range(N):
            await pub.publish("seq", str(i).encode(), qos=1)
        await pub.wait_all(T)
        await asyncio.wait_for(task, T)
        assert [int(m.payload) for m in got] == list(range(N))
        assert all(m.qos == 1 for m in got)
        await sub.disconnect()
        await pub.disconnect()

    run(main())


def test_full_queue_stops_the_reader_and_drops_nothing(broker_addr):
    host, port = broker_addr
    N = 100
    RX = 256

    async def main():
        sub = Client("bp-sub", host, port, queue_size=2, rx_size=RX)
        pub = Client("bp-pub", host, port)
        await sub.connect()
        await pub.connect()
        assert await sub.subscribe("bp", 0) == [0]
        for i in range(N):
            await pub.publish("bp", ("m%03d" % i).encode(), qos=0)
        await pub.publish("bp/done", b"", qos=1, wait_ack=True)  # the broker has them all
        await asyncio.sleep(0.3)
        # Each PUBLISH is 10 bytes: one read holds at most RX // 10 of them.
        assert 2 <= len(sub._q) <= 2 + RX // 10, len(sub._q)
        got = await take(sub.messages(), N)
        assert [m.payload for m in got] == [("m%03d" % i).encode() for i in range(N)]
        await sub.disconnect()
        await pub.disconnect()

    run(main())


def test_offline_publish_is_sent_after_connect(broker_addr):
    host, port = broker_addr

    async def main():
        peer = Client("peer", host, port)
        await peer.connect()
        assert await peer.subscribe("o/#", 2) == [2]
        c = Client("offline", host, port)
        try:
            await c.publish("o/zero", b"x", qos=0)
            raise AssertionError("QoS 0 was accepted offline")
        except NotConnected:
            pass
        p1 = await c.publish("o/1", b"early-1", qos=1)
        p2 = await c.publish("o/2", b"early-2", qos=2)
        assert c.session.pending() == [p1, p2]
        await c.connect()
        got = await take(peer.messages(), 2)
        assert [(m.topic, m.payload, m.qos) for m in got] == [("o/1", b"early-1", 1), ("o/2", b"early-2", 2)], got
        await c.wait_all()
        await c.disconnect()
        await peer.disconnect()

    run(main())


def test_disconnect_is_clean_close_sends_the_will(broker_addr):
    host, port = broker_addr

    async def main():
        watch = Client("watch", host, port)
        await watch.connect()
        await watch.subscribe("will/#", 1)
        a = Client("a", host, port, will_topic="will/a", will_payload=b"a died", will_qos=1)
        b = Client("b", host, port, will_topic="will/b", will_payload=b"b died", will_qos=1)
        await a.connect()
        await b.connect()
        await a.disconnect()  # DISCONNECT: the broker discards a's will
        b.close()  # no DISCONNECT: the broker publishes b's will
        (m,) = await take(watch.messages(), 1)
        assert (m.topic, m.payload) == ("will/b", b"b died"), m
        await watch.publish("will/end", b"", qos=1)
        (m,) = await take(watch.messages(), 1)
        assert m.topic == "will/end", m  # and a's will never came
        await watch.disconnect()

    run(main())


def test_a_stream_is_the_transport_across_reconnects_and_stays_open(broker_addr):
    # stream=: MQTT over an open byte stream (a UART to a modem in transparent mode), as the blocking
    # client. The broker hanging up (a session takeover) does not end the stream (the modem keeps the
    # line up): the client finds the call dead by its keepalive and reconnects over the same stream,
    # the messages published meanwhile go first; a second client connects over it after disconnect();
    # the client never closes it (the modem's line stays up until the test closes it).
    host, port = broker_addr
    mp = sys.implementation.name == "micropython"

    async def main():
        m = await Modem(host, port).start(11)
        peer = Client("aio-stream-peer", host, port)
        await peer.connect()
        assert await peer.subscribe("as/#", 2) == [2]
        seen = peer.messages()
        for k, kind in enumerate(["socket"] if mp else ["pair", "file"]):
            close, stream = await _line(m.port, kind)
            cid = "aio-stream-" + kind
            ups, downs = [], []
            c = Client(cid, version=5, stream=stream, backoff_min=0.5, backoff_max=0.5, keepalive=1, ping_timeout=0.3)
            c.on_connect = lambda present, reason: ups.append(reason)
            c.on_disconnect = downs.append
            assert await c.connect() is False and ups == [0]
            assert await c.subscribe("as/%s/#" % kind, 2) == [2]
            it = c.messages()
            await c.publish("as/%s/a" % kind, b"over a stream", qos=1, wait_ack=True)
            (r,) = await take(it, 1)
            assert (r.topic, r.payload, r.qos) == ("as/%s/a" % kind, b"over a stream", 1), r
            rival = Client(cid, host, port, version=5, reconnect=False)
            await rival.connect()
            await rival.disconnect()
            await until(lambda: downs, "the dead call to be found")
            assert "PINGRESP" in str(downs[0]) and not c.connected and m.dials == 3 * k + 1, downs
            p1 = await c.publish("as/%s/b" % kind, b"away-1", qos=1)
            p2 = await c.publish("as/%s/c" % kind, b"away-2", qos=2)
            assert c.session.pending() == [p1, p2]
            await until(lambda: len(ups) == 2, "the reconnect over the same stream")
            await c.wait_all(T)
            got = await take(seen, 3)
            assert [(g.topic, g.payload) for g in got] == [("as/%s/a" % kind, b"over a stream"),
                                                           ("as/%s/b" % kind, b"away-1"),
                                                           ("as/%s/c" % kind, b"away-2")], got
            await c.disconnect()
            assert c.stream is stream and (m.lines, m.dials) == (k + 1, 3 * k + 2), (m.lines, m.dials)
            c4 = Client(cid + "-4", version=4, stream=stream)
            assert await c4.connect() is False
            await c4.publish("as/%s/d" % kind, b"3.1.1", qos=1, wait_ack=True)
            (g,) = await take(seen, 1)
            assert (g.topic, g.payload) == ("as/%s/d" % kind, b"3.1.1"), g
            await c4.disconnect()
            await asyncio.sleep(0.2)
            assert m.line_open and (m.lines, m.dials) == (k + 1, 3 * k + 3), (m.line_open, m.lines, m.dials)
            close()  # the application closes its stream: the modem sees the line go
            await until(lambda: not m.line_open, "the line to close")
        await peer.disconnect()
        m.stop()

    run(main())


def test_reconnect_after_the_connection_drops(broker_addr):
    host, port = broker_addr

    async def main():
        proxy = await Proxy(host, port).start(port)
        ups = []
        downs = []
        c = Client("rc", "127.0.0.1", proxy.port, backoff_min=0.05, backoff_max=0.2)
        c.on_connect = lambda sp, rc: ups.append(rc)
        c.on_disconnect = downs.append
        peer = Client("rc-peer", host, port)
        await peer.connect()
        await peer.subscribe("rc/out", 1)
        await c.connect()
        assert await c.subscribe("rc/in", 1) == [1]
        proxy.drop()
        await until(lambda: not c.connected, "the client to see the drop")
        assert len(downs) == 1 and isinstance(downs[0], OSError), downs
        # Offline now: a QoS 1 message is kept and goes out after the reconnect.
        pid = await c.publish("rc/out", b"while offline", qos=1)
        assert c.session.is_pending(pid)
        await until(lambda: c.connected, "the reconnect")
        assert proxy.accepted == 2 and ups == [0, 0], (proxy.accepted, ups)
        (m,) = await take(peer.messages(), 1)
        assert m.payload == b"while offline", m
        await c.wait_all()  # the message and the renewed subscription are acknowledged
        await peer.publish("rc/in", b"after", qos=1)
        (m,) = await take(c.messages(), 1)
        assert (m.topic, m.payload) == ("rc/in", b"after"), m
        await c.disconnect()
        # connect() after disconnect() turns reconnection back on (it used to stay off for good)
        await c.connect()
        proxy.drop()
        await until(lambda: proxy.accepted == 4 and c.connected, "the reconnect after connect()")
        assert ups == [0, 0, 0, 0], ups
        await c.disconnect()
        await peer.disconnect()
        proxy.stop()

    run(main())


def test_session_takeover(broker_addr):
    # A second client with the same id makes Mosquitto close the first one's
    # connection (2.0.11 sends no DISCONNECT then). The first reconnects and
    # takes the session back; the second has reconnect=False, so it stays
    # out and its messages() raises the reason: no ping-pong.
    host, port = broker_addr

    async def main():
        downs = []
        a = Client("same", host, port, version=5, backoff_min=0.05, backoff_max=0.2)
        a.on_disconnect = downs.append
        b = Client("same", host, port, version=5, reconnect=False)
        await a.connect()
        await b.connect()
        await until(lambda: len(downs) == 1, "the takeover")
        assert isinstance(downs[0], OSError), downs
        await until(lambda: a.connected, "a to reconnect")
        try:
            await asyncio.wait_for(b.messages().__anext__(), T)
            raise AssertionError("b's messages() did not end")
        except OSError:
            pass
        assert not b.connected
        await asyncio.sleep(0.3)
        assert a.connected and len(downs) == 1, downs  # and it stays that way
        await a.disconnect()

    run(main())


def test_server_disconnect_then_reconnect(broker_addr):
    # MQTT 5: a topic alias above the broker's maximum makes Mosquitto send
    # DISCONNECT 0x94 (QoS 0, so nothing is resent after the reconnect). The
    # client refuses to send one (tests/lib/test_client_rules.py): the packet is
    # written past it, as a broken client would.
    host, port = broker_addr

    async def main():
        downs = []
        c = Client("alias", host, port, version=5, backoff_min=0.05, backoff_max=0.2)
        c.on_disconnect = downs.append
        await c.connect()
        await c.subscribe("back", 1)
        bad = encode(Packet(PUBLISH, topic="bad/alias", payload=b"x", props={P.TOPIC_ALIAS: 60000}), 5)
        c.session.send(bad, 0, len(bad))
        await until(lambda: len(downs) == 1, "the broker's DISCONNECT")
        assert isinstance(downs[0], MQTTError) and downs[0].code == 0x94, downs
        await until(lambda: c.connected, "the reconnect")
        await c.wait_all()  # the renewed subscription
        await c.publish("back", b"again", qos=1)
        (m,) = await take(c.messages(), 1)
        assert m.payload == b"again", m
        assert len(downs) == 1, downs
        await c.disconnect()

    run(main())


def test_refusal_raises_connect_error(scripted_addr):
    host, port = scripted_addr

    async def main():
        for v in (3, 4):
            # Identifier rejected (CONNACK 2; the script's broker refuses every client id).
            c = Client("refused", host, port, version=v, clean=False)
            try:
                await c.connect()
                raise AssertionError("the broker accepted the connection")
            except ConnectError as e:
                assert e.reason == 2 and e.permanent, e
            assert not c.connected
        # A server that accepts and never answers: OSError once the timeout is over.
        held = []

        async def mute(r, w):
            held.append(w)

        srv, p = await listen(mute, port + 1)
        c = Client("x", host, p)
        t0 = time.time()
        try:
            await c.connect(timeout=0.3)
            raise AssertionError("connected to a mute server")
        except ConnectError:
            raise
        except OSError as e:
            assert "CONNACK" in str(e), e
        assert 0.25 <= time.time() - t0 < 3, time.time() - t0
        assert len(held) == 1
        srv.close()
        for w in held:
            w.close()
        # Nobody listening: OSError, not ConnectError.
        c = Client("x", host, 1, connect_timeout=2)
        try:
            await c.connect()
            raise AssertionError("connected to port 1")
        except ConnectError:
            raise
        except OSError:
            pass

    run(main())


def test_keepalive_pings_and_detects_a_dead_link(broker_addr):
    host, port = broker_addr

    async def main():
        proxy = await Proxy(host, port).start(port)
        downs = []
        c = Client("ka", "127.0.0.1", proxy.port, keepalive=1, backoff_min=0.05, backoff_max=0.2)
        c.on_disconnect = downs.append
        await c.connect()
        # Idle for 2.5 keepalive intervals: PINGREQ keeps the broker (which
        # drops a client silent for 1.5 intervals) and the client content.
        await asyncio.sleep(2.5)
        assert c.connected and not downs, downs
        # The link goes silent: no PINGRESP, so the client gives up on it
        # and reconnects.
        proxy.stall()
        await until(lambda: len(downs) == 1, "the dead link to be noticed")
        assert "PINGRESP" in str(downs[0]), downs
        await until(lambda: c.connected, "the reconnect")
        assert proxy.accepted == 2
        await c.publish("ka", b"x", qos=1, wait_ack=True)
        await c.disconnect()
        proxy.stop()

    run(main())


def test_a_subscription_made_offline_reaches_a_broker_that_kept_the_session(broker_addr):
    # subscribe() while offline (here between connections; as easily during a
    # background reconnect) registers the filter "to be sent on connect"; the
    # session sent its subscriptions again only when the broker had lost the
    # session, so a broker that kept it never heard of this one.
    # Fails until tern/session.py sends, on a CONNACK with session present,
    # the subscriptions registered since the last connection.
    host, port = broker_addr
    cid = "late-sub-" + sys.implementation.name

    async def main():
        wipe = Client(cid, host, port, clean=True)  # no session left from an earlier run
        await wipe.connect()
        await wipe.disconnect()
        c = Client(cid, host, port, clean=False)
        await c.connect()
        await c.disconnect()
        assert await c.subscribe("late/t", 1) is None  # offline: registered, sent on connect
        assert await c.connect() is True  # the broker kept the session
        peer = Client(cid + "-peer", host, port)
        await peer.connect()
        await peer.publish("late/t", b"hello", qos=1, wait_ack=True)
        (m,) = await take(c.messages(), 1)
        assert (m.topic, m.payload) == ("late/t", b"hello"), m
        await c.disconnect()
        await peer.disconnect()

    run(main())


def test_connect_right_after_close_keeps_messages_going(broker_addr):
    # close() cancels the supervisor; the cancellation lands while the connect() that follows waits
    # for its CONNACK, and the dying supervisor took the client for closed: messages() ended at once
    # (StopAsyncIteration) on a connected client.
    host, port = broker_addr

    async def main():
        c = Client("cc", host, port)
        await c.connect()
        await asyncio.sleep(0.1)  # the supervisor is under way
        c.close()
        await c.connect()
        assert await c.subscribe("cc/t", 1) == [1]
        await c.publish("cc/t", b"x", qos=1)
        (m,) = await take(c.messages(), 1)
        assert m.payload == b"x", m
        await c.disconnect()

    run(main())


# ---------------------------------------------------- against a scripted broker


def E(t, v=4, **kw):
    return encode(Packet(t, **kw), v)


HELLO = [("recv_type", CONNECT), ("send", E(CONNACK))]

# Played by the scripted_addr fixture (tests/lib/conftest.py), which fails the
# test on any byte the client sends that the script does not expect.
SCRIPTS = {
    "test_refusal_raises_connect_error": ([
        [("recv_type", CONNECT), ("send", E(CONNACK, reason=2)), ("close",)],
        [("recv_type", CONNECT), ("send", E(CONNACK, reason=2)), ("close",)],
    ], 4),
    "test_a_broker_that_breaks_the_protocol_is_told_why": ([
        [("recv_type", CONNECT), ("send", E(CONNACK, 5)),
         ("send", E(PUBLISH, 5, topic="a", payload=b"1", props={P.TOPIC_ALIAS: 5})),
         ("recv", E(DISCONNECT, 5, reason=0x94))],
    ], 5),
    "test_bytes_a_failed_write_left_never_reach_the_next_connection": ([
        # The broker does not read the QoS 0 message: its close is a reset.
        HELLO + [("stall", 0.3), ("close",)],
        [("recv_type", CONNECT), ("send", E(CONNACK, session_present=True)),
         ("recv", E(PUBLISH, topic="t", payload=b"a", qos=1, pid=1, dup=True)), ("send", E(PUBACK, pid=1)),
         ("recv", E(DISCONNECT))],
    ], 4),
    "test_ping_timeout_in_seconds_as_a_float": ([HELLO + [("recv_type", PINGREQ), ("stall", 5)]], 4),  # no PINGRESP
    "test_session_present_after_a_clean_start_is_the_protocol_error_it_is": ([
        [("recv_type", CONNECT), ("send", E(CONNACK, session_present=True)), ("close",)],
    ], 4),
    "test_session_present_after_a_clean_start_is_told_to_an_mqtt5_broker": ([
        [("recv_type", CONNECT), ("send", E(CONNACK, 5, session_present=True)),
         ("recv", E(DISCONNECT, 5, reason=0x82))],
    ], 5),
    "test_stored_messages_refused_at_connack_fail_their_publish_wait": ([
        [("recv_type", CONNECT), ("send", E(CONNACK, 5, props={P.MAXIMUM_QOS: 1, P.RETAIN_AVAILABLE: 0})),
         ("recv", E(PUBLISH, 5, topic="t", payload=b"ok", qos=1, pid=3)), ("send", E(PUBACK, 5, pid=3)),
         ("recv", E(DISCONNECT, 5))],
    ], 5),
    "test_a_publish_over_the_receive_buffer_is_skipped_and_acknowledged": ([
        HELLO + [("send", E(PUBLISH, topic="big", payload=b"z" * 2000, qos=1, pid=5)
                  + E(PUBLISH, topic="small", payload=b"ok", qos=1, pid=6)),
                 ("recv", E(PUBACK, pid=5)), ("recv", E(PUBACK, pid=6)),
                 ("send", E(PUBLISH, topic="big", payload=b"y" * 3000, qos=2, pid=7)), ("recv", E(PUBREC, pid=7)),
                 ("send", E(PUBREL, pid=7)), ("recv", E(PUBCOMP, pid=7)),
                 ("send", E(PUBLISH, topic="big", payload=b"x" * 600)
                  + E(PUBLISH, topic="small", payload=b"after", qos=1, pid=8)),
                 ("recv", E(PUBACK, pid=8)), ("recv", E(DISCONNECT))],
    ], 4),
    "test_a_cancelled_wait_leaves_no_waiter_behind": ([
        HELLO + [("recv", E(PUBLISH, topic="t", payload=b"x", qos=1, pid=1)), ("stall", 0.3),
                 ("send", E(PUBACK, pid=1)),
                 ("recv", E(SUBSCRIBE, pid=2, topics=[("a", 1)])), ("stall", 0.3), ("send", E(SUBACK, pid=2, reasons=[1])),
                 ("recv", E(DISCONNECT))],
    ], 4),
}


async def _until_down(addr, what, **kw):
    """A client of the scripted broker, connected and then left waiting until
    it lost the connection: (client, the errors on_disconnect was given)."""
    downs = []
    c = Client("scripted", addr[0], addr[1], reconnect=False, **kw)
    c.on_disconnect = downs.append
    await c.connect()
    await until(lambda: downs, what)
    return c, downs


def test_a_broker_that_breaks_the_protocol_is_told_why(scripted_addr):
    # The session queues DISCONNECT 0x94 before it raises; the teardown used
    # to drop it with the write buffer, so the broker never heard why.
    async def main():
        c, downs = await _until_down(scripted_addr, "the disconnect", version=5, topic_alias_max=2)
        assert isinstance(downs[0], MQTTError) and downs[0].code == 0x94 and not c.connected, downs

    run(main())


def test_bytes_a_failed_write_left_never_reach_the_next_connection(scripted_addr):
    # MicroPython: a write that raised (the broker reset the connection) left
    # its bytes in the writer's second buffer, and they went out on the next
    # connection right after CONNECT: here the message without DUP, then
    # again as the resend.
    async def main():
        downs = []
        c = Client("scripted", scripted_addr[0], scripted_addr[1], clean=False, backoff_min=0.02, backoff_max=0.1)
        c.on_disconnect = downs.append
        await c.connect()
        await c.publish("t", b"x", qos=0)
        await asyncio.sleep(0.05)
        time.sleep(0.6)  # the broker resets the connection while the loop stands still
        assert await c.publish("t", b"a", qos=1) == 1
        time.sleep(0.01)  # so the writer meets the reset before the reader
        await c.wait_all(T)
        assert len(downs) == 1 and isinstance(downs[0], OSError), downs
        await c.disconnect()

    run(main())


def test_ping_timeout_in_seconds_as_a_float(scripted_addr):
    # A PINGRESP later than the keepalive interval made poll() return a float,
    # which MicroPython's wait_for_ms refuses: the supervisor died, and with
    # it the keepalive and the reconnect; messages() just ended.
    async def main():
        c, downs = await _until_down(scripted_addr, "the missing PINGRESP to be noticed", keepalive=1, ping_timeout=1.2)
        assert "PINGRESP" in str(downs[0]) and not c.connected, downs
        try:
            await asyncio.wait_for(c.messages().__anext__(), T)
            raise AssertionError("messages() ended without the reason")
        except OSError as e:
            assert e is downs[0], (e, downs)

    run(main())


def test_a_connect_that_times_out_closes_its_socket():
    # MicroPython's open_connection leaks its socket when the wait for it is
    # cancelled: one file descriptor (an lwIP socket on a board) per attempt.
    import os
    import socket

    def fds():
        return len(os.listdir("/proc/self/fd"))

    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    for k in range(64):
        port = 20000 + (k * 7919 + (id(lst) >> 4)) % 40000
        try:
            lst.bind(socket.getaddrinfo("127.0.0.1", port)[0][-1])
            break
        except OSError:
            continue
    lst.listen(0)
    # Fill the accept queue: the kernel drops further SYNs and connect() hangs.
    fill = []
    for _ in range(4):
        f = socket.socket()
        f.setblocking(False)
        try:
            f.connect(socket.getaddrinfo("127.0.0.1", port)[0][-1])
        except OSError:
            pass
        fill.append(f)

    async def main():
        c = Client("x", "127.0.0.1", port, connect_timeout=0.1)
        n0 = fds()
        for _ in range(4):
            try:
                await c.connect()
                raise AssertionError("connected to a full accept queue")
            except ConnectError:
                raise
            except OSError as e:
                assert "could not reach" in str(e), e
        assert fds() == n0, (n0, fds())

    try:
        run(main())
    finally:
        for f in fill + [lst]:
            f.close()


def _scripted(addr, **kw):
    return Client("scripted", addr[0], addr[1], reconnect=False, **kw)


async def _refused_connect(c):
    try:
        await c.connect()
    except MQTTError as e:
        return e
    raise AssertionError("connect() accepted a CONNACK with session present after a clean start")


def test_session_present_after_a_clean_start_is_the_protocol_error_it_is(scripted_addr):
    # connect() raised OSError("connection ... lost before CONNACK: session present ..."): the
    # blocking client, and docs/mqtt5-client.md, raise MQTTError 0x82; an application catching it
    # missed it. As after any failed first connect(), no background retry starts (reconnect is on).
    async def main():
        c = Client("scripted", scripted_addr[0], scripted_addr[1], backoff_min=0.02, backoff_max=0.05)
        e = await _refused_connect(c)
        assert e.code == 0x82 and "session present" in str(e), e
        await asyncio.sleep(0.3)
        assert not c.connected and c._sup is None

    run(main())


def test_session_present_after_a_clean_start_is_told_to_an_mqtt5_broker(scripted_addr):
    async def main():
        e = await _refused_connect(_scripted(scripted_addr, version=5))
        assert e.code == 0x82, e

    run(main())


def test_stored_messages_refused_at_connack_fail_their_publish_wait(scripted_addr):
    # Stored offline, given back refused at a CONNACK whose Maximum QoS / Retain Available they break
    # (EV_PUBLISHED before EV_CONNACK): a publish(wait_ack=True) waiting on one raises the refusal,
    # on_published hears of each before on_connect, and the message the server takes goes
    async def main():
        c = _scripted(scripted_addr, version=5)
        seen = []
        c.on_published = lambda pid, reason: seen.append((pid, reason))
        c.on_connect = lambda sp, reason: seen.append(("up", reason))
        q2 = asyncio.create_task(c.publish("t", b"q2", qos=2, wait_ack=True))
        kept = asyncio.create_task(c.publish("t", b"kept", qos=1, retain=True, wait_ack=True))
        await asyncio.sleep(0.05)
        assert c.session.pending() == [1, 2]
        ok = await c.publish("t", b"ok", qos=1)
        assert await c.connect() is False
        for t, code in ((q2, 0x9B), (kept, 0x9A)):
            try:
                await asyncio.wait_for(t, T)
                raise AssertionError("publish(wait_ack=True) returned for a refused message")
            except MQTTError as e:
                assert e.code == code, (e.code, code)
        await c.wait_published(ok, T)
        assert seen == [(1, 0x9B), (2, 0x9A), ("up", 0), (3, 0)], seen
        await c.disconnect()

    run(main())


def test_a_publish_over_the_receive_buffer_is_skipped_and_acknowledged(scripted_addr):
    # MQTT 3.1.1: a message over rx_size is discarded as the reader feeds it in and acknowledged in
    # its place; what follows reaches messages()
    async def main():
        c = _scripted(scripted_addr, rx_size=512)
        await c.connect()
        got = await take(c.messages(), 2)
        assert [m.payload for m in got] == [b"ok", b"after"], got
        await until(lambda: c.session.stats_dropped == 3, "the three oversize messages to be dropped")
        assert c.connected
        await c.disconnect()

    run(main())


def test_a_cancelled_wait_leaves_no_waiter_behind(scripted_addr):
    # publish(wait_ack=True) or subscribe() under asyncio.wait_for that gives up: the cancelled wait
    # left its waiter behind, and the reply, when it came, in _results for good (memory lost per
    # cancellation, on a board too)
    async def main():
        c = _scripted(scripted_addr)
        await c.connect()
        for call in (c.publish("t", b"x", qos=1, wait_ack=True), c.subscribe("a", 1)):
            try:
                r = await asyncio.wait_for(call, 0.1)
                # a publish cancelled once stored returns its id (test_aio_cancel.py); CPython's wait_for hands it over
                assert r == 1 and not MICROPYTHON and c.session.is_pending(1), "the wait was not cancelled"
            except asyncio.TimeoutError:
                pass
            await c.wait_all(T)  # the reply came
        assert c._waiters == {} and c._results == {}, (c._waiters, c._results)
        await c.disconnect()

    run(main())
