"""Heap and boot cost of opening a store that holds N pending messages, under
the MicroPython unix port (run from CPython, it runs itself there with the flash model on
MICROPYPATH and a 4 MiB heap).

    python tools/bench/store_heap_bench.py [N] [LIBDIR]

For FileStore (POSIX directory) and FlashStore (emulated NOR flash, 64 x 4 KiB
sectors, in-place acks): N 83-byte QoS 1 PUBLISH records are written, the
store closed, then a fresh one opened. Printed per store:
  - kept: gc.mem_alloc() after gc.collect(), store open, minus before (what the
    open store holds);
  - alloc: bytes allocated during open() with the collector off (everything
    the boot allocates, garbage included);
  - boot: open() time in ms (unix port, Python-speed flash).
LIBDIR (default: this checkout's lib) lets the same probe run an older copy of
the library side by side.
"""

import gc
import os
import sys
import time


def _root():
    here = __file__ if "/" in __file__ else "./" + __file__
    return (here.rpartition("/")[0] or ".") + "/../.."


ROOT = _root()
N = int(sys.argv[1]) if len(sys.argv) > 1 else 500
LIB = sys.argv[2] if len(sys.argv) > 2 else ROOT + "/lib"
if sys.implementation.name != "micropython":  # run again on the unix port, norflash on its path
    import subprocess

    from ternlab.paths import device_path

    exe = os.path.join(os.path.dirname(sys.executable), "micropython")
    env = dict(os.environ, MICROPYPATH=":".join(device_path("norflash")))
    sys.exit(subprocess.run([exe, "-X", "heapsize=4m", __file__] + sys.argv[1:], env=env).returncode)
sys.path.insert(0, LIB)

from norflash import NorFlash  # noqa: E402
from tern.filestore import FileStore  # noqa: E402
from tern.flashstore import FlashStore  # noqa: E402

PUBLISH = 3
PKT = bytes(83)
TMP = "/tmp/tern-store-heap-%d" % (time.ticks_us() & 0xFFFFFF)


def fill(st):
    st.open()
    for i in range(N):
        st.append(PUBLISH, i % 65535 + 1, PKT)
    st.close()


def scrub(n):
    """Overwrite the stack open() used: the collector scans it conservatively,
    and a stale pointer left there to the scan's buffer would count as kept."""
    x = [0] * 8
    return scrub(n - 1) + x[0] if n else 0


def measure(name, make):
    st = make()
    gc.collect()
    a = gc.mem_alloc()
    gc.disable()
    t = time.ticks_us()
    st.open()
    dt = time.ticks_diff(time.ticks_us(), t)
    b = gc.mem_alloc()
    gc.enable()
    scrub(40)
    gc.collect()
    c = gc.mem_alloc()
    print("%-10s N=%d pending=%d kept=%d alloc=%d boot=%.1fms" % (name, N, st.count(), c - a, b - a, dt / 1000))
    st.close()


def main():
    fill(FileStore(TMP, verbose=False, segment_bytes=1 << 20, max_segments=64))
    measure("FileStore", lambda: FileStore(TMP, verbose=False, segment_bytes=1 << 20, max_segments=64))
    for n in os.listdir(TMP):  # (segment files only)
        os.remove(TMP + "/" + n)
    os.rmdir(TMP)
    img = TMP + ".img"
    fill(FlashStore(NorFlash(img, fresh=True), verbose=False))
    measure("FlashStore", lambda: FlashStore(NorFlash(img), verbose=False))
    for p in (img, img + ".wear"):  # (NorFlash keeps its wear counts beside the image)
        try:
            os.remove(p)
        except OSError:
            pass


main()
