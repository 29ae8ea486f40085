"""Fixtures shared by every suite: a real Mosquitto on a free loopback port."""

import pytest

from ternlab.broker import Broker


@pytest.fixture
def broker(tmp_path):
    """A fresh Mosquitto for this test (no persistence); its log is kept in tmp_path."""
    b = Broker(tmp_path / "broker").start()
    yield b
    b.stop()


@pytest.fixture
def broker_addr(broker):
    """The broker's address as JSON-friendly values, for tests that also run under MicroPython."""
    return [broker.host, broker.port]


@pytest.fixture
def chaos(broker):
    """An MQTT-aware chaos proxy in front of the test's broker."""
    from ternlab.chaos import ChaosProxy

    with ChaosProxy(broker.address, seed=1) as proxy:
        yield proxy
