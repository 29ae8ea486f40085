"""A broker for one connection that answers just enough to keep a client
going (CONNACK, SUBACK, PUBACK, PUBREC, PUBCOMP, PINGRESP), delays its TCP
ACKs as a broker with nothing to send back does (TCP_QUICKACK off, re-armed
after every read), and records each read: what a test needs to see how a
client's packets leave (tests/lib/test_send_path.py). `check()` then asserts
that every read ended on a packet boundary and that the PUBLISH to `pair/b`
sent right after one to `pair/a` arrived with it, not an ACK timeout later.
"""

from __future__ import annotations

import socket
import threading
import time

from tern import pkt
from tern.codec import Packet, encode
from tern.wire import CONNACK, PUBACK, PUBCOMP, PUBREC, SUBACK


class RecordingBroker:
    """Plays a broker for one connection (CONNACK, SUBACK, PUBACK, PUBREC,
    PUBCOMP, PINGRESP), delays its TCP ACKs, and records every read."""

    host = "127.0.0.1"

    def __init__(self):
        self.lis = socket.socket()
        self.lis.bind((self.host, 0))
        self.port = self.lis.getsockname()[1]
        self.lis.listen(1)
        self.lis.settimeout(30)
        self.reads = []  # (time, bytes) of each recv
        self.error = None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        try:
            c, _ = self.lis.accept()
        except OSError as e:
            self.error = "no connection: %s" % e
            return
        c.settimeout(30)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        version = 4
        try:
            while True:
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)  # re-armed after each read
                d = c.recv(65536)
                if not d:
                    return
                self.reads.append((time.perf_counter(), d))
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)
                buf += d
                while True:
                    n = pkt.frame_size(buf, 0, len(buf), 1 << 28)
                    if n < 0 or n > len(buf):
                        break
                    p = bytes(buf[:n])
                    del buf[:n]
                    t = p[0] >> 4
                    if t == 1:
                        version = p[8] if p[8] in (4, 5) else 3
                        out = encode(Packet(CONNACK), version)
                    elif t == 3 and p[0] & 6:
                        q = p[0] >> 1 & 3
                        tl = p[2 + (n > 129)] << 8 | p[3 + (n > 129)]
                        at = 4 + (n > 129) + tl
                        out = encode(Packet(PUBACK if q == 1 else PUBREC, pid=p[at] << 8 | p[at + 1]), version)
                    elif t == 6:
                        out = encode(Packet(PUBCOMP, pid=p[2] << 8 | p[3]), version)
                    elif t == 8:
                        out = encode(Packet(SUBACK, pid=p[2] << 8 | p[3], reasons=[1]), version)
                    elif t == 12:
                        out = b"\xd0\x00"
                    else:
                        continue
                    c.sendall(out)
        except OSError as e:
            self.error = "broker side: %s" % e
        finally:
            c.close()

    def check(self):
        self.thread.join(30)
        self.lis.close()
        assert self.error is None, self.error
        assert self.reads, "nothing was read"
        # 1. every read ends on a packet boundary: no packet arrived in pieces
        stream = bytearray()
        ends = []
        for t, d in self.reads:
            stream += d
            ends.append((t, len(stream)))
        bounds = {}
        pos = 0
        pairs = []  # arrival of each pair/a and the pair/b after it
        while pos < len(stream):
            n = pkt.frame_size(stream, pos, len(stream), 1 << 28)
            assert n > 0 and pos + n <= len(stream), "the stream ends inside a packet"
            when = next(t for t, e in ends if e >= pos + n)
            if stream[pos] >> 4 == 3 and b"pair/" in stream[pos : pos + 12]:
                pairs.append((when, stream[pos : pos + n].find(b"pair/b") >= 0))
            pos += n
            bounds[pos] = True
        cut = [e for t, e in ends if e not in bounds]
        assert not cut, "reads ended inside a packet at stream offsets %s" % cut[:5]
        # 2. the second of two back-to-back messages does not wait for an ACK (~40 ms)
        gaps = sorted((b[0] - a[0]) * 1000 for a, b in zip(pairs, pairs[1:]) if not a[1] and b[1])
        assert len(gaps) >= 5, pairs
        assert gaps[len(gaps) // 2] < 20, "pair/b arrived %s ms after pair/a (Nagle's algorithm on?)" % (
            ["%.1f" % g for g in gaps])
