"""A stand-in telemetry device for the collector's end-to-end test, run on the MicroPython unix port.

Publishes N pipeline-format payloads (see ternlab.pipeline.schema: {"d","b","s","q","t","r"}) with the
Tern client at one QoS on a persistent session, riding out broker or network trouble, and prints its
ledger: one ``LEDGER {...}`` line per message once publish() has accepted it (device, boot, seq, qos,
topic, sent_ts), then ``DONE {...}`` when the broker has acknowledged everything.

    micropython ledger_publisher.py HOST PORT DEVICE N [QOS] [INTERVAL_MS] [BOOT]

(tests/host/devices/collecting.py starts it; the telemetry app, firmware/app, is the real device.)
"""

import sys
import json
import time
from tern.client import Client

host, port, dev, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
qos = int(sys.argv[5]) if len(sys.argv) > 5 else 1
interval = int(sys.argv[6]) if len(sys.argv) > 6 else 0
boot = int(sys.argv[7]) if len(sys.argv) > 7 else 1
topic = "tern/%s/telemetry" % dev

c = Client(dev, server=host, port=port, version=5, clean=False, session_expiry=3600,
           backoff_min=0.1, backoff_max=1, window=8)
c.connect()
for seq in range(n):
    ts = time.time()
    payload = json.dumps({"d": dev, "b": boot, "s": seq, "q": qos, "t": ts,
                          "r": {"temp": 20 + seq % 7, "hum": 40.5}})
    c.publish(topic, payload, qos=qos)
    print("LEDGER " + json.dumps({"device": dev, "boot": boot, "seq": seq, "qos": qos,
                                  "topic": topic, "sent_ts": ts}))
    c.loop(interval)
c.wait_all(60)
print("DONE " + json.dumps({"device": dev, "published": n, "resent": c.session.stats_resent}))
c.disconnect()
