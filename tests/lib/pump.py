"""Driving several blocking clients from one test, on either runtime."""

from tern.client import Client, ticks_ms, ticks_diff

_n = [0]


def client(addr, name, **kw):
    """A connected client with a unique id (tests share one broker per test)."""
    _n[0] += 1
    c = Client("%s-%d-%d" % (name, ticks_ms() % 100000, _n[0]), server=addr[0], port=addr[1], **kw)
    c.connect()
    return c


def until(clients, cond, timeout_ms=10000, what="condition"):
    """Run every client's loop until cond() holds; fail with `what` otherwise."""
    start = ticks_ms()
    while not cond():
        if ticks_diff(ticks_ms(), start) > timeout_ms:
            raise AssertionError("timed out waiting for " + what)
        for c in clients:
            c.loop(5)


def collect(into):
    """A handler that keeps (topic, payload, qos, retain) of every message."""

    def h(m):
        into.append((m.topic, bytes(m.payload), m.qos, m.retain))

    return h
