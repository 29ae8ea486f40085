# The library under MicroPython for `make interop`: subscribe at QoS 2, publish QoS 0, 1, 2, and print
# "ok ..." when each arrives once at its QoS (else what happened).
# micropython mp_roundtrip.py PORT VERSION USER TOPIC (MICROPYPATH=lib)
import sys
from tern.client import Client, ticks_ms, ticks_diff

port, v, user, base = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] or None, sys.argv[4]
got = []
c = Client("mp" + base[-8:], "127.0.0.1", port, version=v, username=user, password=b"x" if user else None,
           reconnect=False, connect_timeout=5)
try:
    c.connect()
    c.subscribe(base + "/#", 2, handler=lambda m: got.append((bytes(m.payload), m.qos)), timeout=5)
    for q in (0, 1, 2):
        pid = c.publish(base + "/%d" % q, b"q%d" % q, qos=q)
        if q:
            c.wait_published(pid, 5)
    start = ticks_ms()
    while len(got) < 3 and ticks_diff(ticks_ms(), start) < 5000 and c.connected:
        c.loop(20)
    c.loop(300)
    got.sort()
    if got == [(b"q0", 0), (b"q1", 1), (b"q2", 2)]:
        print("ok QoS 0/1/2 each once at its QoS")
    else:
        print("received (payload, QoS) %s; last error: %s" % (got, c.last_error))
except Exception as e:
    print("%s: %s" % (type(e).__name__, e))
