#!/usr/bin/env python3
"""CPU per message on the emulated Cortex-M3, counted in instructions, not timed.

The qemu-m3-esp32 board runs under QEMU with `-icount shift=0`: the guest clock advances one
nanosecond per instruction executed, so the MPS2 board's spare APB timer (timer 0 at 0x40000000,
clocked at 25 MHz, counting down) read through `machine.mem32` advances once every 40 instructions,
whatever the host's load. Each case runs on a fresh boot against a real Mosquitto over the link UART,
side by side with umqtt.simple (PyPI's micropython-umqtt.simple, the newest there, fetched through the
package index into tools/bench/.cache and sha256-checked; compiled to .mpy like Tern's). Waits for the
broker are kept off the clock: Tern's are outside the counted regions (the bytes are in the UART's
receive ring before the region that reads them starts), umqtt.simple's blocking reads go through a
socket stand-in over the UART that stops the count while it waits.

    python tools/bench/cpu_bench.py                            # print the table
    python tools/bench/cpu_bench.py --write docs/benchmarks.md  # and rewrite its section
    python tools/bench/cpu_bench.py --compare /path/to/other/checkout   # and an A/B on one firmware

Two builds of the firmware lay the heap out differently, which moves every count by a few per cent
(umqtt.simple's, whose code is the same in both, too). --compare runs Tern's cases once more on the
same firmware with the library loaded from .mpy files: this checkout's mpy/ and the other's, in
turn, so that what differs is the library alone.
"""

import argparse
import datetime
import hashlib
import io
import re
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "lib"), str(Path(__file__).resolve().parent)]

from ternlab.boards.qemu import QemuBoard  # noqa: E402
from ternlab.brokers.mosquitto import Broker  # noqa: E402
from tern.client import Client  # noqa: E402

ICOUNT = ("-icount", "shift=0")
INSNS_PER_TICK = 40  # 1 ns per instruction, the timer at 25 MHz
UMQTT = ("micropython-umqtt-simple", "micropython-umqtt.simple-1.3.4.tar.gz")
CACHE = Path(__file__).resolve().parent / ".cache"

# the counter and the umqtt.simple socket stand-in, first in every case's program
PRELUDE = """import gc, sys, machine, emuboard, time
# umqtt from /lib (last on sys.path); tern from the firmware ('.frozen' comes first) unless a case puts /lib first
M = machine.mem32
M[0x40000000] = 0
M[0x40000008] = 0x3fffffff
M[0x40000004] = 0x3fffffff
M[0x40000000] = 1
TV = 0x40000004
CAL = 0
def ticks(a):   # timer ticks since reading a (the timer counts down from 0x3fffffff and reloads)
    return ((a - M[TV]) & 0x3fffffff) - CAL
a = M[TV]
CAL = ticks(a)   # what an empty region counts: taken off each region
U = emuboard.uart()
P = b'x' * 64
def settle(n):
    # off the clock: busy-wait (under -icount a sleep is a busy loop too) until the UART's receive
    # ring holds n bytes, or, for n = 0, until it has stopped growing
    last, k = -1, 0
    while True:
        x = U.any()
        if n and x >= n:
            return
        if x != last:
            last, k = x, 0
        else:
            k += 1
            if k > 100000 and (x or n):
                return
class Sock:
    idle = 0
    def connect(self, a):
        pass
    def setblocking(self, f):
        pass
    def close(self):
        pass
    def write(self, b, n=None):
        return U.write(b if n is None else memoryview(b)[:n])
    def read(self, n):
        if U.any() < n:
            a = M[TV]
            while U.any() < n:
                pass
            Sock.idle += (a - M[TV]) & 0x3fffffff
        return U.read(n)
class usocket:
    socket = Sock
    @staticmethod
    def getaddrinfo(h, p):
        return [(0, 0, 0, '', (h, p))]
sys.modules['usocket'] = usocket
"""

