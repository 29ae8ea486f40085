# The library under MicroPython for `make interop`: connect with a will and disconnect cleanly, three times
# with the blocking client and three with tern.aio (will topics TOPIC/0 .. TOPIC/5); the host watches for
# wills that should not come. Prints "ok ..." when every disconnect returned, else what happened.
# micropython mp_will.py PORT VERSION USER TOPIC (MICROPYPATH=.frozen:lib)
import sys
import asyncio
from tern.client import Client
from tern import aio

port, v, user, base = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] or None, sys.argv[4]


def kw(i):
    return dict(version=v, username=user, password=b"x" if user else None, reconnect=False,
                will_topic="%s/%d" % (base, i), will_payload=b"gone", will_qos=1)


async def aio_stop(i):
    c = aio.Client("mpw%d" % i + base[-8:], "127.0.0.1", port, **kw(i))
    await c.connect()
    await c.disconnect(linger_ms=1000)


try:
    for i in range(3):
        c = Client("mpw%d" % i + base[-8:], "127.0.0.1", port, connect_timeout=5, **kw(i))
        c.connect()
        c.disconnect(linger_ms=1000)
    for i in range(3, 6):
        asyncio.run(aio_stop(i))
    print("ok 3 blocking + 3 asyncio clean disconnects")
except Exception as e:
    print("%s: %s" % (type(e).__name__, e))
