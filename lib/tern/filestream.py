"""CPython only (not in the device set): a file-like stream as the reader and writer tern.aio's
tasks use, for `tern.aio.Client(stream=f)` with the same stream the blocking client takes. On
MicroPython asyncio's own Stream does this for any object it can poll."""

import asyncio

from .client import _Stream


class FileStream(_Stream):
    """asyncio's reader and writer (read, write, drain, close) over a file-like stream: non-blocking
    readinto/write (None: would block) and fileno, e.g. a pyserial Serial with timeout=0, a pty, a
    socket's makefile. Waits with the running loop's add_reader/add_writer; close() leaves the
    stream open (it is the application's)."""

    def __init__(self, f):
        _Stream.__init__(self, f)
        self.out = bytearray()
        self.buf = bytearray(1 << 14)

    async def _ready(self, write):
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        fd = self.fileno()
        (loop.add_writer if write else loop.add_reader)(fd, lambda: fut.done() or fut.set_result(None))
        try:
            await fut
        finally:
            (loop.remove_writer if write else loop.remove_reader)(fd)

    async def read(self, n):
        while True:
            await self._ready(False)
            try:
                return bytes(memoryview(self.buf)[: self.recv_into(self.buf, min(n, len(self.buf)))])
            except BlockingIOError:
                pass

    def write(self, data):
        if not self.out:  # as asyncio's transports: what the stream takes now goes at once
            try:
                data = memoryview(data)[self.send(data) :]
            except BlockingIOError:
                pass
        self.out += data

    async def drain(self):
        while self.out:
            await self._ready(True)
            try:
                del self.out[: self.send(self.out)]
            except BlockingIOError:
                pass

    def close(self):
        pass
