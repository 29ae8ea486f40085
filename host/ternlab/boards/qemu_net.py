"""The qemu boards' network, host side: the far end of the board's `socket` module
(firmware/qemu-firmware/cmodules/qboard/net.c) over its network UART, which QEMU exposes as a loopback
TCP server. The board asks, this bridge does: resolve a name, dial an address, pass bytes both ways,
close. Only the host's loopback is dialled (127.0.0.0/8): any other address is refused, with an
OSError on the board that says so, and a line in the board's console log.

Frames (net.c has the list): type, channel, 16-bit little-endian length, payload. Flow control: at
most RX_WINDOW bytes a socket's app has not read are sent to the board (its 'W' frames give them
back); what the board sends is passed on as the far end takes it, and given back to the board ('W')
once in the kernel's hands, so a far end that stops reading stops the board's writes, not this
thread. A board that loses power (QEMU ends) leaves its connections open and silent, as a board
that vanished does: the broker learns it from its keepalive, or when the same client id connects
again; they are closed when their far end closes them or when the board is closed. A soft reboot
('Z') closes them, as MicroPython closes its sockets then.
"""

import errno
import ipaddress
import os
import select
import socket
import struct

from .relay import BridgeLoop

RX_WINDOW = 2048  # net.c's RX_CAP
CHUNK = 1024  # net.c's FRAME_MAX
DIAL_TIMEOUT = 5.0
# The host end's send buffer: a board's TCP stack holds a few KB (lwIP's TCP_SND_BUF is 5,744 bytes on
# an ESP32), not the megabytes Linux grows to, so a far end that stops reading stops the board soon.
SNDBUF = 8192


class _Conn:
    def __init__(self, sock):
        self.sock = sock
        self.credit = RX_WINDOW  # bytes the board can still take
        self.out = bytearray()  # from the board, not yet taken by the far end
        self.eof = False  # the far end closed (told to the board)


def _resolve(name):
    """The IPv4 address of a name (the host's resolver), or raise OSError with why."""
    try:
        return str(ipaddress.IPv4Address(name))
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (OSError, UnicodeError) as e:
        raise OSError(-2, "%r does not resolve on the host (%s)" % (name, e)) from None


