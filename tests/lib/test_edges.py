"""The library at its capacity edges (issue 14): a full outbox at reconnect with
subscriptions to send, SUBSCRIBE records that a broker never answers, an
oversize malformed PUBLISH on MQTT 3.1.1, inbound QoS 2 state, and blocking
waits that cannot end. Runs on CPython and MicroPython."""

from check import MICROPYTHON, raises
from norflash import NorFlash
from pump import client, until
from test_norflash import tmppath, rm, rmtree
from tern.client import Client, ticks_ms
from tern.codec import Packet, encode
from tern.filestore import FileStore
from tern.flashstore import FlashStore
from tern.session import Session, NotConnected
from tern.store import MemoryStore
from tern.wire import CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, SUBSCRIBE, SUBACK, DISCONNECT, MQTTError

MP_TIMEOUT = 240


def E(t, v=4, **kw):
    return encode(Packet(t, **kw), v)


def sans_io(store, v=4, **kw):
    """A Session whose output is kept in a list of packets (no socket)."""
    out = []
    s = Session("edge", v, False, store=store, **kw)
    s.send = lambda b, o, n: out.append(bytes(b[o : o + n]))
    return s, out


def types(out):
    return [b[0] >> 4 for b in out]


# -- defect 1: a full outbox at reconnect with subscriptions waiting -------------
def test_full_outbox_and_offline_subscriptions_overwrite_nothing_at_connack():
    # The firmware's boot: 256 QoS 1 messages (max_pending's default) stored offline, 4
    # subscriptions registered, then connect. SUBSCRIBEs used to be pushed past the ring's end:
    # the first messages were overwritten (never sent), the store kept orphan records, and the
    # next Session on that store refused to start, at every boot.
    for sp in (False, True):
        path = tmppath("edge1")
        try:
            st = FileStore(path, verbose=False).open()
            s, out = sans_io(st)
            pids = [s.publish("t", b"%d" % i, 1, False, 0) for i in range(256)]
            assert pids[-1] > 0 and s.outbox_full()
            for f in ("a", "b", "c", "d"):
                assert s.subscribe(f, 1, 0) == 0
            s.connect_packet(0)
            s.feed(E(CONNACK, session_present=sp), 0)
            assert s.pending() == pids and st.pending() == pids, sp  # nothing overwritten
            sent = [b for b in out if b[0] >> 4 == PUBLISH]
            assert len(sent) == 16 and sent[0] == encode(Packet(PUBLISH, topic="t", payload=b"0", qos=1, pid=pids[0],
                                                                 dup=False), 4)
            # power cut before any SUBACK (and before any PUBACK): the store reopens, all 256 in order
            st = FileStore(path, verbose=False).open()
            s2, out2 = sans_io(st)
            assert s2.pending() == pids and s2.stats_recovered == 256
            st.close()
            # on the first connection the acks make room: each frees a slot, a SUBSCRIBE takes it
            st = FileStore(path, verbose=False).open()
            s, out = sans_io(st)
            for f in ("a", "b", "c", "d"):
                s.subscribe(f, 1, 0)
            s.connect_packet(0)
            s.feed(E(CONNACK, session_present=sp), 0)
            for k in range(4):
                s.feed(E(PUBACK, pid=pids[k]), 0)
            subs = [b for b in out if b[0] >> 4 == SUBSCRIBE]
            assert len(subs) == 4 and st.count() == 256, (sp, len(subs), st.count(), s._n, s._head, types(out))
            for b in subs:
                s.feed(E(SUBACK, pid=b[2] << 8 | b[3], reasons=[1]), 0)
            for p in pids[4:]:
                s.feed(E(PUBACK, pid=p), 0)
            got = [bytes(b) for b in out if b[0] >> 4 == PUBLISH]
            assert len(got) == 256 and s.pending() == [] and st.count() == 0
            assert [int(g[7:]) for g in got] == list(range(256)), [g[7:] for g in got][:8]
            st.close()
        finally:
            rmtree(path)


def test_store_holding_more_than_max_pending_still_starts():
    # max_pending lowered between two boots (a config change) must not stop the device for good
    st = MemoryStore()
    s, _ = sans_io(st, max_pending=8)
    pids = [s.publish("t", b"x", 1, False, 0) for i in range(8)]
    s2, out = sans_io(st, max_pending=4)
    assert s2.pending() == pids and s2.outbox_full()
    s2.connect_packet(0)
    s2.feed(E(CONNACK, session_present=True), 0)
    for p in pids:
        s2.feed(E(PUBACK, pid=p), 0)
    assert st.count() == 0 and not s2.outbox_full()


def test_full_outbox_and_four_subscriptions_deliver_every_message_once_in_order(broker_addr):
    got = []
    sub = client(broker_addr, "edge-sub", version=4)
    sub.subscribe("edge1/#", 1, handler=lambda m: got.append(bytes(m.payload)))
    path = tmppath("edge1b")
    try:
        c = Client("edge-full-%d" % (ticks_ms() % 100000), server=broker_addr[0], port=broker_addr[1],
                   store=FileStore(path, verbose=False))
        pids = [c.publish("edge1/x", b"%d" % i, 1) for i in range(256)]
        subs = []
        for i in range(4):
            assert c.subscribe("edge1/in/%d" % i, 1, handler=lambda m: subs.append(m.topic)) is None
        c.connect()
        until([c, sub], lambda: len(got) >= 256 and not c.session.pending(), 30000, "256 messages")
        sub.loop(200)
        assert got == [b"%d" % i for i in range(256)], (len(got), got[:4])
        assert c.session.store.count() == 0 and len(set(pids)) == 256
        sub.publish("edge1/in/3", b"in", 1)  # the four subscriptions were made
        until([c, sub], lambda: subs, what="a message on a subscription made with the outbox full")
        c.disconnect()
        sub.disconnect()
    finally:
        rmtree(path)