# each case prints "COUNT <ticks> <messages>"; N messages (or M received)
CASES = {
    "tern_qos0": """{path}
from tern.client import Client
c = Client('cpu-t0', stream=U)
c.connect()
acc = 0
for i in range({n}):
    a = M[TV]
    c.publish('bench/tx', P)
    acc += ticks(a)
print('COUNT', acc, {n})
""",
    "umqtt_qos0": """from umqtt.simple import MQTTClient
u = MQTTClient('cpu-u0', 'broker')
u.connect()
acc = 0
for i in range({n}):
    a = M[TV]
    u.publish(b'bench/tx', P)
    acc += ticks(a)
print('COUNT', acc, {n})
""",
    "tern_qos1": """{path}
from tern.client import Client
{store}
c = Client('cpu-t1', stream=U{store_kw})
c.connect()
acc = 0
for i in range({n}):
    a = M[TV]
    pid = c.publish('bench/tx', P, qos=1)
    acc += ticks(a)
    settle(4)
    a = M[TV]
    c.wait_published(pid)
    acc += ticks(a)
print('COUNT', acc, {n})
""",
    "umqtt_qos1": """from umqtt.simple import MQTTClient
u = MQTTClient('cpu-u1', 'broker')
u.connect()
acc = 0
for i in range({n}):
    Sock.idle = 0
    a = M[TV]
    u.publish(b'bench/tx', P, qos=1)
    acc += ticks(a) - Sock.idle
print('COUNT', acc, {n})
""",
    "tern_window": """{path}
from tern.client import Client
c = Client('cpu-tw', stream=U, window=8)
c.connect()
acc = 0
for r in range({n} // 8):
    a = M[TV]
    for i in range(8):
        c.publish('bench/tx', P, qos=1)
    acc += ticks(a)
    settle(32)
    a = M[TV]
    c.wait_all(5)
    acc += ticks(a)
print('COUNT', acc, {n} // 8 * 8)
""",
    # the host queued M QoS 1 messages for this persistent session while it was away
    "tern_rx": """{path}
from tern.client import Client
got = []
c = Client('cpu-tr', stream=U, clean=False)
c.subscribe('bench/rx', 1, handler=lambda m: got.append(1))
c.connect()
settle(0)
k = len(got)
a = M[TV]
while len(got) < {m}:
    c.loop(0)
acc = ticks(a)
print('COUNT', acc, {m} - k)
""",
    "umqtt_rx": """from umqtt.simple import MQTTClient
got = []
u = MQTTClient('cpu-ur', 'broker')
u.set_callback(lambda t, m: got.append(1))
u.connect(clean_session=False)
settle({rx_bytes})
Sock.idle = 0
a = M[TV]
while len(got) < {m}:
    u.wait_msg()
acc = ticks(a) - Sock.idle
print('COUNT', acc, {m})
""",
    "tern_import": """{path}
a = M[TV]
from tern.client import Client
c = Client('cpu-ti', stream=U)
acc = ticks(a)
print('COUNT', acc, 1)
""",
    "umqtt_import": """a = M[TV]
from umqtt.simple import MQTTClient
u = MQTTClient('cpu-ui', 'broker')
acc = ticks(a)
print('COUNT', acc, 1)
""",
}

FLASH = ("from tern.flashstore import FlashStore\nst = FlashStore(emuboard.partition('outbox'))", ", store=st")


def umqtt_source():
    """umqtt/simple.py from PyPI's sdist (the package index, as pip reads it; sha256 checked)."""
    name, fname = UMQTT
    dest = CACHE / fname
    if not dest.is_file():
        page = urllib.request.urlopen("https://pypi.org/simple/%s/" % name, timeout=30).read().decode()
        link = [u for u in re.findall(r'href="([^"]+)"', page) if fname in u][0]
        url, _, sha = link.partition("#sha256=")
        data = urllib.request.urlopen(url, timeout=60).read()
        if hashlib.sha256(data).hexdigest() != sha:
            raise RuntimeError("%s: sha256 does not match the index's" % fname)
        CACHE.mkdir(exist_ok=True)
        dest.write_bytes(data)
    with tarfile.open(fileobj=io.BytesIO(dest.read_bytes())) as t:
        member = [n for n in t.getnames() if n.endswith("umqtt/simple.py")][0]
        return t.extractfile(member).read()


def _mpy(src, name, tmp):
    from ternlab.devset import mpy_cross

    s, o = tmp / (name.replace("/", "_") + ".py"), tmp / (name.replace("/", "_") + ".mpy")
    s.write_bytes(src)
    mpy_cross(s, o, name + ".py")
    return o.read_bytes()