class NetBridge(BridgeLoop):
    """One board's network: QEMU's network UART on one side, the connections it asked for on the other."""

    what = "net bridge"

    def __init__(self, board):
        super().__init__("qemunet-%s" % board.id, board.log)
        self.qport = None
        self.q = None
        self.inbuf = bytearray()
        self.conns = {}  # channel -> _Conn
        self.orphans = []  # sockets of a boot that lost power: open and silent
        self.dials = 0

    def reset(self, qport):
        """QEMU (re)started with its network UART on qport: the last boot's connections are orphaned."""
        with self.lock:
            self._close_q()
            self.qport = qport
        self.wake()

    def _close_q(self):
        if self.q is not None:
            self.q.close()
            self.q = None
        self.inbuf.clear()
        self.orphans += [c.sock for c in self.conns.values()]
        self.conns.clear()

    # -- the loop ---------------------------------------------------------------------
    def _step(self):
        with self.lock:
            if self.q is None and self.qport is not None:
                try:
                    self.q = socket.create_connection(("127.0.0.1", self.qport), timeout=1)
                    self.q.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self.q.settimeout(None)  # QEMU takes the bytes at the board's pace
                except OSError:
                    self.q = None
            rl = [self.wake_r] + ([self.q] if self.q is not None else []) + list(self.orphans)
            rl += [c.sock for c in self.conns.values() if c.credit and not c.eof]
            wl = [c.sock for c in self.conns.values() if c.out]
        r, w, _ = select.select(rl, wl, [], 0.1 if self.q is None else 0.5)
        if self.wake_r in r:
            os.read(self.wake_r, 4096)
        with self.lock:
            if self.q is not None and self.q in r:
                try:
                    data = self.q.recv(65536)
                except OSError:
                    data = b""
                if not data:  # QEMU ended: the board lost power
                    self._close_q()
                    self.qport = None
                    return
                self.inbuf += data
                self._frames()
            for s in w:
                self._flush(s)
            for ch, c in list(self.conns.items()):
                if c.sock in r:
                    self._from_far(ch, c)
            for s in [s for s in self.orphans if s in r]:
                try:
                    gone = not s.recv(65536)
                except OSError:
                    gone = True
                if gone:
                    s.close()
                    self.orphans.remove(s)

    # -- from the board -----------------------------------------------------------------
    def _frames(self):
        buf = self.inbuf
        while len(buf) >= 4:
            kind, ch, n = buf[0], buf[1], buf[2] | buf[3] << 8
            if len(buf) < 4 + n:
                return
            payload = bytes(buf[4:4 + n])
            del buf[:4 + n]
            handler = {ord("R"): self._resolve, ord("O"): self._open, ord("D"): self._data, ord("C"): self._close,
                       ord("W"): self._window, ord("Z"): self._rebooted}.get(kind)
            if handler is None:
                self.log.event("net: unknown frame %r from the board" % chr(kind))
                continue
            handler(ch, payload)

    def _send(self, kind, ch, payload=b""):
        if self.q is not None:
            try:
                self.q.sendall(struct.pack("<BBH", ord(kind), ch, len(payload)) + payload)
            except OSError:
                pass

    def _resolve(self, ch, payload):
        name = payload.decode(errors="replace")
        try:
            self._send("r", ch, b"\x00" + socket.inet_aton(_resolve(name)))
        except OSError as e:
            self._send("r", ch, b"\x01" + e.strerror.encode()[:120])

    def _open(self, ch, payload):
        self._drop(ch)
        port = payload[0] << 8 | payload[1]
        name = payload[2:].decode(errors="replace")
        try:
            ip = _resolve(name)
            if not ipaddress.IPv4Address(ip).is_loopback:
                raise OSError(errno.EHOSTUNREACH, "%s:%d refused: the emulated board's network reaches the host's"
                              " loopback only (127.0.0.0/8)" % (name, port))
            sock = socket.create_connection((ip, port), timeout=DIAL_TIMEOUT)
        except OSError as e:
            err = e.errno if isinstance(e.errno, int) and 0 < e.errno < 256 else errno.EHOSTUNREACH
            why = e.strerror or str(e)
            self.log.event("net: socket %d cannot reach %s:%d: %s" % (ch, name, port, why))
            self._send("o", ch, bytes((err,)) + why.encode()[:120])
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
        sock.setblocking(False)
        self.conns[ch] = _Conn(sock)
        self.dials += 1
        self.log.event("net: socket %d dialled %s:%d" % (ch, name, port))
        self._send("o", ch, b"\x00")

    def _data(self, ch, payload):
        c = self.conns.get(ch)
        if c is None:  # a connection that failed or was dropped: what is sent to it goes nowhere
            self._send("W", ch, struct.pack("<H", len(payload)))
            return
        c.out += payload
        self._flush(c.sock)

    def _flush(self, sock):
        ch, c = next(((k, v) for k, v in self.conns.items() if v.sock is sock), (None, None))
        if c is None or not c.out:
            return
        try:
            n = sock.send(c.out)
        except BlockingIOError:
            return
        except OSError as e:
            self._broken(ch, c, e)
            return
        del c.out[:n]
        self._send("W", ch, struct.pack("<H", n))

    def _close(self, ch, payload):
        c = self.conns.pop(ch, None)
        if c is not None:
            if c.out:  # what the board wrote before closing goes first, as a socket's close sends it
                try:
                    c.sock.setblocking(True)
                    c.sock.settimeout(1)
                    c.sock.sendall(c.out)
                except OSError:
                    pass
            c.sock.close()
        self._send("x", ch)

    def _window(self, ch, payload):
        c = self.conns.get(ch)
        if c is not None and len(payload) >= 2:
            c.credit += payload[0] | payload[1] << 8

    def _rebooted(self, ch, payload):
        for k in list(self.conns):
            self._drop(k)
        self._send("z", 0)  # the board reuses no channel before this

    def _drop(self, ch):
        c = self.conns.pop(ch, None)
        if c is not None:
            c.sock.close()

    # -- from the far end ------------------------------------------------------------------
    def _from_far(self, ch, c):
        try:
            data = c.sock.recv(min(c.credit, CHUNK))
        except BlockingIOError:
            return
        except OSError as e:
            self._broken(ch, c, e)
            return
        if not data:
            c.eof = True
            self._send("E", ch, b"\x00")
            return
        c.credit -= len(data)
        self._send("D", ch, data)

    def _broken(self, ch, c, e):
        err = e.errno if isinstance(e.errno, int) and 0 < e.errno < 256 else errno.ECONNRESET
        c.eof = True
        c.out.clear()
        self._send("E", ch, bytes((err,)))

    def _closed(self):
        self._close_q()
        for s in self.orphans:
            s.close()
        self.orphans.clear()
