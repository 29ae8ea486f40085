"""An app that starts while its broker is away (issue 38): connect() with a durable store (or
retry=True) returns None instead of raising, publish() stores QoS 1/2 messages, and loop() (the
asyncio client: its supervisor) dials on with the reconnect policy until the broker is there; a
permanent refusal still raises at once. Each test runs under CPython and the MicroPython unix port
against a real Mosquitto started by the `late_broker` fixture after the test began (tests/lib/conftest.py),
which also holds the observer's session that sees what arrived, in the broker's order."""

import asyncio

from check import raises
from storekit import tmppath, rmtree
from tern.client import Client, ConnectError, ticks_ms, ticks_diff
from tern.filestore import FileStore
from tern.session import NotConnected

MP_TIMEOUT = 120
# late_broker's times per test (ms from the start: up at, down at, up at ...)
LATE = {"test_a_broker_away_at_power_on_and_one_lost_later_get_the_same_backoff_and_callbacks": [1500, 4500, 7000]}


def received(late, n, timeout_ms=10000):
    """The payloads the observer's session holds, once n arrived (as ints, in arrival order)."""
    got = []
    obs = Client(late["observer"], server=late["host"], port=late["port"], clean=False)
    obs.on_message = lambda m: got.append(int(bytes(m.payload)))
    obs.connect()
    start = ticks_ms()
    while len(got) < n and ticks_diff(ticks_ms(), start) < timeout_ms:
        obs.loop(50)
    obs.loop(200)  # nothing more comes
    obs.disconnect()
    return got


def until(c, cond, what, timeout_ms=15000, publish=None):
    start = ticks_ms()
    while not cond():
        if ticks_diff(ticks_ms(), start) > timeout_ms:
            raise AssertionError("timed out waiting for " + what + ": last_error %r" % (c.last_error,))
        if publish:
            publish()
        c.loop(100)


def test_a_client_with_a_file_outbox_starts_without_its_broker_and_delivers_in_order(late_broker):
    path = tmppath("offline")
    c = Client("dev-file", server=late_broker["host"], port=late_broker["port"], clean=False,
               store=FileStore(path), backoff_min=0.2, backoff_max=1, connect_timeout=2)
    ups = []
    c.on_connect = lambda sp, rc: ups.append(rc)
    t = ticks_ms()
    assert c.connect() is None  # the broker is away: connection refused
    assert ticks_diff(ticks_ms(), t) < 1000 and not c.connected and not ups
    assert isinstance(c.last_error, OSError) and not isinstance(c.last_error, ConnectError), c.last_error
    raises(NotConnected, c.publish, "late/x", b"0", qos=0)  # QoS 0 has no outbox: refused, not stored
    n = [0]

    def publish():
        n[0] += 1
        c.publish("late/x", b"%d" % n[0], qos=1)  # stored (on disk) while offline, sent once connected

    until(c, lambda: c.connected, "the first connection", publish=publish)
    offline = n[0]
    for _ in range(5):
        publish()
        c.loop(50)
    c.wait_all(10)
    c.disconnect()
    assert ups == [0] and offline >= 3, (ups, offline)
    assert received(late_broker, n[0]) == list(range(1, n[0] + 1))
    rmtree(path)


def test_a_memory_store_raises_unless_asked_to_retry_and_a_file_outbox_can_be_told_not_to(late_broker):
    host, port = late_broker["host"], late_broker["port"]
    path = tmppath("offline-noretry")
    f = Client("dev-file", server=host, port=port, store=FileStore(path))
    raises(OSError, f.connect, None, False)  # retry=False: the old contract, an error at once
    f.close()
    m = Client("dev-mem", server=host, port=port, clean=False, backoff_min=0.2, backoff_max=1)
    raises(OSError, m.connect)  # RAM only: the default is to raise, as before
    m2 = Client("dev-mem", server=host, port=port, clean=False, backoff_min=0.2, backoff_max=1)
    assert m2.connect(retry=True) is None
    for i in range(1, 4):
        m2.publish("late/m", b"%d" % i, qos=1)  # in RAM until the broker is there
    until(m2, lambda: m2.connected, "the retried connection")
    m2.wait_all(10)
    m2.disconnect()
    assert received(late_broker, 3) == [1, 2, 3]
    rmtree(path)


