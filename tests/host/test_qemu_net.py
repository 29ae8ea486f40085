"""The qemu boards' `socket` module (firmware/qemu-firmware/cmodules/qboard/net.c, the host's end in
ternlab.boards.qemu_net), on both ISAs: what a board's socket does, against real TCP servers on the
host's loopback -- getaddrinfo, connect (and its refusals), send/recv/read/write/readinto/readline,
non-blocking and timed-out reads, select.poll, end of stream both ways, many bytes both ways through
the per-socket windows (one socket's unread bytes never hold up another's), the sockets of a soft
reboot closed and those of a power cut left open and silent, as a board that vanished leaves them."""

import socket
import threading
import time

import pytest

from ternlab.boards.qemu import QemuBoard

from qemukit import ISAS


@pytest.fixture(scope="module", params=list(ISAS), ids=list(ISAS.values()))
def board(request, tmp_path_factory):
    b = QemuBoard(request.param, workdir=tmp_path_factory.mktemp("qemu-net") / "board")
    yield b
    b.close()


class Server:
    """A TCP server on 127.0.0.1 running handler(conn) for each connection, in a thread."""

    def __init__(self, handler):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.handler = handler
        self.conns = []
        self.ended = threading.Event()  # a connection read end of stream (echo)
        self.errors = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn):
        try:
            self.handler(conn)
        except Exception as e:  # the test's assertion says what went wrong
            self.errors.append(e)

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def echo(conn, srv=None):
    while True:
        data = conn.recv(65536)
        if not data:
            conn.close()
            if srv is not None:
                srv.ended.set()
            return
        conn.sendall(data)


def test_getaddrinfo_and_refusals(board):
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    out = board.exec(
        "import socket\n"
        "print(socket.getaddrinfo('localhost', 1883))\n"
        "print(socket.getaddrinfo('127.0.0.1', 80, 0, socket.SOCK_STREAM)[0][-1])\n"
        "for addr in (('10.1.2.3', 1883), ('127.0.0.1', %d)):\n"
        " s = socket.socket()\n"
        " try:\n  s.connect(addr)\n except OSError as e:\n  print(e.errno, e.args[-1])\n"
        " s.close()\n" % port)
    lines = out.strip().splitlines()
    assert lines[0] == "[(2, 1, 6, '', ('127.0.0.1', 1883))]" and lines[1] == "('127.0.0.1', 80)", out
    assert lines[2] == ("113 10.1.2.3:1883 refused: the emulated board's network reaches the host's loopback only "
                        "(127.0.0.0/8)"), out
    assert lines[3].startswith("111 "), out  # ECONNREFUSED, as the host's dial got it
    assert any("net: socket" in x.text and "10.1.2.3:1883 refused" in x.text for x in board.log.lines)


def test_send_recv_readinto_readline_and_end_of_stream_both_ways(board):
    srv = Server(lambda conn: echo(conn, srv))
    try:
        out = board.exec(
            "import socket\n"
            "s = socket.socket()\ns.connect(socket.getaddrinfo('127.0.0.1', %d)[0][-1])\n"
            "print(s.send(b'ping\\n'), s.readline())\n"
            "s.write(b'abcdef')\nbuf = bytearray(6)\nprint(s.readinto(buf), bytes(buf))\n"
            "s.sendall(b'xyz')\nprint(s.read(3))\n"
            "s.close()\n" % srv.port)
        assert out.split() == ["5", "b'ping\\n'", "6", "b'abcdef'", "b'xyz'"], out
        assert srv.ended.wait(5)  # the board's close reached the far end: end of stream
    finally:
        srv.close()


def test_many_bytes_both_ways_through_the_windows(board):
    # 20 KiB each way, ten times the board's window: flow control, not loss
    srv = Server(echo)
    try:
        out = board.exec(
            "import socket, hashlib\n"
            "s = socket.socket()\ns.connect(('127.0.0.1', %d))\n"
            "data = bytes(i %% 251 for i in range(20480))\n"
            "got = bytearray()\nk = 0\n"
            "while len(got) < len(data):\n"
            " if k < len(data):\n  k += s.write(data[k:k + 3000])\n"
            " s.setblocking(False)\n"
            " r = s.read(4096)\n"
            " s.setblocking(True)\n"
            " if r:\n  got += r\n"
            "print(len(got), got == data)\ns.close()\n" % srv.port, timeout=60)
        assert out.split() == ["20480", "True"], out
    finally:
        srv.close()


