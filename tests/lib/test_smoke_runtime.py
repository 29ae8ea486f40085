"""The dual-runtime machinery itself: each runtime really is the one it claims."""

import sys
from check import MICROPYTHON


def test_runtime_is_real(runtime):
    assert (sys.implementation.name == "micropython") == (runtime == "micropython"), sys.implementation.name
    assert MICROPYTHON == (runtime == "micropython")


def test_fixture_values_reach_both(broker_addr):
    host, port = broker_addr
    assert host == "127.0.0.1" and 0 < port < 65536
