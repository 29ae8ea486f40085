"""A minimal device for the interim demo: publishes N numbered QoS 1 messages
through the Tern client on the MicroPython unix port, riding out broker
restarts, and prints one JSON status line per event for the host to read."""

import sys
import json
from tern.client import Client

host, port, n, cid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]


def say(**kw):
    print("TERN " + json.dumps(kw))


c = Client(cid, server=host, port=port, version=5, clean=False, session_expiry=3600,
           backoff_min=0.1, backoff_max=1, window=8)
c.on_disconnect = lambda e: say(ev="disconnected", err=str(e))
c.on_connect = lambda sp, rc: say(ev="connected", session_present=sp)
c.connect()
for seq in range(n):
    c.publish("demo/%s" % cid, b"%d" % seq, qos=1)
    c.loop(2)
    if seq % 50 == 0:
        say(ev="progress", seq=seq, pending=len(c.session.pending()))
c.wait_all(60)
say(ev="done", published=n, resent=c.session.stats_resent)
c.disconnect()
