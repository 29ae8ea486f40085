"""The power-cut file shim, written once: real POSIX files behind a layer that counts the writes,
syncs and removes a power cut can land on. The store tests (tests/lib/test_store_powercut.py's
CutFs) and the crash sweep's device (crash_device.py's CutPosix) build on it, on CPython and on the
MicroPython unix port; each says when it cuts and what the cut does to the operation under way."""

import os


class ShimFile:
    """A real file behind a shim: reads, seeks and closing pass through; the shim's subclass says
    what its writes and flushes count as."""

    def __init__(self, path, mode):
        self.path = path
        self.f = open(path, mode)

    def read(self, n=-1):
        return self.f.read(n) if n >= 0 else self.f.read()

    def readinto(self, b):
        return self.f.readinto(b)

    def seek(self, pos, whence=0):
        return self.f.seek(pos, whence)

    def fileno(self):
        return self.f.fileno()

    def close(self):
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


def keep_synced(synced, below):
    """What a power cut leaves of the files: each of `synced` ({path: bytes known durable}) keeps
    those bytes and a random part of what was written after (below(n): a random number under n)."""
    for path in synced:
        try:
            size = os.stat(path)[6]
        except OSError:
            continue
        keep = synced[path]
        if size > keep:
            keep += below(size - keep + 1)
            with open(path, "rb") as f:
                data = f.read(keep)
            with open(path, "wb") as f:
                f.write(data)
