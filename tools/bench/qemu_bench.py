#!/usr/bin/env python3
"""Device figures on the qemu boards: MicroPython's own firmware (the qemu port, 32-bit) for an Arm
Cortex-M3 (qemu-m3-*) and a RISC-V RV32 core (qemu-rv32-c3, the ESP32-C3's ISA) under QEMU
(ternlab.boards.qemu), against a real Mosquitto reached through the boards' own sockets.

Measured:
  - heap after import + connect (gc.mem_alloc() after gc.collect(), before `from tern.client import
    Client` and after connect()), MQTT 3.1.1 and 5.0, on both ISAs: on the stock boards (nothing of
    Tern frozen) with Tern's package.json .mpy files in /lib (loaded onto the heap) and in place from
    a ROMFS image, and on the same board with a frozen firmware (Tern frozen in);
  - the telemetry app (FlashStore): heap used while running (profile heap - lowest free heap), flash
    per reading and power-on to first publish, on qemu-m3-tight (32 KiB, frozen), qemu-m3-esp32 and
    qemu-rv32-c3 (stock, the app in ROMFS), with tools/bench/firmware_bench.py's run (1,000 QoS 1
    readings every 10 ms);
  - time per QoS 1 publish (publish + acknowledgement, window 8) and per received QoS 1 message
    (a backlog queued for the board's persistent session, drained after connect), on the qemu boards
    and, side by side in the same run, on the unix port's emulated board (unix-emulated, same code as
    .mpy), each on its own clock.

    python tools/bench/qemu_bench.py                            # print the tables
    python tools/bench/qemu_bench.py --write docs/benchmarks.md  # and rewrite its section
    python tools/bench/qemu_bench.py --heaps-only                # the heap tables alone (a few minutes)
    python tools/bench/qemu_bench.py --smallest-only             # the smallest heap the app runs in
    python tools/bench/qemu_bench.py --sources qemu-m3-rp2       # the sources route's heap on that profile
"""

import argparse
import datetime
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "lib"), str(Path(__file__).resolve().parent)]

from ternlab.boards import load_profile  # noqa: E402
from ternlab.boards.emulated import EmulatedBoard  # noqa: E402
from ternlab.boards.qemu import QemuBoard  # noqa: E402
from ternlab.brokers.mosquitto import Broker  # noqa: E402
from ternlab.boards.errors import DeviceError  # noqa: E402
from ternlab.devset import app_romfs, compile_mpy, device_files  # noqa: E402
from tern.client import Client  # noqa: E402

import firmware_bench  # noqa: E402

ISA_PROFILES = ("qemu-m3-esp32", "qemu-rv32-c3")  # the stock boards, one per ISA
# where `tern` runs from -> the file its session module is (each on its own board: see _boards())
SOURCES = {"frozen": "tern/session.py", ".mpy on the filesystem": "/lib/tern/session.mpy",
           "ROMFS (in place)": "/rom/lib/tern/session.mpy"}

HEAP = """import gc, sys
gc.collect()
a = gc.mem_alloc()
from tern.client import Client
c = Client('heap-{v}', version={v}, server={host!r}, port={port})
c.connect()
gc.collect()
print('HEAP', gc.mem_alloc() - a, __import__('tern.session').session.__file__)
c.disconnect()
"""

# Where the bytes of the heap figures go (MQTT 3.1.1), from each source: each module of the client's
# import path imported one after another (its own heap, its tern dependencies already in), then
# Client() (buffers, session, MemoryStore) and connect(), the tern modules a connect has loaded, and
# then the telemetry app's own modules (what the tight profile's app adds: its FlashStore outbox).
MODULES = ("tern.wire", "tern.pkt", "tern.topic", "tern.message", "tern.store", "tern.session", "tern.client")
APP_MODULES = ("tern.logrec", "tern.flashstore", "hal", "telemetry")
PER_MODULE = """import gc, sys
at = [0]
def step(name):
    gc.collect()
    b = gc.mem_alloc()
    if name:
        print('MOD', name, b - at[0])
    at[0] = b
step(None)
for m in %r:
    step(__import__(m) and m)
from tern.client import Client
c = Client('heap-m', version=4, server=%r, port=%d)
step('Client()')
c.connect()
step('connect()')
print('LOADED', ' '.join(sorted(k[5:] for k in sys.modules if k.startswith('tern.'))))
c.disconnect()
for m in %r:
    step(__import__(m) and m)
"""

