"""Each packet leaves in one write, and Nagle's algorithm is off (issue 17).

A PUBLISH written as a header and then a payload leaves as two segments, and
with Nagle's algorithm on, a small segment waits for the peer's ACK of the one
before; a broker with nothing to answer (QoS 0) delays that ACK by ~40 ms.
The session test checks the first half on every packet type; the driver
tests check both halves at a real socket: a recording broker that delays its
ACKs (TCP_QUICKACK off, as a broker that has nothing to send back does) sees
every read end on a packet boundary, and the second of two QoS 0 messages
published back to back arrive with the first, not an ACK timeout later.
"""

from check import MICROPYTHON
from tern import pkt
from tern.codec import Packet, encode
from tern.session import Session
from tern.wire import CONNACK, PUBLISH, PUBACK, PUBCOMP, PUBREC, PUBREL, SUBACK, UNSUBACK

MP_TIMEOUT = 120


def _whole(sent):
    # Every send() call handed over whole packets; returns their types, one list a send.
    out = []
    for b in sent:
        pos = 0
        types = []
        while pos < len(b):
            n = pkt.frame_size(b, pos, len(b), 1 << 28)
            assert 0 < n <= len(b) - pos, "a send() of %d bytes ends inside a packet: %s" % (len(b), bytes(b[:8]))
            types.append(b[pos] >> 4)
            pos += n
        out.append(types)
    return out


def test_each_packet_is_one_send():
    for v in (3, 4, 5):
        s = Session("one-send", v, tx_size=128, keepalive=1)
        sent = []
        s.send = lambda buf, off, n: sent.append(bytes(buf[off : off + n]))

        def feed(p):
            b = encode(p, v)
            s.rx[s.rx_len : s.rx_len + len(b)] = b
            s.feed_n(len(b), 0)

        s.subscribe("in/#", 2, 0, handler=lambda m: None)
        s.connect_packet(0)  # CONNECT
        feed(Packet(CONNACK))  # then the SUBSCRIBE
        feed(Packet(SUBACK, pid=1, reasons=[2]))
        hlen = 2 + 2 + 3 + (1 if v == 5 else 0)  # fixed header (2-byte length), topic "t/x", no packet id
        pid1 = s.publish(b"t/x", b"p" * 100, 1, False, 0)
        pid2 = s.publish(b"t/x", b"q" * 100, 2, False, 0)
        s.publish(b"t/x", b"r" * 100, 0, False, 0)
        s.publish(b"t/x", b"e" * (128 - hlen), 0, False, 0)  # exactly fills the transmit buffer
        feed(Packet(PUBACK, pid=pid1))
        feed(Packet(PUBREC, pid=pid2))  # PUBREL
        feed(Packet(PUBLISH, topic="in/a", payload=b"x", qos=1, pid=7))  # PUBACK
        feed(Packet(PUBLISH, topic="in/a", payload=b"x", qos=2, pid=8))  # PUBREC
        feed(Packet(PUBREL, pid=8))  # PUBCOMP
        s.poll(2000)  # PINGREQ
        s.unsubscribe("in/#", 0)
        feed(Packet(UNSUBACK, pid=s._last_pid, reasons=[0]))
        s.disconnect(0)
        types = _whole(sent)
        assert types == [[1], [8], [3], [3], [3], [3], [6], [4], [5], [7], [12], [10], [14]], (v, types)
        # A payload larger than the buffer: the header, then the payload as given (still in order).
        s2 = Session("big", v, tx_size=128)
        out = []
        s2.send = lambda buf, off, n: out.append(bytes(buf[off : off + n]))
        s2.connect_packet(0)
        b = encode(Packet(CONNACK), v)
        s2.rx[: len(b)] = b
        s2.feed_n(len(b), 0)
        s2.publish(b"t/x", b"f" * (129 - hlen), 0, False, 0)
        assert len(out) == 3 and len(out[1]) == hlen and out[2] == b"f" * (129 - hlen), [len(x) for x in out]


