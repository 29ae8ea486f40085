"""A fake broker that plays a byte-exact script, for the protocol cases a real
broker will not produce on demand (a drop right after PUBREC, an oversize
packet, a PUBACK for an identifier nobody used).

A script is a list of connections; each connection a list of steps:
  ("recv", bytes)   the client must send exactly these bytes next
  ("recv_type", t)  the client must send a packet of type t (any content)
  ("send", bytes)   send these bytes to the client
  ("close",)        drop the connection
  ("stall", s)      read nothing for s seconds (a broker whose socket fills up)
  ("quiet", s)      the client must send nothing for s seconds
  ("eof",)          the client must close the connection (sending nothing more)
  ("open", s)       the client must send nothing and keep its end open for s
                    seconds (a broker that acts on a DISCONNECT a moment
                    after reading it)
After its last step a connection stays open until the client closes it.
Mismatches are collected in `errors`; `complete` says every step was played.
"""

from __future__ import annotations

import socket
import threading

from tern import codec

READ_TIMEOUT = 10.0


def _describe(data: bytes, version: int) -> str:
    try:
        return f"{codec.decode(data, version)!r} [{data.hex()}]"
    except Exception:
        return data.hex()


class ScriptedBroker:
    host = "127.0.0.1"

    def __init__(self, script, version: int = 4):
        self.script = [list(conn) for conn in script]
        self.version = version
        self.errors: list[str] = []
        self.received: list[bytes] = []
        self.complete = False
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((self.host, 0))
        self._listener.listen(4)
        self._listener.settimeout(READ_TIMEOUT)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stop = threading.Event()

    def start(self) -> "ScriptedBroker":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(READ_TIMEOUT + 2)
        self._listener.close()

    def _read_packet(self, conn: socket.socket, buf: bytearray) -> bytes | None:
        while True:
            n = codec.frame_size(buf, 0, len(buf), 1 << 28) if buf else -1
            if 0 < n <= len(buf):
                pkt = bytes(buf[:n])
                del buf[:n]
                self.received.append(pkt)
                return pkt
            try:
                chunk = conn.recv(65536)
            except socket.timeout:
                return None
            except OSError:  # reset: the connection ended all the same
                return None
            if not chunk:
                return None
            buf += chunk

    def _run(self) -> None:
        for index, steps in enumerate(self.script):
            try:
                conn, _ = self._listener.accept()
            except OSError:
                self.errors.append(f"connection {index + 1}: the client never connected")
                return
            conn.settimeout(READ_TIMEOUT)
            buf = bytearray()
            try:
                for k, step in enumerate(steps):
                    where = f"connection {index + 1}, step {k + 1}"
                    if step[0] == "send":
                        conn.sendall(step[1])
                    elif step[0] == "close":
                        break
                    elif step[0] == "stall":
                        self._stop.wait(step[1])
                    elif step[0] == "quiet":
                        conn.settimeout(step[1])
                        got = self._read_packet(conn, buf)
                        conn.settimeout(READ_TIMEOUT)
                        if got is not None or buf:
                            self.errors.append(f"{where}: expected nothing for {step[1]} s, got "
                                               f"{_describe(got or bytes(buf), self.version)}")
                            return
                    elif step[0] == "open":
                        conn.settimeout(step[1])
                        try:
                            got = bytes(buf) or conn.recv(65536)
                        except socket.timeout:
                            got = None
                        except OSError:  # reset
                            got = b""
                        conn.settimeout(READ_TIMEOUT)
                        if got is not None:
                            self.errors.append(f"{where}: expected the connection open and quiet for {step[1]} s, got "
                                               f"{_describe(got, self.version) if got else 'its end of stream'}")
                            return
                    elif step[0] == "eof":
                        try:
                            got = bytes(buf) or conn.recv(65536)
                        except socket.timeout:
                            got = None
                        except OSError:  # reset: closed all the same
                            got = b""
                        if got != b"":
                            self.errors.append(f"{where}: expected the client to close, got "
                                               f"{'nothing' if got is None else _describe(got, self.version)}")
                            return
                    else:
                        got = self._read_packet(conn, buf)
                        if got is None:
                            self.errors.append(f"{where}: connection ended, expected "
                                               f"{_describe(step[1], self.version) if step[0] == 'recv' else step[1]}")
                            return
                        if step[0] == "recv" and got != step[1]:
                            self.errors.append(f"{where}: expected {_describe(step[1], self.version)}, "
                                               f"got {_describe(got, self.version)}")
                            return
                        if step[0] == "recv_type" and got[0] >> 4 != step[1]:
                            self.errors.append(f"{where}: expected a {codec.packet_name(step[1])}, "
                                               f"got {_describe(got, self.version)}")
                            return
                else:
                    if index == len(self.script) - 1:
                        self.complete = True
                        # keep the last connection until the client goes
                        conn.settimeout(0.2)
                        while not self._stop.is_set():
                            try:
                                if not conn.recv(65536):
                                    break
                            except socket.timeout:
                                continue
                            except OSError:
                                break
                        return
            finally:
                conn.close()
        self.complete = True
