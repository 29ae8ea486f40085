#!/usr/bin/env python3
"""FlashStore's own instructions per append and release on a stock qemu board, counted.

The board (qemu-m3-esp32, or --profile qemu-rv32-c3) runs under QEMU with `-icount shift=0` (see
cpu_bench.py: its prelude counts with qboard.icount()); `tern` runs in place from its ROMFS partition,
compiled from this tree. A FlashStore on
the board's outbox partition (32 sectors of 4 KiB, erased) is opened, then N records of a 14-byte
header and a 64-byte payload (cpu_bench's QoS 1 message) are appended and released one at a time, as
a QoS 1 publish and its PUBACK do; the counts include the sector switches every 39 records (the first
use of each sector after a boot checks that it is erased). No broker is involved: it is the store
alone, in a fresh heap (cpu_bench's FlashStore case is the same store behind a connected Client).

    python tools/bench/flashstore_cpu.py --records 100 [--profile qemu-rv32-c3]
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
a = IC()
st.open()
o = insns(a)
head = memoryview(bytearray(14))
body = b'x' * 64
A = R = W = 0
for i in range({n}):
    a = IC()
    st.append(3, i + 1, head, body)
    t = insns(a)
    A += t
    W = max(W, t)
    a = IC()
    st.release(i + 1)
    R += insns(a)
print('COUNT', o, A, R, W)
"""


def measure(n, workdir, profile="qemu-m3-esp32"):
    from ternlab.devset import app_romfs, compile_mpy

    board = QemuBoard(profile, workdir=workdir, board_id="fcpu")
    try:
        arch = board.profile["arch"]
        board.write_romfs(app_romfs(compile_mpy(Path(workdir) / "mpy", march=arch)))
        board.qemu_args = list(cpu_bench.ICOUNT)
        board.power_cycle()
        out = board.exec(cpu_bench.PRELUDE + PROG.format(n=n), timeout=600)
    finally:
        board.close()
    line = [x for x in out.splitlines() if x.startswith("COUNT")]
    if not line:
        raise RuntimeError("no count: %s" % out[-500:])
    o, a, r, w = (int(x) for x in line[0].split()[1:])
    return {"open": o, "append": a / n, "release": r / n, "dearest append": w}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100, help="records appended and released (default 100)")
    ap.add_argument("--profile", default="qemu-m3-esp32", help="a stock qemu profile (default qemu-m3-esp32)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        res = measure(a.records, Path(tmp), a.profile)
    for k, v in res.items():
        print("%-15s %10.0f instructions%s" % (k, v, " a record" if k in ("append", "release") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