def test_a_permanent_refusal_still_raises_at_once_with_a_durable_store(scripted_addr):
    path = tmppath("offline-refused")
    c = Client("dev", server=scripted_addr[0], port=scripted_addr[1], store=FileStore(path), backoff_min=0.05)
    e = raises(ConnectError, c.connect)
    assert e.reason == 5 and e.permanent, e.reason  # not authorized (3.1.1): credentials
    assert not c.loop(300)  # and nothing dials on
    c.close()
    # a refusal retrying can fix (server unavailable) is retried like an unreachable broker
    c = Client("dev", server=scripted_addr[0], port=scripted_addr[1], store=FileStore(path), backoff_min=0.05,
               backoff_max=0.1)
    assert c.connect() is None and c.last_error.reason == 3 and not c.last_error.permanent
    until(c, lambda: c.connected, "the connection after 'server unavailable'", 5000)
    c.disconnect()
    rmtree(path)


def test_a_broker_that_sends_no_connack_in_time_is_retried_like_an_unreachable_one(scripted_addr):
    # the first connection is accepted and never answered (a broker still starting, a black hole)
    path = tmppath("offline-mute")
    c = Client("dev", server=scripted_addr[0], port=scripted_addr[1], store=FileStore(path), connect_timeout=1,
               backoff_min=0.05, backoff_max=0.1)
    t = ticks_ms()
    assert c.connect() is None and "no CONNACK" in str(c.last_error), c.last_error
    assert 900 <= ticks_diff(ticks_ms(), t) < 3000
    pid = c.publish("late/t", b"kept", qos=1)
    until(c, lambda: not c.session.is_pending(pid), "the message, after the second connection's CONNACK", 5000)
    c.disconnect()
    rmtree(path)


SCRIPTS = {
    "test_a_broker_that_sends_no_connack_in_time_is_retried_like_an_unreachable_one": ([
        [("recv_type", 1), ("eof",)],  # open and silent until the client gives up on it
        [("recv_type", 1), ("send", b"\x20\x02\x00\x00"), ("recv", b"\x32\x0e\x00\x06late/t\x00\x01kept"),
         ("send", b"\x40\x02\x00\x01"), ("recv_type", 14)],
    ], 4),
    "test_a_permanent_refusal_still_raises_at_once_with_a_durable_store": ([
        [("recv_type", 1), ("send", b"\x20\x02\x00\x05"), ("close",)],
        [("recv_type", 1), ("send", b"\x20\x02\x00\x03"), ("close",)],
        [("recv_type", 1), ("send", b"\x20\x02\x00\x00"), ("recv_type", 14)],
    ], 4),
    "test_aio_a_permanent_refusal_still_raises_at_once_with_a_durable_store": ([
        [("recv_type", 1), ("send", b"\x20\x02\x00\x05"), ("close",)],
    ], 4),
}


class Dialer(Client):
    """Records each connection attempt (loop() dials through connect(), as the first call does)."""

    tries = None

    def connect(self, timeout=None, retry=None):
        self.tries.append(ticks_ms())
        return Client.connect(self, timeout, retry)


