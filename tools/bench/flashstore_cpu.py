#!/usr/bin/env python3
"""FlashStore's own instructions per append and release on the qemu-m3-esp32 board, counted.

The board runs under QEMU with `-icount shift=0` (see cpu_bench.py: its prelude reads the APB timer,
one tick every 40 instructions); `tern` is frozen in the firmware built from this tree. A FlashStore on
the board's outbox partition (32 sectors of 4 KiB, erased) is opened, then N records of a 14-byte
header and a 64-byte payload (cpu_bench's QoS 1 message) are appended and released one at a time, as
a QoS 1 publish and its PUBACK do; the counts include the sector switches every 39 records (the first
use of each sector after a boot checks that it is erased). No broker is involved: it is the store
alone, in a fresh heap (cpu_bench's FlashStore case is the same store behind a connected Client).

    python tools/bench/flashstore_cpu.py --records 100
"""

import argparse
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2] / "host"), str(Path(__file__).resolve().parent)]

import cpu_bench  # noqa: E402
from ternlab.boards.qemu import QemuBoard  # noqa: E402

PROG = """from tern.flashstore import FlashStore
st = FlashStore(emuboard.partition('outbox'))
a = M[TV]
st.open()
o = ticks(a)
head = memoryview(bytearray(14))
body = b'x' * 64
A = R = W = 0
for i in range({n}):
    a = M[TV]
    st.append(3, i + 1, head, body)
    t = ticks(a)
    A += t
    W = max(W, t)
    a = M[TV]
    st.release(i + 1)
    R += ticks(a)
print('COUNT', o, A, R, W)
"""


def measure(n, workdir):
    board = QemuBoard("qemu-m3-esp32", workdir=workdir, board_id="fcpu")
    try:
        board.qemu_args = list(cpu_bench.ICOUNT)
        board.power_cycle()
        out = board.exec(cpu_bench.PRELUDE + PROG.format(n=n), timeout=600)
    finally:
        board.close()
    line = [x for x in out.splitlines() if x.startswith("COUNT")]
    if not line:
        raise RuntimeError("no count: %s" % out[-500:])
    o, a, r, w = (int(x) * cpu_bench.INSNS_PER_TICK for x in line[0].split()[1:])
    return {"open": o, "append": a / n, "release": r / n, "dearest append": w}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100, help="records appended and released (default 100)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        res = measure(a.records, Path(tmp))
    for k, v in res.items():
        print("%-15s %10.0f instructions%s" % (k, v, " a record" if k in ("append", "release") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