class Bench:
    """One qemu-m3-esp32 board under -icount with umqtt.simple (and, for the .mpy case, Tern's
    package.json files) on its filesystem; run(case) powers it on afresh and returns instructions
    per message."""

    def __init__(self, broker, workdir, with_umqtt=True, with_mpy=True, compare=None):
        self.broker = broker
        # files go on before -icount is set, at full speed (a raw paste can time out on a loaded host);
        # every case then powers the board on afresh with -icount
        self.board = QemuBoard("qemu-m3-esp32", workdir=workdir, board_id="cpu", link=broker.address)
        b = self.board
        for d in ("lib", "lib/umqtt", "lib/tern"):
            if not b.exists(d):
                b.mkdir(d)
        if with_umqtt:
            b.write_file("lib/umqtt/simple.mpy", _mpy(umqtt_source(), "umqtt/simple", Path(workdir)))
        for p in sorted((ROOT / "mpy" / "tern").glob("*.mpy")) if with_mpy else ():
            b.write_file("lib/tern/" + p.name, p.read_bytes())
        if compare:  # the other checkout's library, in a folder of its own
            for d in ("libcmp", "libcmp/tern"):
                if not b.exists(d):
                    b.mkdir(d)
            for p in sorted((Path(compare) / "mpy" / "tern").glob("*.mpy")):
                b.write_file("libcmp/tern/" + p.name, p.read_bytes())
        b.qemu_args = list(ICOUNT)

    def queue(self, client_id, m, subscribe):
        """The host's part of a receive case: the session subscribed once, then M messages queued."""
        q = Client("cpu-host", server=self.broker.host, port=self.broker.port)
        q.connect()
        for i in range(m):
            q.publish("bench/rx", b"y" * 64, qos=1)
        q.wait_all(30)
        q.disconnect()

    def run(self, case, n=48, m=16, store=("", ""), path=""):
        b = self.board
        if case in ("tern_rx", "umqtt_rx"):  # a persistent session subscribed to bench/rx, then a backlog
            b.power_cycle()
            cid = "cpu-tr" if case == "tern_rx" else "cpu-ur"
            b.exec(PRELUDE + "from tern.client import Client\n"
                   "c = Client(%r, stream=U, clean=False)\n"
                   "c.connect()\nc.subscribe('bench/rx', 1)\nc.disconnect()\n" % cid, timeout=60)
            self.queue(cid, m, True)
        b.power_cycle()
        prog = PRELUDE + CASES[case].format(n=n, m=m, store=store[0], store_kw=store[1], path=path,
                                            rx_bytes=m * 78)
        out = b.exec(prog, timeout=600)
        line = [x for x in out.splitlines() if x.startswith("COUNT")]
        if not line:
            raise RuntimeError("%s: no count: %s" % (case, out[-500:]))
        ticks, msgs = (int(x) for x in line[0].split()[1:])
        return ticks * INSNS_PER_TICK / msgs

    def close(self):
        self.board.close()


ROWS = [
    ("QoS 0 publish", "tern_qos0", "umqtt_qos0", {}),
    ("QoS 1 publish + its PUBACK, one at a time (MemoryStore)", "tern_qos1", "umqtt_qos1", {}),
    ("QoS 1, window 8 (MemoryStore)", "tern_window", None, {}),
    ("QoS 1 publish + its PUBACK, one at a time, FlashStore on the outbox partition", "tern_qos1", None,
     {"store": FLASH}),
    ("receive one QoS 1 message (handler + PUBACK)", "tern_rx", "umqtt_rx", {}),
    ("import + Client(), frozen", "tern_import", "umqtt_import", {}),
    ("import + Client(), .mpy from /lib (package.json)", "tern_import", None,
     {"path": "sys.path.insert(0, '/lib')"}),
]