# -- defect 2: a broker that closes instead of answering SUBSCRIBE ----------------
N_RECONNECTS = 42
SUB_A = encode(Packet(SUBSCRIBE, pid=1, topics=[("denied/#", 1)]), 4)
SCRIPTS = {
    "test_unanswered_subscribe_does_not_pile_up_over_reconnects": (
        [[("recv_type", CONNECT), ("send", E(CONNACK)), ("recv", SUB_A), ("close",)]] * N_RECONNECTS
        + [[("recv_type", CONNECT), ("send", E(CONNACK)), ("recv", SUB_A), ("send", E(SUBACK, pid=1, reasons=[1]))]],
        4),
    "test_oversize_qos1_publish_with_packet_id_0_is_a_typed_error": (
        [[("recv_type", CONNECT), ("send", E(CONNACK)),
          ("send", bytes([0x32, 0x90, 0x03, 0, 1, 116, 0, 0]) + b"z" * 395)]], 4),
    "test_oversize_qos3_publish_is_a_typed_error": (
        [[("recv_type", CONNECT), ("send", E(CONNACK)),
          ("send", bytes([0x36, 0x90, 0x03, 0, 1, 116, 0, 7]) + b"z" * 395)]], 4),
}


def test_unanswered_subscribe_does_not_pile_up_over_reconnects(scripted_addr):
    # Each connection gets CONNACK (no session), reads the SUBSCRIBE and closes (a broker that
    # drops a client over a denied filter). The stored SUBSCRIBE used to be resent AND the
    # subscription registered again as new: one more record per reconnect, then "outbox full".
    c = Client("edge-deny", server=scripted_addr[0], port=scripted_addr[1], clean=False, max_pending=8,
               backoff_min=0.001, backoff_max=0.002)
    c.subscribe("denied/#", 1, handler=lambda m: None)
    c.connect()
    s = c.session
    most = 0
    start = ticks_ms()
    while not (c.connected and not s.pending()):
        c.loop(20)
        most = max(most, s.store.count())
        assert ticks_ms() - start < 30000, "stuck: %d records" % s.store.count()
    assert most == 1, most
    assert s.store.count() == 0
    c.disconnect()


# -- defect 5: malformed oversize PUBLISH on MQTT 3.1.1 --------------------------
def oversize(addr):
    c = Client("edge-big", server=addr[0], port=addr[1], rx_size=256, reconnect=False)
    c.connect()
    c.loop(2000)  # a ValueError out of loop() before (packet id 0), or a PUBREC answering QoS 3
    e = c.last_error
    assert isinstance(e, MQTTError) and e.code == 0x81, repr(e)
    assert not c.connected and c.session.stats_dropped == 0
    c.close()
    return e


def test_oversize_qos1_publish_with_packet_id_0_is_a_typed_error(scripted_addr):
    assert "packet id 0" in str(oversize(scripted_addr))


def test_oversize_qos3_publish_is_a_typed_error(scripted_addr):
    assert "QoS 3" in str(oversize(scripted_addr))


# -- defect 7: waits that nothing can end fail at once ---------------------------
def cpu_s():
    if MICROPYTHON:
        return ticks_ms() / 1000  # no process clock here: the wall clock bounds it from above
    import time

    return time.process_time()


SCRIPTS["test_waits_fail_at_once_when_offline_and_not_reconnecting"] = (
    [[("recv_type", CONNECT), ("send", E(CONNACK)), ("recv_type", SUBSCRIBE), ("close",)]], 4)


def test_waits_fail_at_once_when_offline_and_not_reconnecting(scripted_addr):
    # The blocking calls used to spin for their whole timeout once the connection was gone
    # with reconnect=False (2.96 s of CPU in a 4 s wait): now NotConnected at once.
    c = Client("edge-idle", server=scripted_addr[0], port=scripted_addr[1], reconnect=False)
    c.connect()
    t0, w0 = cpu_s(), ticks_ms()
    e = raises(NotConnected, c.subscribe, "edge7/#", 1, timeout=4)  # the broker closes on it
    assert "subscribe" in str(e) and "not reconnecting" in str(e), e
    pid = c.publish("edge7/x", b"kept", 1)  # stored while offline
    raises(NotConnected, c.wait_published, pid, 4)
    raises(NotConnected, c.wait_all, 4)
    c.close()  # and after close(), with reconnect on
    c.reconnect = True
    raises(NotConnected, c.wait_all, 4)
    raises(NotConnected, c.wait_published, pid, 4)
    # far below one 4 s wait, in CPU and in wall time
    assert cpu_s() - t0 < 0.5 and ticks_ms() - w0 < 1500, (cpu_s() - t0, ticks_ms() - w0)
    assert len(c.session.pending()) == 2 and c.session.pending()[1] == pid  # SUBSCRIBE and message kept
