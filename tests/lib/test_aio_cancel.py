"""tern.aio: a publish() cancelled after its message was stored (issue 25, defect 7).

Once publish() has stored a QoS 1/2 message it is accepted: it will be sent,
and resent after reconnects, until the broker acknowledges it. A cancellation
that comes after that (asyncio.wait_for giving up on a slow link, or on the
acknowledgement with wait_ack=True) must not raise as if it had not been
accepted: publish() returns the id. The caller that publishes again on an
exception would otherwise send the message twice, QoS 2 included.
"""

import asyncio

from check import MICROPYTHON
from tern.aio import Client
from tern.codec import Packet, encode
from tern.wire import CONNACK, CONNECT, DISCONNECT, PUBACK, PUBCOMP, PUBLISH, PUBREC, PUBREL


def E(t, **kw):
    return encode(Packet(t, **kw), 4)


SCRIPTS = {
    "test_a_publish_cancelled_after_it_was_stored_returns_its_id": ([
        [("recv_type", CONNECT), ("send", E(CONNACK)),
         # the broker takes its time: no acknowledgement until the second message is in
         ("recv", E(PUBLISH, topic="t", payload=b"x", qos=2, pid=1)),
         ("recv", E(PUBLISH, topic="t", payload=b"y", qos=1, pid=2)), ("stall", 0.6),
         ("send", E(PUBREC, pid=1)), ("recv", E(PUBREL, pid=1)), ("send", E(PUBCOMP, pid=1)),
         ("send", E(PUBACK, pid=2)),
         ("recv", E(DISCONNECT))],
    ], 4),
}


def test_a_publish_cancelled_after_it_was_stored_returns_its_id(scripted_addr):
    async def main():
        c = Client("scripted", scripted_addr[0], scripted_addr[1], reconnect=False)
        await c.connect()
        # The task that published is cancelled while it waits for the acknowledgement.
        t = asyncio.create_task(c.publish("t", b"x", qos=2, wait_ack=True))
        await asyncio.sleep(0.2)
        assert c.session.is_pending(1)
        t.cancel()
        pid = await t
        assert pid == 1 and c.session.is_pending(1), pid
        # asyncio.wait_for gives up on it.
        try:
            pid = await asyncio.wait_for(c.publish("t", b"y", qos=1, wait_ack=True), 0.2)
            got = "returned %r" % (pid,)
        except asyncio.TimeoutError:
            got = "TimeoutError"
        # CPython's wait_for hands over what the cancelled call returned; MicroPython's raises
        # TimeoutError whatever it returned (README: "Cancelling publish()").
        assert got == ("TimeoutError" if MICROPYTHON else "returned 2"), got
        assert c.session.is_pending(2)
        await c.wait_all(5)  # both accepted: sent once each, acknowledged
        assert c._waiters == {} and c._results == {}, (c._waiters, c._results)
        await c.disconnect()

    asyncio.run(main())