def measure(n, m, workdir, compare=None):
    with Broker(Path(workdir) / "broker") as broker:
        bench = Bench(broker, Path(workdir) / "board", compare=compare)
        try:
            rows = []
            for label, tern, umqtt, kw in ROWS:
                t = bench.run(tern, n=n, m=m, **kw)
                u = bench.run(umqtt, n=n, m=m) if umqtt else None
                print(label, t, u, file=sys.stderr, flush=True)
                rows.append((label, t, u))
            ab = []
            for label, tern, _, kw in ROWS[:5] if compare else ():
                kw = dict(kw, path="sys.path.insert(0, '/lib')")
                mine = bench.run(tern, n=n, m=m, **kw)
                kw["path"] = "sys.path.insert(0, '/libcmp')"
                other = bench.run(tern, n=n, m=m, **kw)
                print(label, "mpy", mine, "other", other, file=sys.stderr, flush=True)
                ab.append((label, other, mine))
            return rows, ab
        finally:
            bench.close()


def render(rows, a):
    today = datetime.date.today().isoformat()
    out = ["## Instructions per message on the emulated Cortex-M3 (`tools/bench/cpu_bench.py`)", "",
           f"Command: `python tools/bench/cpu_bench.py --messages {a.messages} --received {a.received}"
           " --write docs/benchmarks.md` — " + today + ": the qemu-m3-esp32 board (MicroPython v1.28.0's qemu"
           " port, Cortex-M3, 110,000-byte heap, `tern` frozen in) under qemu-system-arm with `-icount shift=0`,"
           " Mosquitto on loopback over the link UART; MQTT 3.1.1, topic `bench/tx`, 64-byte payloads. Counted"
           " on the board's APB timer 0 (25 MHz = one tick every 40 instructions), each case on a fresh boot;"
           " the broker's round trips are off the clock. umqtt.simple is PyPI's `micropython-umqtt.simple`"
           " 1.3.4 (micropython-lib's v1.8.0 is not on PyPI, npm or Debian), compiled to .mpy with the same"
           " mpy-cross -O3.", "",
           "| case | Tern (instructions) | umqtt.simple (instructions) | Tern at 160 MHz (µs) |",
           "|---|---:|---:|---:|"]
    for label, t, u in rows:
        out.append(f"| {label} | {t:,.0f} | {f'{u:,.0f}' if u is not None else '-'} | {t / 160:,.0f} |")
    out += ["", "At 160 MHz (an ESP32's default clock) and taking one instruction per cycle, 160 instructions"
            " are a microsecond: the µs column is that lower bound. A Cortex-M3 and an Xtensa LX6 do not run"
            " MicroPython's VM at the same instructions per cycle (the ESP32 also waits for its flash cache"
            " on code not in IRAM), so the counts compare code paths on one machine; they do not predict a"
            " chip's time exactly. Counts are deterministic for a given boot, but the heap's layout moves them"
            " by a few per cent between builds (a collection that falls inside a counted region costs what it"
            " scans)."]
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=48, help="messages published per case (default 48)")
    ap.add_argument("--received", type=int, default=16,
                    help="messages received per case (default 16; at most 20, Mosquitto's max_inflight_messages:"
                         " more would wait for the broker inside the counted region)")
    ap.add_argument("--write", metavar="FILE", help="rewrite this file's cpu_bench section")
    ap.add_argument("--compare", metavar="DIR", help="another checkout (its mpy/tern): Tern's cases again on the "
                                                     "same firmware, this library and that one loaded from .mpy")
    a = ap.parse_args(argv)
    if a.compare and not (Path(a.compare) / "mpy" / "tern" / "client.mpy").is_file():
        ap.error("--compare %s: no mpy/tern/client.mpy there" % a.compare)
    with tempfile.TemporaryDirectory() as tmp:
        rows, ab = measure(a.messages, a.received, tmp, a.compare)
    text = render(rows, a)
    print(text)
    if ab:
        print("\nSame firmware, the library from .mpy files: %s -> this checkout\n" % a.compare)
        print("| case | %s (instructions) | this checkout (instructions) | change |" % Path(a.compare).name)
        print("|---|---:|---:|---:|")
        for label, other, mine in ab:
            print("| %s | %s | %s | %+.1f%% |" % (label, f"{other:,.0f}", f"{mine:,.0f}", (mine / other - 1) * 100))
    if a.write:
        from benchdoc import write_section

        write_section(a.write, "cpu_bench", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