def test_non_blocking_timeouts_poll_and_the_far_ends_close(board):
    gate = threading.Event()

    def later(conn):
        gate.wait(10)
        conn.sendall(b"late")
        conn.close()

    srv = Server(later)
    try:
        out = board.exec(
            "import socket, select, errno\n"
            "s = socket.socket()\ns.connect(('127.0.0.1', %d))\n"
            "s.setblocking(False)\n"
            "try:\n s.recv(4)\nexcept OSError as e:\n print('recv', errno.errorcode[e.errno])\n"
            "print('read', s.read(4))\n"
            "s.settimeout(0.2)\n"
            "try:\n s.recv(4)\nexcept OSError as e:\n print('timed', errno.errorcode[e.errno])\n"
            "p = select.poll()\np.register(s, select.POLLIN)\nprint('poll', p.poll(0))\n" % srv.port)
        assert out.split() == ["recv", "EAGAIN", "read", "None", "timed", "ETIMEDOUT", "poll", "[]"], out
        gate.set()
        out = board.exec("s.settimeout(5)\nprint(len(p.poll(5000)), s.recv(10), s.recv(10), s.read(), s.recv(10))\n"
                         "s.close()\n")
        assert out.split() == ["1", "b'late'", "b''", "b''", "b''"], out  # then end of stream, for good
    finally:
        srv.close()


def test_one_sockets_unread_bytes_do_not_hold_up_another(board):
    def flood(conn):
        conn.sendall(bytes(8192))
        conn.recv(1)

    srv = Server(flood)
    try:
        out = board.exec(
            "import socket\n"
            "a = socket.socket()\na.connect(('127.0.0.1', %d))\n"
            "b = socket.socket()\nb.connect(('127.0.0.1', %d))\n"
            "def drain(s):\n n = 0\n while n < 8192:\n  n += len(s.recv(1024))\n return n\n"
            "print(drain(b), drain(a))\na.close()\nb.close()\n" % (srv.port, srv.port), timeout=60)
        assert out.split() == ["8192", "8192"], out
    finally:
        srv.close()


def test_sockets_are_recycled_and_bounded(board):
    srv = Server(echo)
    try:
        out = board.exec(
            "import socket\n"
            "for i in range(20):\n"  # more than the board has at once: closed ones come back
            " s = socket.socket()\n s.connect(('127.0.0.1', %d))\n s.write(b'%%d' %% i)\n s.recv(4)\n s.close()\n"
            "held = []\n"
            "try:\n"
            " while True:\n  held.append(socket.socket())\n"
            "except OSError as e:\n print(len(held), e.errno)\n"
            "for s in held:\n s.close()\n"
            "s = socket.socket()\ns.close()\nprint('again')\n" % srv.port, timeout=60)
        assert out.split() == ["8", "23", "again"], out  # ENFILE past the eighth
    finally:
        srv.close()


def test_a_soft_reboot_closes_the_boards_sockets_and_a_power_cut_leaves_them_silent(board):
    srv = Server(lambda conn: None)
    try:
        board.exec("import socket\ns = socket.socket()\ns.connect(('127.0.0.1', %d))\n" % srv.port)
        board.soft_reset()  # MicroPython closes its sockets: the far end reads end of stream
        conn = _accepted(srv, 1)
        conn.settimeout(5)
        assert conn.recv(10) == b""
        board.exec("import socket\ns = socket.socket()\ns.connect(('127.0.0.1', %d))\ns.write(b'hi')\n" % srv.port)
        conn = _accepted(srv, 2)
        conn.settimeout(5)
        assert conn.recv(10) == b"hi"
        board.power_off()  # the board vanishes: no FIN, as a board that lost power sends none
        conn.settimeout(1)
        with pytest.raises(socket.timeout):
            conn.recv(10)
        board.power_on()
    finally:
        srv.close()


def _accepted(srv, n, timeout=5):
    end = time.monotonic() + timeout
    while len(srv.conns) < n:
        assert time.monotonic() < end, "the board did not connect"
        time.sleep(0.01)
    return srv.conns[n - 1]