def test_what_one_read_triggers_leaves_in_one_write():
    # Acknowledgements that arrive in one read: the PUBRELs they call for and
    # the messages they let out of the window leave together, in one write,
    # in the order of their triggers. Acks of inbound messages leave at once.
    for v in (4, 5):
        s = Session("batch", v, window=4, tx_size=512)
        sent = []
        s.send = lambda buf, off, n: sent.append(bytes(buf[off : off + n]))
        s.subscribe("in/#", 2, 0)
        s.connect_packet(0)

        def feed(*ps):
            b = b"".join(encode(p, v) for p in ps)
            s.rx[s.rx_len : s.rx_len + len(b)] = b
            s.feed_n(len(b), 0)

        feed(Packet(CONNACK), Packet(SUBACK, pid=1, reasons=[2]))
        pids = [s.publish(b"t/x", b"p" * 40, 1 + i % 2, False, 0) for i in range(8)]
        del sent[:]
        # 4 in flight (QoS 1, 2, 1, 2): PUBACK, PUBREC, PUBACK, PUBREC in one read
        feed(*[Packet(PUBACK if i % 2 == 0 else PUBREC, pid=pids[i]) for i in range(4)])
        assert _whole(sent) == [[3, 6, 3, 6]], (v, _whole(sent))  # PUBLISH 5, PUBREL 2, PUBLISH 6, PUBREL 4
        del sent[:]
        feed(Packet(PUBCOMP, pid=pids[1]), Packet(PUBCOMP, pid=pids[3]))  # two PUBCOMPs: messages 7 and 8 leave at once
        assert _whole(sent) == [[3, 3]], (v, _whole(sent))
        del sent[:]
        feed(Packet(PUBLISH, topic="in/a", payload=b"x", qos=1, pid=7),
             Packet(PUBLISH, topic="in/a", payload=b"y", qos=2, pid=8), Packet(PUBREL, pid=8))
        assert _whole(sent) == [[4], [5], [7]], (v, _whole(sent))  # acks of inbound messages leave at once
        # a packet that does not fit behind those queued goes in a write of its own, in order
        del sent[:]
        s2 = Session("full", v, window=8, tx_size=64)
        s2.send = lambda buf, off, n: sent.append(bytes(buf[off : off + n]))
        s2.connect_packet(0)
        b = encode(Packet(CONNACK), v)
        s2.rx[: len(b)] = b
        s2.feed_n(len(b), 0)
        big = [s2.publish(b"t/x", b"q" * 40, 1, False, 0) for _ in range(16)][:8]  # 8 in flight, 8 queued
        del sent[:]
        # 8 PUBACKs release PUBLISHes 9 to 16 of 49 bytes: one at a time fits the 64-byte buffer
        b = b"".join(encode(Packet(PUBACK, pid=p), v) for p in big)
        s2.rx[: len(b)] = b
        s2.feed_n(len(b), 0)
        assert _whole(sent) == [[3]] * 8, (v, _whole(sent))
        assert s2.pending() == list(range(9, 17)), s2.pending()


