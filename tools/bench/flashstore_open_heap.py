#!/usr/bin/env python3
"""The free heap FlashStore.open() needs on the qemu-m3-tight board, over an outbox holding N pending records.

The telemetry app (frozen) runs offline (it dials a port nobody listens on) until N QoS 1
readings are pending in its FlashStore outbox; then the board boots a script that opens the outbox
again and again behind a ballast bytearray taken after gc.collect(), bisecting the largest ballast
with which open() still succeeds: need = free heap after the collection - that ballast. The store
object's own buffers are included. Measured without reserve() and with reserve(160) (the profile's
max_pending, what the app does before it opens the store).

    python tools/bench/flashstore_open_heap.py 60 160
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "lib")]

from ternlab.boards.qemu import QemuBoard  # noqa: E402
from ternlab.brokers.mosquitto import free_port  # noqa: E402
from ternlab.devset import install_app as install  # noqa: E402

PROBE = r'''
import gc, emuboard
from tern.flashstore import FlashStore
def tr(res, b):
    s = None
    gc.collect()
    try:
        ball = bytearray(b)  # (in the try: a ballast the heap cannot place is a failure too)
        s = FlashStore(emuboard.partition("outbox"), verbose=False)
        if res:
            s.reserve(res)
        s.open()
        return s.count()
    except MemoryError:
        return -1
    finally:
        ball = s = None
        gc.collect()
def m(res):
    gc.collect()
    f = gc.mem_free()
    lo, hi = 0, f
    n = tr(res, 0)
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if tr(res, mid) >= 0:
            lo = mid
        else:
            hi = mid
    print("PROBE %d %d %d %d" % (res, n, f, f - lo if n >= 0 else -1))
m(0)
m(160)
'''


def measure(n, workdir):
    """[(reserve, pending, free, need or -1 when open fails even without ballast)] for n readings."""
    board = QemuBoard("qemu-m3-tight", workdir=workdir, board_id="bench-1", link=("127.0.0.1", free_port()))
    try:
        install(board, {"host": "127.0.0.1", "port": 1, "client_id": "bench-1", "interval_ms": 10, "qos": 1,
                        "count": n, "max_pending": 160})
        board.power_cycle()
        deadline = time.monotonic() + 120
        while not any('"ev":"done"' in ln.text for ln in board.log.lines):
            if time.monotonic() > deadline:
                raise RuntimeError("the app did not finish its readings")
            time.sleep(0.1)
        board.write_file("main.py", PROBE)
        mark = len(board.log.lines)
        board.power_cycle()
        deadline = time.monotonic() + 120
        while True:
            rows = [ln.text.split()[1:] for ln in board.log.lines[mark:] if ln.text.startswith("PROBE ")]
            if len(rows) == 2:
                return [tuple(int(x) for x in r) for r in rows]
            if time.monotonic() > deadline:
                raise RuntimeError("no figures: " + " | ".join(ln.text for ln in board.log.lines[-6:]))
            time.sleep(0.2)
    finally:
        board.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("readings", type=int, nargs="+", help="readings taken offline (pending: at most 160)")
    a = ap.parse_args()
    print("| pending | reserve() before open | free heap | open() needs |")
    print("|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="tern-openheap-") as d:
        for n in a.readings:
            for res, pending, free, need in measure(n, Path(d) / str(n)):
                print("| %d | %s | %d | %s |" % (pending, res or "-", free, "%d" % need if need >= 0 else "fails"))


if __name__ == "__main__":
    main()