# N QoS 1 publishes (window 8), then a backlog of M QoS 1 messages the host queued for this session
TIMING = """import gc
from time import ticks_ms, ticks_diff
from tern.client import Client
{stream}
got = []
c = Client('bench-t', version=4, clean=False, window=8, {conn})
c.subscribe('bench/rx', 1, handler=lambda m: got.append(1))
c.connect()
c.disconnect()
print('READY')
"""

TIMING2 = """c.connect()
t = ticks_ms()
while len(got) < {m}:
    c.loop(20)
rx = ticks_diff(ticks_ms(), t)
p = b'x' * 64
t = ticks_ms()
for i in range({n}):
    c.publish('bench/tx', p, qos=1)
c.wait_all(60)
tx = ticks_diff(ticks_ms(), t)
print('TIMING', tx, rx)
c.disconnect()
"""


def heap_row(board, broker, src, v):
    board.power_cycle()
    out = board.exec(HEAP.format(v=v, host=broker.host, port=broker.port), timeout=60)
    line = [x for x in out.splitlines() if x.startswith("HEAP")][0].split()
    if line[2] != SOURCES[src]:
        raise RuntimeError(f"{src}: tern came from {line[2]}, not {SOURCES[src]}")
    return int(line[1])


def _boards(profile, mpy, workdir):
    """(source, board) for each source, one after another: the stock board with Tern's package.json
    .mpy files in /lib, the same with the ROMFS image (mounted ahead of /lib), and the same board's
    heap and flash with a frozen firmware (Tern and the app frozen in)."""
    prof = load_profile(profile)
    board = QemuBoard(prof, workdir=workdir / ("heap-" + profile), board_id="bench-heap")
    try:
        board.mkdir("lib")
        board.mkdir("lib/tern")
        for p in sorted((ROOT / "mpy" / "tern").glob("*.mpy")):
            board.write_file("lib/tern/" + p.name, p.read_bytes())
        for p in sorted(mpy.glob("*.mpy")):  # the app's modules, for the per-module steps
            board.write_file("lib/" + p.name, p.read_bytes())
        yield ".mpy on the filesystem", board
        board.write_romfs(app_romfs(mpy))
        yield "ROMFS (in place)", board
    finally:
        board.close()
    frozen = QemuBoard(dict(prof, firmware="frozen"), workdir=workdir / ("frozen-" + profile), board_id="bench-heap")
    try:
        yield "frozen", frozen
    finally:
        frozen.close()


def heaps(broker, workdir, steps_of=ISA_PROFILES[0]):
    """{(profile, source, version): bytes}; and, on steps_of, where the bytes go (per-module steps) and
    which tern modules a connect has loaded."""
    h, steps, loaded, sizes = {}, {}, None, {}
    for profile in ISA_PROFILES:
        arch = load_profile(profile)["arch"]
        mpy = compile_mpy(workdir / ("mpy-" + arch), march=arch)
        for src, board in _boards(profile, mpy, workdir):
            for v in (4, 5):
                h[(profile, src, v)] = heap_row(board, broker, src, v)
            if profile == steps_of:
                board.power_cycle()
                out = board.exec(PER_MODULE % (MODULES, broker.host, broker.port, APP_MODULES), timeout=60).splitlines()
                steps[src] = [(ln.split()[1], int(ln.split()[2])) for ln in out if ln.startswith("MOD")]
                loaded = [ln.split()[1:] for ln in out if ln.startswith("LOADED")][0]
                sizes = {str(q.relative_to(mpy))[:-4].replace("/", "."): q.stat().st_size for q in mpy.rglob("*.mpy")}
    # (step, .mpy bytes, {source: heap})
    mods = [(name, sizes.get(name), {src: steps[src][i][1] for src in SOURCES})
            for i, (name, _) in enumerate(steps["frozen"])]
    return h, mods, loaded


