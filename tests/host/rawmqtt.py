"""A raw MQTT client over a socket for harness tests: Tern's codec frames
and decodes; every read is bounded by a timeout."""

import socket
import time

from tern.codec import Packet, decode, encode, frame_size
from tern.wire import CONNACK, CONNECT, PINGREQ, PINGRESP

TIMEOUT = 5.0


class Raw:
    """A raw MQTT 3.1.1 client."""

    def __init__(self, addr, timeout=TIMEOUT):
        self.sock = socket.create_connection(addr, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def send(self, *packets):
        self.sock.sendall(b"".join(encode(p) for p in packets))

    def recv(self, timeout=TIMEOUT):
        """The next packet; socket.timeout if none within timeout, EOFError if closed."""
        deadline = time.monotonic() + timeout
        while True:
            n = frame_size(self.buf, 0, len(self.buf), 1 << 28)
            if 0 < n <= len(self.buf):
                frame = bytes(self.buf[:n])
                del self.buf[:n]
                return decode(frame)
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("no packet within %.1f s" % timeout)
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                raise EOFError("connection closed")
            self.buf += data

    def recv_all(self, timeout=TIMEOUT):
        """Every byte until the peer closes (socket.timeout if it does not)."""
        out = bytearray(self.buf)
        self.buf.clear()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("connection still open after %.1f s" % timeout)
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return bytes(out)
            if not data:
                return bytes(out)
            out += data

    def connect(self, client_id="", expect=0, **kw):
        """CONNECT and its CONNACK; expect: the reason code it must carry (None: any)."""
        self.send(Packet(CONNECT, client_id=client_id, **kw))
        p = self.recv()
        assert p.type == CONNACK, p
        assert expect is None or p.reason == expect, p
        return p

    def ping(self, timeout=TIMEOUT):
        t0 = time.monotonic()
        self.send(Packet(PINGREQ))
        assert self.recv(timeout).type == PINGRESP
        return time.monotonic() - t0

    def close(self):
        self.sock.close()
