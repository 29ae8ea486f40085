"""Helpers for library tests that run under CPython and the MicroPython unix
port alike (no pytest here: MicroPython runs these files too)."""

import sys

MICROPYTHON = sys.implementation.name == "micropython"


def raises(exc, f, *args, **kw):
    """Call f and return the exception of type exc it raised; fail otherwise."""
    try:
        f(*args, **kw)
    except exc as e:
        return e
    raise AssertionError("%s was not raised" % exc.__name__)


def allocated(f, *args):
    """Bytes the heap grew by during one call of f(*args), after a warm-up call.

    MicroPython: gc.mem_alloc() with the collector off, so every allocation
    counts. CPython: tracemalloc's peak for the call (an upper bound used to
    show nothing is sized by the data).
    """
    f(*args)
    if MICROPYTHON:
        import gc

        gc.collect()
        gc.disable()
        try:
            a = gc.mem_alloc()
            f(*args)
            return gc.mem_alloc() - a
        finally:
            gc.enable()
    import tracemalloc

    tracemalloc.start()
    try:
        f(*args)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def allocated_least(f, *args):
    """allocated() for a call without side effects, the least of three: CPython's tracemalloc
    counts every thread of the process, and a thread an earlier test left running (a broker's
    reader, a proxy) can allocate inside the window; the call's own figure is the same each time."""
    return min(allocated(f, *args) for _ in range(3))


def read_all(store, pid):
    """A stored record's whole packet, checked to be as long as the store says."""
    n = store.size(pid)
    buf = bytearray(n)
    assert store.read(pid, 0, buf) == n
    return bytes(buf)


class Rng:
    """xorshift32: the same sequence on both runtimes for seeded fuzzing."""

    def __init__(self, seed):
        self.s = (seed & 0xFFFFFFFF) or 1

    def next(self):
        s = self.s
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        self.s = s
        return s

    def below(self, n):
        return self.next() % n

    def bytes(self, n):
        b = bytearray(n)
        for i in range(n):
            b[i] = self.next() & 0xFF
        return b
