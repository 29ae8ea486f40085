#!/usr/bin/env python3
"""CPU per message on the emulated microcontrollers of both ISAs, counted in instructions, not timed.

The stock qemu boards (qemu-m3-esp32: Arm Cortex-M3; qemu-rv32-c3: RISC-V RV32, the ESP32-C3's ISA)
run under QEMU with `-icount shift=0`: the guest clock advances one nanosecond per instruction
executed, and `qboard.icount()` reads the instructions executed (on the RV32 its instret counter,
exact; on the Cortex-M3 the MPS2's APB timer 0 at 25 MHz, one tick every 40 instructions), whatever
the host's load. Tern runs in place from the board's ROMFS partition (or, for the .mpy row, from
/lib). Each case runs on a fresh boot against a real Mosquitto over the link UART, side by side with
umqtt.simple (PyPI's micropython-umqtt.simple, the newest there, fetched through the package index
into tools/bench/.cache and sha256-checked; compiled to .mpy like Tern's). Waits for the broker are
kept off the clock: Tern's are outside the counted regions (the bytes are in the UART's receive ring
before the region that reads them starts), umqtt.simple's blocking reads go through a socket stand-in
over the UART that stops the count while it waits (the board's own sockets would count their waits).

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
PROFILES = ("qemu-m3-esp32", "qemu-rv32-c3")  # one per ISA
UMQTT = ("micropython-umqtt-simple", "micropython-umqtt.simple-1.3.4.tar.gz")
CACHE = Path(__file__).resolve().parent / ".cache"

# the counter and the umqtt.simple socket stand-in, first in every case's program
PRELUDE = """import gc, sys, emuboard, qboard, time
# umqtt.simple from ROMFS or /lib; tern from ROMFS, or /lib when a case puts it first
IC = qboard.icount
CAL = 0
def insns(a):   # instructions since a (qboard.icount() counts modulo 2**30)
    return ((IC() - a) & 0x3fffffff) - CAL
a = IC()
CAL = insns(a)   # what an empty region counts: taken off each region
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
            a = IC()
            while U.any() < n:
                pass
            Sock.idle += (IC() - a) & 0x3fffffff
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
    a = IC()
    c.publish('bench/tx', P)
    acc += insns(a)
print('COUNT', acc, {n})
""",
    "umqtt_qos0": """from umqtt.simple import MQTTClient
u = MQTTClient('cpu-u0', 'broker')
u.connect()
acc = 0
for i in range({n}):
    a = IC()
    u.publish(b'bench/tx', P)
    acc += insns(a)
print('COUNT', acc, {n})
""",
    "tern_qos1": """{path}
from tern.client import Client
{store}
c = Client('cpu-t1', stream=U{store_kw})
c.connect()
acc = 0
for i in range({n}):
    a = IC()
    pid = c.publish('bench/tx', P, qos=1)
    acc += insns(a)
    settle(4)
    a = IC()
    c.wait_published(pid)
    acc += insns(a)
print('COUNT', acc, {n})
""",
    "umqtt_qos1": """from umqtt.simple import MQTTClient
u = MQTTClient('cpu-u1', 'broker')
u.connect()
acc = 0
for i in range({n}):
    Sock.idle = 0
    a = IC()
    u.publish(b'bench/tx', P, qos=1)
    acc += insns(a) - Sock.idle
print('COUNT', acc, {n})
""",
    "tern_window": """{path}