def test_what_a_read_lets_out_leaves_even_when_application_code_raises():
    # The messages the acknowledgements of one read let out of the window
    # leave once the read is handled (one pass), or before a message handler
    # runs; application code that raises under the read (a message handler,
    # the published event) must not leave them waiting with the window open.
    for case in ("handler", "event"):
        s = Session("raises", 4, window=2, tx_size=512)
        sent = []
        s.send = lambda buf, off, n: sent.append(bytes(buf[off : off + n]))
        s.connect_packet(0)

        def feed(*ps):
            b = b"".join(encode(p, 4) for p in ps)
            s.rx[s.rx_len : s.rx_len + len(b)] = b
            s.feed_n(len(b), 0)

        seen = []

        def boom(*a):
            seen.append([t for w in _whole(sent) for t in w].count(PUBLISH))
            raise RuntimeError("application code failed")

        s.subscribe("in/#", 1, 0, handler=boom if case == "handler" else None)
        feed(Packet(CONNACK), Packet(SUBACK, pid=1, reasons=[1]))
        pids = [s.publish(b"t/x", b"p" * 10, 1, False, 0) for _ in range(4)]  # 2 in flight, 2 wait
        del sent[:]
        if case == "event":
            s.on_event = boom
            acks = [Packet(PUBACK, pid=pids[0]), Packet(PUBACK, pid=pids[1])]
        else:
            acks = [Packet(PUBACK, pid=pids[0]), Packet(PUBACK, pid=pids[1]),
                    Packet(PUBLISH, topic="in/a", payload=b"x", qos=1, pid=9)]
        try:
            feed(*acks)
            raise AssertionError("the application's exception did not reach the driver")
        except RuntimeError:
            pass
        got = [t for w in _whole(sent) for t in w]
        if case == "event":
            # the event of the first acknowledgement raised: the second is still unread
            assert got == [PUBLISH] and s.pending() == pids[1:], (_whole(sent), s.pending())
            s.on_event = None
            s.feed_n(0, 0)  # (what a driver does with frames left behind)
            got = [t for w in _whole(sent) for t in w]
        assert got.count(PUBLISH) == 2, (case, _whole(sent))  # messages 3 and 4 left
        assert s._inflight == 2 and s.pending() == pids[2:], (case, s.pending())
        if case == "handler":
            assert got == [PUBLISH, PUBLISH, PUBACK], got  # the message's ack after its handler, behind them
            assert seen == [2], seen  # and they had left before the handler ran


# --------------------------------------------------- at a socket, both drivers


if not MICROPYTHON:  # the fixture runs on CPython only; MicroPython gets its value
    import pytest

    @pytest.fixture
    def recording_addr():
        from ternlab.brokers.recorder import RecordingBroker

        b = RecordingBroker()
        yield [b.host, b.port]
        b.check()


ROUNDS = 6
BODY = b"x" * 60


def _nodelay_on(sock):
    # CPython can ask the socket; MicroPython's has no getsockopt (the broker's reads show it instead).
    if not MICROPYTHON:
        import socket

        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_client_packets_leave_whole_and_at_once(recording_addr):
    from tern.client import Client

    c = Client("one-write", server=recording_addr[0], port=recording_addr[1], reconnect=False)
    c.connect()
    _nodelay_on(c.sock)
    c.subscribe("s/#", 1)
    for _ in range(ROUNDS):  # QoS mixed as a telemetry device mixes it
        c.wait_published(c.publish(b"q/1", BODY, qos=1))
        c.publish(b"pair/a", BODY, qos=0)
        c.publish(b"pair/b", BODY, qos=0)
        c.wait_published(c.publish(b"q/2", BODY, qos=2))
        c.loop(60)
    c.disconnect()


def test_aio_packets_leave_whole_and_at_once(recording_addr):
    import asyncio
    from tern.aio import Client

    async def main():
        c = Client("one-write-aio", server=recording_addr[0], port=recording_addr[1], reconnect=False)
        await c.connect()
        if not MICROPYTHON:
            _nodelay_on(c._w.get_extra_info("socket"))
        await c.subscribe("s/#", 1)
        for _ in range(ROUNDS):
            await c.publish(b"q/1", BODY, qos=1, wait_ack=True)
            await c.publish(b"pair/a", BODY, qos=0)
            await asyncio.sleep(0)  # the writer hands pair/a to the socket on its own
            await asyncio.sleep(0)
            await c.publish(b"pair/b", BODY, qos=0)
            await c.publish(b"q/2", BODY, qos=2, wait_ack=True)
            await asyncio.sleep(0.06)
        await c.disconnect()

    asyncio.run(main())
