"""A burst of inbound QoS 2 messages from a real Mosquitto, queued for a subscriber that was not
reading, on CPython and MicroPython.

Mosquitto 2.0.11 sends such a queue whole before the PUBREL of any message past its first window
(20 under MQTT 3.1.1, Receive Maximum under MQTT 5, which it does not keep here), so the ids
awaiting PUBREL grow with the queue. A subscriber capped them at 128 and then refused the next
message (0x93): a clean session stopped at 148 messages (128 + 20; 160 under MQTT 5) and the rest
were gone with its session; a persistent one reconnected to get them. Now every message arrives
once, in order, on one connection, but for a persistent session on a durable store (its ids must
be durable: deferred and fetched by reconnecting, tern.fault.over_cap)."""

import asyncio

from norflash import NorFlash
from pump import client, until
from tern.client import Client, ticks_ms
from tern.flashstore import FlashStore

MP_TIMEOUT = 300
CAP = 128  # Session._in_cap at the default receive_max
WINDOW = {4: 20, 5: 32}  # what Mosquitto sends before its first PUBRELs: max_inflight_messages; Receive Maximum


def burst(addr, v, n, clean=True, store=None, expect_reconnects=False):
    """n QoS 2 messages published while the subscriber does not read, then read; returns the
    subscriber's session after checking that each arrived once, in order."""
    tag = "b%d-%d-%d" % (v, n, ticks_ms() % 100000)
    kw = {"session_expiry": 600} if v == 5 and not clean else {}
    sub = Client("sub-" + tag, server=addr[0], port=addr[1], version=v, clean=clean, store=store,
                 backoff_min=0.01, backoff_max=0.05, **kw)
    got = []
    peak = [0]
    connects = []

    def h(m):
        got.append(int(bytes(m.payload)))
        if sub.session.in2 > peak[0]:
            peak[0] = sub.session.in2

    sub.on_message = h
    sub.on_connect = lambda sp, r: connects.append(sp)
    sub.connect()
    assert sub.subscribe("burst/" + tag, 2) == [2]
    pub = client(addr, "pub-" + tag, version=v)
    for i in range(n):
        pub.publish("burst/" + tag, b"%d" % i, qos=2)
        pub.loop(0)
    pub.wait_all(30)  # the broker holds them all for the subscriber
    until([sub], lambda: len(got) >= n and not sub.session.in2, 60000, "%d messages (have %d)" % (n, len(got)))
    sub.loop(200)  # nothing more comes
    s = sub.session
    assert got == list(range(n)), (v, n, len(got), got[-3:], sub.last_error)
    if expect_reconnects:
        assert s.stats_deferred > 0 and len(connects) > 1 and all(connects[1:]), (connects, s.stats_deferred)
    else:
        assert connects == [False] and s.stats_deferred == 0 and sub.last_error is None, (connects, sub.last_error)
    pub.disconnect()
    sub.disconnect()
    return s, peak[0]


def test_a_burst_reaches_a_clean_session_once_each_in_order(broker_addr):
    for v in (4, 5):
        s, peak = burst(broker_addr, v, 400)
        assert peak > CAP, peak  # the ids awaiting PUBREL went over what the store holds


def test_a_burst_at_the_edge_of_the_store_s_ids(broker_addr):
    # Mosquitto releases its first window before it sends the rest: CAP + WINDOW messages leave
    # CAP ids awaiting PUBREL at the peak, one more leaves one over.
    for v in (4, 5):
        for n in (CAP + WINDOW[v], CAP + WINDOW[v] + 1):
            s, peak = burst(broker_addr, v, n)
            assert peak <= n - WINDOW[v] + 1, (v, n, peak)


def test_a_burst_reaches_a_persistent_session_on_a_memory_store_without_a_reconnect(broker_addr):
    # (its ids would not survive a reboot anyway: kept in RAM over the store's share)
    for v in (4, 5):
        burst(broker_addr, v, 400, clean=False)


def test_a_burst_on_a_flash_store(broker_addr):
    # A clean session keeps the ids over the cap in RAM (nothing durable is owed); a persistent one
    # defers them (a duplicate after a power cut otherwise) and reconnects for the broker's resends.
    for v in (4, 5):
        for clean in (True, False):
            st = FlashStore(NorFlash(None, blocks=16, block_size=4096), verbose=False)
            s, peak = burst(broker_addr, v, 300, clean=clean, store=st, expect_reconnects=not clean)
            assert clean or peak <= CAP, peak


def test_a_burst_reaches_an_asyncio_clean_session(broker_addr):
    from tern.aio import Client as AClient

    async def main(v):
        tag = "ab%d-%d" % (v, ticks_ms() % 100000)
        sub = AClient("sub-" + tag, broker_addr[0], broker_addr[1], version=v)
        pub = AClient("pub-" + tag, broker_addr[0], broker_addr[1], version=v)
        await sub.connect()
        await pub.connect()
        assert await sub.subscribe("burst/" + tag, 2) == [2]
        it = sub.messages()
        for i in range(400):
            await pub.publish("burst/" + tag, b"%d" % i, qos=2)
        await pub.wait_all(30)
        got = []
        for _ in range(400):
            m = await asyncio.wait_for(it.__anext__(), 10)
            got.append(int(bytes(m.payload)))
        assert got == list(range(400)), (v, len(got), sub.last_error)
        assert sub.session.stats_deferred == 0 and sub.last_error is None, sub.last_error
        await pub.disconnect()
        await sub.disconnect()

    for v in (4, 5):
        asyncio.run(main(v))
