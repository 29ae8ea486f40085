"""Spellings people bring from umqtt, mqtt_as and paho (issue 16). umqtt's publish(topic, msg, True)
means retain; a positional third argument to Tern's publish() would be QoS 1, silently: qos and
retain are keyword-only on both drivers, so the umqtt call fails at once and stores nothing.
umqtt's and mqtt_as's `user=` is accepted as `username=`. Runs on CPython and MicroPython."""

from tern.codec import Packet, encode
from tern.client import Client
from tern.wire import CONNECT, CONNACK, DISCONNECT
from check import raises

def first_byte(c, pid):
    """The stored PUBLISH's fixed header byte: 0x30 | QoS << 1 | retain."""
    b = bytearray(1)
    c.session.store.read(pid, 0, b)
    return b[0]


SCRIPTS = {
    "test_user_is_the_umqtt_spelling_of_username": ([[
        ("recv", encode(Packet(CONNECT, version=4, clean=True, keepalive=60, client_id="spell",
                               username="alice", password=b"pw"), 4)),
        ("send", encode(Packet(CONNACK), 4)), ("recv", encode(Packet(DISCONNECT), 4))]], 4),
}


def test_qos_and_retain_are_keyword_only_in_the_blocking_client():
    c = Client("spell", version=5)  # offline: QoS 1/2 would be stored
    for args in ((1,), (True,), (0, True), (1, True)):
        e = raises(TypeError, c.publish, "t", b"x", *args)
        assert "qos and retain as keywords" in str(e) and "retain=True" in str(e), str(e)
    assert not c.session.pending()  # nothing stored by the refused calls
    assert c.publish("t", b"x", qos=1, retain=True) == 1
    assert c.session.pending() == [1] and first_byte(c, 1) == 0x30 | 1 << 1 | 1


def test_qos_and_retain_are_keyword_only_in_the_asyncio_client():
    import asyncio
    from tern.aio import Client as AClient

    async def main():
        c = AClient("spell", version=5)
        for args in ((1,), (0, True)):
            e = raises(TypeError, c.publish, "t", b"x", *args)  # at the call, not at the await
            assert "qos and retain as keywords" in str(e), str(e)
        assert not c.session.pending()
        assert await c.publish("t", b"x", qos=2, retain=True) == 1
        assert c.session.pending() == [1] and first_byte(c, 1) == 0x30 | 2 << 1 | 1

    asyncio.run(main())


def test_user_is_the_umqtt_spelling_of_username(scripted_addr):
    c = Client("spell", server=scripted_addr[0], port=scripted_addr[1], user="alice", password=b"pw")
    c.connect()
    c.disconnect()