from tern.client import Client
c = Client('cpu-tw', stream=U, window=8)
c.connect()
acc = 0
for r in range({n} // 8):
    a = IC()
    for i in range(8):
        c.publish('bench/tx', P, qos=1)
    acc += insns(a)
    settle(32)
    a = IC()
    c.wait_all(5)
    acc += insns(a)
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
{preload}k = len(got)
a = IC()
while len(got) < {m}:
    c.loop(0)
acc = insns(a)
print('COUNT', acc, {m} - k)
""",
    "umqtt_rx": """from umqtt.simple import MQTTClient
got = []
u = MQTTClient('cpu-ur', 'broker')
u.set_callback(lambda t, m: got.append(1))
u.connect(clean_session=False)
settle({rx_bytes})
Sock.idle = 0
a = IC()
while len(got) < {m}:
    u.wait_msg()
acc = insns(a) - Sock.idle
print('COUNT', acc, {m})
""",
    "tern_import": """{path}
a = IC()
from tern.client import Client
c = Client('cpu-ti', stream=U)
acc = insns(a)
print('COUNT', acc, 1)
""",
    "umqtt_import": """a = IC()
from umqtt.simple import MQTTClient
u = MQTTClient('cpu-ui', 'broker')
acc = insns(a)
print('COUNT', acc, 1)
""",
}

# The receive case's subscription is answered (SUBACK) inside its counted region; the check of the
# answer is in tern.replay, loaded when it runs (a .mpy load: about a million instructions, once per
# subscription, not per message). This row loads it once connected, before the count (a library
# without it: nothing).
PRELOAD = "try:\n    import tern.replay\nexcept ImportError:\n    pass\n"

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
    """One stock qemu board (profile) under -icount with Tern (and umqtt.simple) in its ROMFS
    partition and, for the .mpy case, Tern's package.json files in /lib; run(case) powers it on
    afresh and returns instructions per message."""

    def __init__(self, broker, workdir, profile=PROFILES[0], with_umqtt=True, with_mpy=True, compare=None):
        from ternlab.devset import app_romfs, compile_mpy

        self.broker = broker
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        # files go on before -icount is set, at full speed (a raw paste can time out on a loaded host);
        # every case then powers the board on afresh with -icount
        self.board = QemuBoard(profile, workdir=workdir / "board", board_id="cpu", link=broker.address)
        b = self.board
        arch = b.profile["arch"]
        extra = []
        if with_umqtt:
            (workdir / "umqtt_simple.mpy").write_bytes(_mpy(umqtt_source(), "umqtt/simple", workdir))
            extra.append((workdir / "umqtt_simple.mpy", "lib/umqtt/simple.mpy"))
        b.write_romfs(app_romfs(compile_mpy(workdir / ("mpy-" + arch), march=arch), extra))
        if with_mpy:
            for d in ("lib", "lib/tern"):
                if not b.exists(d):
                    b.mkdir(d)
            for p in sorted((ROOT / "mpy" / "tern").glob("*.mpy")):
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

    def run(self, case, n=48, m=16, store=("", ""), path="", preload=""):
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
                                            rx_bytes=m * 78, preload=preload)
        out = b.exec(prog, timeout=600)
        line = [x for x in out.splitlines() if x.startswith("COUNT")]
        if not line:
            raise RuntimeError("%s: no count: %s" % (case, out[-500:]))
        insns, msgs = (int(x) for x in line[0].split()[1:])
        return insns / msgs

    def close(self):
        self.board.close()


ROWS = [
    ("QoS 0 publish", "tern_qos0", "umqtt_qos0", {}),
    ("QoS 1 publish + its PUBACK, one at a time (MemoryStore)", "tern_qos1", "umqtt_qos1", {}),
    ("QoS 1, window 8 (MemoryStore)", "tern_window", None, {}),
    ("QoS 1 publish + its PUBACK, one at a time, FlashStore on the outbox partition", "tern_qos1", None,
     {"store": FLASH}),
    ("receive one QoS 1 message (handler + PUBACK)", "tern_rx", "umqtt_rx", {}),
    ("the same, tern.replay (the SUBACK's check) loaded before the count", "tern_rx", None, {"preload": PRELOAD}),
    ("import + Client(), in place from ROMFS", "tern_import", "umqtt_import", {}),
    ("import + Client(), .mpy from /lib (package.json)", "tern_import", None,
     {"path": "sys.path.insert(0, '/lib')"}),
]


def measure(n, m, workdir, profiles=PROFILES, compare=None):
    """{profile: [(label, tern, umqtt)]}, {profile: [(label, other, mine)]} (the A/B with --compare)"""
    out, abs_ = {}, {}
    with Broker(Path(workdir) / "broker") as broker:
        for prof in profiles:
            bench = Bench(broker, Path(workdir) / prof, prof, compare=compare)
            try:
                rows = []
                for label, tern, umqtt, kw in ROWS:
                    t = bench.run(tern, n=n, m=m, **kw)
                    u = bench.run(umqtt, n=n, m=m) if umqtt else None
                    print(prof, label, t, u, file=sys.stderr, flush=True)
                    rows.append((label, t, u))
                out[prof] = rows
                ab = []
                for label, tern, _, kw in ROWS[:6] if compare else ():
                    kw = dict(kw, path="sys.path.insert(0, '/lib')")
                    mine = bench.run(tern, n=n, m=m, **kw)
                    kw["path"] = "sys.path.insert(0, '/libcmp')"
                    other = bench.run(tern, n=n, m=m, **kw)
                    print(prof, label, "mpy", mine, "other", other, file=sys.stderr, flush=True)
                    ab.append((label, other, mine))
                abs_[prof] = ab
            finally:
                bench.close()
    return out, abs_


def render(res, a):
    today = datetime.date.today().isoformat()
    profs = list(res)
    out = ["## Instructions per message on the emulated microcontrollers, both ISAs (`tools/bench/cpu_bench.py`)", "",
           f"Command: `python tools/bench/cpu_bench.py --messages {a.messages} --received {a.received}"
           " --write docs/benchmarks.md` — " + today + ": the stock qemu boards (MicroPython v1.28.0's qemu"
           " port, nothing of Tern frozen): qemu-m3-esp32 (Arm Cortex-M3, qemu-system-arm) and qemu-rv32-c3"
           " (RISC-V RV32IMC, the ESP32-C3's ISA, qemu-system-riscv32), each under `-icount shift=0`, Tern in"
           " place from the board's ROMFS partition; Mosquitto on loopback over the link UART; MQTT 3.1.1,"
           " topic `bench/tx`, 64-byte payloads. Counted with `qboard.icount()` (RV32: the instret counter;"
           " Cortex-M3: APB timer 0 at 25 MHz, one tick every 40 instructions), each case on a fresh boot;"
           " the broker's round trips are off the clock. umqtt.simple is PyPI's `micropython-umqtt.simple`"
           " 1.3.4 (micropython-lib's v1.8.0 is not on PyPI, npm or Debian), compiled to .mpy with the same"
           " mpy-cross -O3, beside Tern in ROMFS.", "",
           "| case | " + " | ".join(f"Tern, {p} | umqtt.simple, {p}" for p in profs) + " |",
           "|---|" + "---:|---:|" * len(profs)]
    for i, (label, _, _) in enumerate(res[profs[0]]):
        cells = []
        for p in profs:
            _, t, u = res[p][i]
            cells += [f"{t:,.0f}", f"{u:,.0f}" if u is not None else "-"]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out += ["", "At 160 MHz (the ESP32's and the C3's default clock) and one instruction per cycle, 160"
            " instructions are a microsecond. A Cortex-M3, an Xtensa LX6 and the C3's RV32 core do not run"
            " MicroPython's VM at the same instructions per cycle (an ESP32 also waits for its flash cache"
            " on code not in IRAM), so the counts compare code paths; they do not predict a chip's time"
            " exactly. RV32 (compressed instructions, no conditional execution) takes more instructions than"
            " Thumb-2 for the same bytecode. Counts are deterministic for a given boot, but the heap's layout"
            " moves them by a few per cent between builds (a collection that falls inside a counted region"
            " costs what it scans)."]
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
        res, abs_ = measure(a.messages, a.received, tmp, compare=a.compare)
    text = render(res, a)
    print(text)
    for prof, ab in abs_.items():
        if not ab:
            continue
        print("\n%s, same firmware, the library from .mpy files: %s -> this checkout\n" % (prof, a.compare))
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