def test_a_broker_away_at_power_on_and_one_lost_later_get_the_same_backoff_and_callbacks(late_broker):
    # Mosquitto: up 1.5 s after the start, down at 4.5 s, up again at 7 s. The same rule spaces the
    # attempts of both outages (backoff_min doubling, 50-100 % jitter, at most backoff_max; healthy_after
    # is not reached, so the loss does not earn an immediate retry), and the app hears the same callbacks:
    # on_connect for each connection, on_disconnect only for the connection that was lost.
    path = tmppath("offline-same")
    c = Dialer("dev-same", server=late_broker["host"], port=late_broker["port"], clean=False, store=FileStore(path),
               backoff_min=0.1, backoff_max=0.4, healthy_after=60, connect_timeout=2)
    c.tries = []
    ups, downs = [], []
    c.on_connect = lambda sp, rc: ups.append(ticks_ms())
    c.on_disconnect = lambda e: downs.append(ticks_ms())
    t0 = ticks_ms()
    assert c.connect() is None
    n = [0]

    def publish():
        if ticks_diff(ticks_ms(), t0) < 9000 or c.session.pending():
            n[0] += 1
            c.publish("late/s", b"%d" % n[0], qos=1)

    until(c, lambda: len(ups) == 2 and not c.session.pending(), "two connections", 20000, publish)
    c.disconnect()
    assert len(downs) == 1 and ups[0] < downs[0] < ups[1], (ups, downs)
    first = [t for t in c.tries if t < ups[0]]
    second = [t for t in c.tries if downs[0] < t <= ups[1]]
    assert len(first) >= 4 and len(second) >= 4, (first, second)
    for tries in (first, second):
        gaps = [ticks_diff(b, a) for a, b in zip(tries, tries[1:])]
        assert all(40 <= g <= 550 for g in gaps), gaps  # 0.5 x 0.1 s .. 0.4 s, and the time an attempt takes
    assert received(late_broker, n[0]) == list(range(1, n[0] + 1))
    rmtree(path)


# -- tern.aio -----------------------------------------------------------------------
def test_aio_client_with_a_file_outbox_starts_without_its_broker_and_delivers_in_order(late_broker):
    from tern.aio import Client as AClient

    path = tmppath("offline-aio")

    async def main():
        c = AClient("dev-aio", late_broker["host"], late_broker["port"], clean=False, store=FileStore(path),
                    backoff_min=0.2, backoff_max=1, connect_timeout=2)
        ups = []
        c.on_connect = lambda sp, rc: ups.append(rc)
        assert await c.connect() is None
        assert not c.connected and isinstance(c.last_error, OSError)
        try:
            await c.publish("late/a", b"0", qos=0)
            raise AssertionError("QoS 0 offline was accepted")
        except NotConnected:
            pass
        n = 0
        start = ticks_ms()
        while not c.connected:
            assert ticks_diff(ticks_ms(), start) < 15000, "no connection: %r" % (c.last_error,)
            n += 1
            await c.publish("late/a", b"%d" % n, qos=1)
            await asyncio.sleep(0.1)
        offline = n
        for _ in range(5):
            n += 1
            await c.publish("late/a", b"%d" % n, qos=1)
        await c.wait_all(10)
        await c.disconnect()
        assert ups == [0] and offline >= 3, (ups, offline)
        return n

    n = asyncio.run(main())
    assert received(late_broker, n) == list(range(1, n + 1))
    rmtree(path)


def test_aio_a_memory_store_raises_unless_asked_to_retry(late_broker):
    from tern.aio import Client as AClient

    async def main():
        c = AClient("dev-aio-mem", late_broker["host"], late_broker["port"], backoff_min=0.2, backoff_max=1)
        try:
            await c.connect()
            raise AssertionError("connect() returned with the broker away")
        except OSError:
            pass
        assert await c.connect(retry=True) is None
        await c.publish("late/b", b"1", qos=1)
        start = ticks_ms()
        while not c.connected:
            assert ticks_diff(ticks_ms(), start) < 15000, "no connection: %r" % (c.last_error,)
            await asyncio.sleep(0.05)
        await c.wait_all(10)
        await c.disconnect()

    asyncio.run(main())
    assert received(late_broker, 1) == [1]


def test_aio_a_permanent_refusal_still_raises_at_once_with_a_durable_store(scripted_addr):
    from tern.aio import Client as AClient

    path = tmppath("offline-aio-refused")

    async def main():
        c = AClient("dev", scripted_addr[0], scripted_addr[1], store=FileStore(path), backoff_min=0.05)
        try:
            await c.connect()
            raise AssertionError("a refused CONNECT returned")
        except ConnectError as e:
            assert e.reason == 5 and e.permanent, e.reason
        await asyncio.sleep(0.3)
        assert not c.connected
        c.close()

    asyncio.run(main())
    rmtree(path)