def timing(board, broker, n, m, conn, stream=""):
    board.exec(TIMING.format(stream=stream, conn=conn), timeout=30)
    q = Client("bench-q", server=broker.host, port=broker.port)
    q.connect()
    for i in range(m):
        q.publish("bench/rx", b"y" * 64, qos=1)
    q.wait_all(30)
    q.disconnect()
    out = board.exec(TIMING2.format(n=n, m=m), timeout=300)
    tx, rx = (int(x) for x in [x for x in out.splitlines() if x.startswith("TIMING")][0].split()[1:])
    return tx / n, rx / m


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--readings", type=int, default=1000, help="telemetry readings per profile (default 1000)")
    ap.add_argument("--boots", type=int, default=5, help="boots timed for power-on to first publish (default 5)")
    ap.add_argument("--messages", type=int, default=500, help="QoS 1 messages timed each way (default 500)")
    ap.add_argument("--step", type=int, default=2048, help="heap step of the smallest-heap search (default 2048)")
    ap.add_argument("--write", metavar="FILE", help="rewrite this file's qemu_bench section")
    ap.add_argument("--smallest-only", action="store_true",
                    help="find and print the smallest heap the app runs in on qemu-m3-tight, frozen and from ROMFS, only")
    ap.add_argument("--sources", metavar="PROFILE",
                    help="measure and print only the heap after import + connect with the library's sources in /lib"
                         " (package-src.json's route), compiled on the board of this qemu-m3 profile")
    ap.add_argument("--heaps-only", action="store_true",
                    help="measure and print the two heap tables only (no app run, no timing; --write is ignored)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, Broker(Path(tmp) / "broker") as broker:
        tmp = Path(tmp)
        if a.sources:
            print(sources_heap(broker, a.sources, tmp))
            return 0
        mpy = compile_mpy(tmp / "mpy", march="armv7m")
        if a.smallest_only:
            print(smallest_heaps(broker, mpy, tmp, a.step))
            return 0
        h, mods, loaded = heaps(broker, tmp)
        print(h, mods, loaded, file=sys.stderr)
        if a.heaps_only:
            print(render_heaps(h, mods, loaded))
            return 0
        apps = {}
        for name in ("qemu-m3-tight", "qemu-m3-esp32", "qemu-rv32-c3"):
            prof = load_profile(name)
            apps[name] = firmware_bench.run_profile(prof, broker, compile_mpy(tmp / ("mpy-" + prof["arch"]),
                                                    march=prof["arch"]), a.readings, a.boots, tmp / name)
            print(name, apps[name], file=sys.stderr)
        smallest = smallest_heaps(broker, mpy, tmp, a.step)
        print("smallest", smallest, file=sys.stderr)
        times = {}
        conn = "server=%r, port=%d" % (broker.host, broker.port)
        for name in ISA_PROFILES:
            arch = load_profile(name)["arch"]
            qb = QemuBoard(name, workdir=tmp / ("t-" + name), board_id="bench-t")
            try:
                qb.write_romfs(app_romfs(compile_mpy(tmp / ("mpy-" + arch), march=arch)))
                qb.power_cycle()  # the image is mounted at boot
                times[name + " (ROMFS)"] = timing(qb, broker, a.messages, a.messages, conn)
            finally:
                qb.close()
        ub = EmulatedBoard("unix-emulated", workdir=tmp / "t-unix", board_id="bench-t",
                           host_paths=[str(compile_mpy(tmp / "mpy-unix"))])
        try:
            times["unix-emulated (.mpy)"] = timing(ub, broker, a.messages, a.messages, conn)
        finally:
            ub.close()
        print(times, file=sys.stderr)
    text = render(h, mods, loaded, apps, smallest, times, a)
    print(text)
    if a.write:
        from benchdoc import write_section

        write_section(a.write, "qemu_bench", text)
    return 0


def sources_heap(broker, profile, tmp):
    """Heap after import + connect, MQTT 3.1.1 and 5.0, with the device set's sources in /lib: what
    the board compiles at import (package-src.json's route). A MemoryError is reported as such."""
    board = QemuBoard(profile, workdir=tmp / "src", board_id="bench-src")
    try:
        board.mkdir("lib")
        board.mkdir("lib/tern")
        for src, rel in device_files():
            board.write_file("lib/" + rel, Path(src).read_bytes())
        out = {}
        for v in (4, 5):
            board.power_cycle()
            try:
                got = board.exec(HEAP.format(v=v, host=broker.host, port=broker.port), timeout=120)
                out[v] = int([x for x in got.splitlines() if x.startswith("HEAP")][0].split()[1])
            except DeviceError as e:
                out[v] = str(e).strip().splitlines()[-1]
        return f"{profile}, sources in /lib: MQTT 3.1.1 {out[4]}, MQTT 5.0 {out[5]}"
    finally:
        board.close()


def smallest_heaps(broker, mpy, tmp, step):
    """The smallest heaps the app runs in on qemu-m3-tight's settings (the heap given at each boot):
    frozen, and in place from its ROMFS partition on the same board with a stock firmware."""
    prof = load_profile("qemu-m3-tight")
    return (firmware_bench.min_heap(prof, broker, mpy, tmp / "min", lo=8192, hi=32768, step=step, romfs=False),
            firmware_bench.min_heap(prof, broker, mpy, tmp / "min-rom", lo=16384, hi=65536, step=step, romfs=True))


def _heap_table(h):
    profs = [p for p in ISA_PROFILES if any(k[0] == p for k in h)]
    out = ["| where `tern` runs from | " + " | ".join(f"{p}, MQTT 3.1.1 | {p}, MQTT 5.0" for p in profs) + " |",
           "|---|" + "---:|---:|" * len(profs)]
    for src in SOURCES:
        out.append(f"| {src} | " + " | ".join(f"{h[(p, src, 4)]:,} | {h[(p, src, 5)]:,}" for p in profs) + " |")
    return out


def render_heaps(h, mods, loaded):
    """The heap after import + connect, and where the .mpy figure goes (markdown rows)."""
    out = _heap_table(h)
    out += ["", *_step_table(mods), "", "Loaded after the connect: " + ", ".join(f"`tern.{m}`" for m in loaded)]
    return "\n".join(out)


def _step_table(mods):
    out = ["| step | .mpy bytes | " + " | ".join(f"heap, {src} (bytes)" for src in SOURCES) + " |",
           "|---|---:|" + "---:|" * len(SOURCES)]
    for name, size, heap in mods:
        app = " (app)" if name in APP_MODULES else ""
        out.append(f"| {'`' + name + '`' + app if size else name} | {f'{size:,}' if size else ''} | "
                   + " | ".join(f"{heap[src]:,}" for src in SOURCES) + " |")
    return out


def render(h, mods, loaded, apps, smallest, times, a):
    today = datetime.date.today().isoformat()
    out = [
        "## Device figures on the emulated microcontrollers, both ISAs (qemu boards)",
        "",
        f"Command: `python tools/bench/qemu_bench.py --readings {a.readings} --boots {a.boots}"
        f" --messages {a.messages} --step {a.step} --write docs/benchmarks.md` — {today}, this 2-core machine (shared):"
        " MicroPython v1.28.0's qemu port (32-bit) for an Arm Cortex-M3 (MPS2-AN385, qemu-system-arm 7.2) and a"
        " RISC-V RV32IMC core (virt, qemu-system-riscv32 7.2: the ESP32-C3's ISA), built by `make firmware`:"
        " stock (nothing of Tern frozen) and, for the frozen rows, with `tern` and the app frozen in"
        " (`firmware/app/manifest.py`); Mosquitto on loopback reached through the boards' own sockets"
        " (ternlab.boards.qemu_net).",
        "",
        "Heap after `import` + `connect()` (bytes; `gc.mem_alloc()` after `gc.collect()`, before the import"
        " and after the CONNACK; client with its default 4 KiB receive buffer; qemu-m3-esp32 and"
        " qemu-rv32-c3, stock, with Tern's package.json files in /lib or its ROMFS image, and the same boards"
        " with a frozen firmware):",
        "",
        *_heap_table(h),
    ]
    out += ["", "Targets (issue 26): frozen <= 10 KiB (10,240 bytes), .mpy on a 32-bit board <= 32 KiB (32,768 bytes),"
            " MQTT 5 within 1 KiB of MQTT 3.1.1.", "",
            "Where the heap figures go (qemu-m3-esp32, MQTT 3.1.1; each module imported after the one before, so its"
            " figure is its own; .mpy compiled by `compile_mpy`, mpy-cross -O3 -march=armv7m; Client(): its 4 KiB receive and"
            " 512-byte transmit buffers, the send ring for 256 messages, the session, the MemoryStore; then the"
            " telemetry app's own modules, what the tight profile's app adds):", "",
            *_step_table(mods)]
    out += ["", "Loaded after the connect: " + ", ".join(f"`tern.{m}`" for m in loaded) + " (`handshake`, `replay` and,"
            " under MQTT 5, `props` are loaded by connect() and let go after the CONNACK; `replay` comes back for"
            " a subscribe() and at every CONNACK, `props` with the first property block; `v5`, `fault`, `manual`, `refused` and `tls` load when a path of theirs runs).", "",
            "The telemetry app, outbox a FlashStore on the board's NOR flash model (firmware_bench's run:"
            f" {a.readings:,} QoS 1 readings every 10 ms, window 8; qemu-m3-tight frozen, the stock boards with"
            " the app in place from ROMFS):", "",
            "| profile | heap (bytes) | heap used while running, high-water (bytes) | bytes programmed / reading |"
            " program ops / reading | erases / reading | power-on to first publish (ms, median) |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in apps.items():
        f = r["flash"]
        out.append(f"| {name} | {r['heap']:,} | {r['heap'] - r['low']:,} | {f['bytes']:.1f} | {f['programs']:.2f} |"
                   f" {f['erases']:.4f} | {r['boot_ms']:.0f} |")
    frozen, rom = smallest
    out += ["", f"Smallest heap the app runs in (qemu-m3-tight's settings, the heap given at each boot,"
            f" bisection in {a.step:,}-byte steps, 200 readings): frozen "
            + (f"{frozen:,} bytes" if frozen else "more than 32,768 bytes") + "; `tern` and the app in place from"
            " the ROMFS partition (a stock firmware) " + (f"{rom:,} bytes" if rom else "more than 65,536 bytes")
            + " (target: 32,768).",
            "", "The heap figures are the firmware's own, byte for byte as on a 32-bit board with the same build;"
            " the app's high-water mark is the profile's heap minus the lowest free heap seen after a"
            " `gc.collect()` at each reading."]
    out += ["", f"Time per QoS 1 message ({a.messages} each way, 64-byte payloads, MQTT 3.1.1; each board's own"
            " clock): publish = `publish()` of each, then `wait_all()`, divided by the count (window 8);"
            " receive = a backlog queued at the broker for the board's persistent session, drained from the"
            " CONNACK on, each message handled and acknowledged.", "",
            "| board | ms per QoS 1 publish | ms per received QoS 1 message |", "|---|---:|---:|"]
    for name, (tx, rx) in times.items():
        out.append(f"| {name} | {tx:.2f} | {rx:.2f} |")
    out += ["", "The qemu boards' times are QEMU's (TCG translating the guest's code on this host, the sockets"
            " carried over a UART by the harness), not a real microcontroller's: they compare code paths, not chips."]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
