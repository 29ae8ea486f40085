"""The reconnect backoff is one policy with one set of defaults, in the library (issue 39):
tern.client.backoff_ms and BACKOFF_MIN_MS / BACKOFF_MAX_MS, which both drivers' defaults take (the
telemetry app's config and its Wi-Fi reconnect take them too: firmware/app). Runs on CPython and
MicroPython."""

import tern.aio
import tern.client
from tern.client import BACKOFF_MAX_MS, BACKOFF_MIN_MS, backoff_ms


def test_backoff_doubles_to_its_cap_with_jitter():
    for lo, hi in ((BACKOFF_MIN_MS, BACKOFF_MAX_MS), (100, 2000), (1000, 1000)):
        for n in range(1, 24):
            d = lo * 2 ** (n - 1)
            d = d if d < hi else hi
            for _ in range(20):
                w = backoff_ms(n, lo, hi)
                assert d // 2 <= w <= d, (lo, hi, n, w)


def test_both_drivers_take_the_librarys_defaults():
    for cls in (tern.client.Client, tern.aio.Client):
        c = cls("b", reconnect=False)
        assert (c.backoff_min * 1000, c.backoff_max * 1000) == (BACKOFF_MIN_MS, BACKOFF_MAX_MS), cls
        c._attempt = 3
        assert BACKOFF_MIN_MS * 2 <= c._backoff_ms(OSError(1)) <= BACKOFF_MIN_MS * 4
