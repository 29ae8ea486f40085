"""Flash cost of the outbox per QoS 1 message, side by side, on the emulated NOR
flash (64 x 4 KiB sectors), measured under the MicroPython unix port.

    .venv/bin/python tools/bench/flash_bench.py [--messages N] [--write docs/benchmarks.md]

Per message: append a ~80-byte QoS 1 PUBLISH (64-byte payload), release it on
PUBACK (a window of up to 4 in flight). Stores compared after a warm-up that
wraps each one's storage at least once (steady state):
  - FlashStore, in-place acks and appended acks (raw partition);
  - FileStore on LittleFS (vfs.VfsLfs2 over the same emulated flash);
  - a naive store: one file per message on LittleFS, deleted on PUBACK.
Also: boot (recovery) time of a full 64-sector FlashStore partition, RAM per
pending message (gc.mem_alloc delta / pending), append throughput with and
without group commit (emulated flash: Python-speed flash, not real timing).

The measuring runs in the MicroPython child (this same file with --inner);
the CPython parent adds the POSIX FileStore fsync figures and writes the
table into the flash_bench section of docs/benchmarks.md.
"""

import sys

MICROPYTHON = sys.implementation.name == "micropython"


def _root():
    here = __file__ if "/" in __file__ else "./" + __file__
    return (here.rpartition("/")[0] or ".") + "/../.."


ROOT = _root()
if ROOT + "/lib" not in sys.path:
    sys.path.insert(0, ROOT + "/lib")
if not MICROPYTHON:  # MicroPython has norflash on its MICROPYPATH (set from device_path when launched here)
    from ternlab.paths import use_device

    use_device("norflash")

import os  # noqa: E402
import time  # noqa: E402

from norflash import NorFlash  # noqa: E402
from tern.store import PUBLISH  # noqa: E402
from tern.flashstore import FlashStore  # noqa: E402
from tern.filestore import FileStore  # noqa: E402

BLOCKS = 64
TOPIC = b"tern/bench/t1"  # 13 bytes
PAYLOAD = bytes(range(64))
# fixed header (2) + topic length (2) + topic (13) + packet id (2) + payload (64) = 83 bytes
HEAD = bytearray(b"\x32\x51\x00\x0d" + TOPIC + b"\x00\x00")
PACKET = len(HEAD) + len(PAYLOAD)
RECORD = 16 + PACKET + 4  # FlashStore record: header + packet + CRC
WINDOW = 4
LFS = {"readsize": 32, "progsize": 32, "lookahead": 32}


def now_us():
    if MICROPYTHON:
        return time.ticks_us()
    return int(time.perf_counter() * 1e6)


def since_us(t0):
    if MICROPYTHON:
        return time.ticks_diff(time.ticks_us(), t0)
    return now_us() - t0


def tmp(tag):
    return "/tmp/tern-bench-%s-%s" % (tag, "".join("%02x" % b for b in os.urandom(4)))


def rm(p):
    for q in (p, p + ".wear"):
        try:
            os.remove(q)
        except OSError:
            pass


def workload(st, n, start):
    """n QoS 1 messages through st, at most WINDOW in flight."""
    window = []
    for i in range(n):
        pid = (start + i) % 65535 + 1
        HEAD[-2] = pid >> 8
        HEAD[-1] = pid & 0xFF
        st.append(PUBLISH, pid, HEAD, PAYLOAD)
        window.append(pid)
        if len(window) >= WINDOW:
            st.release(window.pop(0))
    for pid in window:
        st.release(pid)
    return start + n


class NaiveStore:
    """One file per message on a filesystem, deleted when acknowledged."""

    def __init__(self, path):
        self.path = path
        try:
            os.mkdir(path)
        except OSError:
            pass

    def append(self, kind, pid, head, body):
        with open("%s/%d" % (self.path, pid), "wb") as f:
            f.write(head)
            f.write(body)

    def release(self, pid):
        os.remove("%s/%d" % (self.path, pid))


def measure(name, dev, st, n):
    workload(st, 3 * BLOCKS * 4096 // RECORD, 0)  # warm-up: wrap the storage
    c0 = dev.counters()
    t0 = now_us()
    workload(st, n, 40000)
    us = since_us(t0)
    c1 = dev.counters()
    prog = c1["bytes_programmed"] - c0["bytes_programmed"]
    ops = c1["programs"] - c0["programs"]
    er = c1["erases_total"] - c0["erases_total"]
    return {
        "name": name,
        "bytes_per_msg": prog / n,
        "programs_per_msg": ops / n,
        "erases_per_msg": er / n,
        "msgs_per_s": n * 1e6 / us,
    }


def mount_lfs(dev, mp):
    import vfs

    vfs.VfsLfs2.mkfs(dev, **LFS)
    vfs.mount(vfs.VfsLfs2(dev, **LFS), mp)


def inner(n):
    import gc
    import json
    import vfs

    res = {"messages": n, "packet": PACKET, "record": RECORD, "rows": []}
    # raw partition
    for acks in (False, True):
        p = tmp("fs")
        dev = NorFlash(p, blocks=BLOCKS, fresh=True)
        st = FlashStore(dev, append_acks=acks).open()
        res["rows"].append(measure("FlashStore, %s acks" % ("appended" if acks else "in-place"), dev, st, n))
        dev.close()
        rm(p)
    # FileStore and the naive store on LittleFS over the same flash
    for kind in ("file", "naive"):
        p = tmp(kind)
        mp = "/bench" + kind
        dev = NorFlash(p, blocks=BLOCKS, fresh=True)
        mount_lfs(dev, mp)
        if kind == "file":
            st = FileStore(mp + "/outbox").open()
            label = "FileStore on LittleFS (VfsLfs2)"
        else:
            st = NaiveStore(mp + "/msgs")
            label = "one file per message on LittleFS"
        res["rows"].append(measure(label, dev, st, n // 2))
        vfs.umount(mp)
        dev.close()
        rm(p)
    # boot time of a full partition: (a) history with a small window, (b) all pending
    for full in (False, True):
        p = tmp("boot")
        dev = NorFlash(p, blocks=BLOCKS, fresh=True)
        st = FlashStore(dev).open()
        if full:
            pid = 0
            try:
                while True:
                    pid += 1
                    HEAD[-2] = pid >> 8
                    HEAD[-1] = pid & 0xFF
                    st.append(PUBLISH, pid, HEAD, PAYLOAD)
            except OSError:
                pass
        else:
            workload(st, 3 * BLOCKS * 4096 // RECORD, 0)
            for pid in range(1, 5):
                st.append(PUBLISH, pid, HEAD, PAYLOAD)
        dev.close()
        dev = NorFlash(p, blocks=BLOCKS)
        gc.collect()
        t0 = now_us()
        st = FlashStore(dev).open()
        us = since_us(t0)
        res["boot_full" if full else "boot_window"] = {
            "ms": us / 1000,
            "pending": st.count(),
            "sectors_scanned": st.stats["sectors_scanned"],
            "bytes_read": st.stats["bytes_read"],
        }
        dev.close()
        rm(p)
    # RAM per pending message
    dev = NorFlash(None, blocks=BLOCKS)
    st = FlashStore(dev).open()
    gc.collect()
    a0 = gc.mem_alloc()
    k = 2000
    for pid in range(1, k + 1):
        st.append(PUBLISH, pid, HEAD, PAYLOAD)
    gc.collect()
    res["ram_per_pending"] = (gc.mem_alloc() - a0) / k
    res["ram_pending"] = k
    # append throughput, one durable write per append vs group commit of 8
    thr = {}
    for label, mk in (
        ("FlashStore", lambda d, g: FlashStore(d, group_commit=g, group_bytes=1024)),
        ("FileStore on LittleFS", None),
    ):
        for g in (False, True):
            p = tmp("thr")
            dev = NorFlash(p, blocks=BLOCKS, fresh=True)
            if mk is None:
                mount_lfs(dev, "/benchthr")
                st = FileStore("/benchthr/outbox", group_commit=g).open()
            else:
                st = mk(dev, g).open()
            m = 1600 if mk else 400
            t0 = now_us()
            for i in range(m):
                pid = i + 1
                st.append(PUBLISH, pid, HEAD, PAYLOAD)
                if g and i % 8 == 7:
                    st.commit()
                if i >= 16:
                    st.release(pid - 16)
            st.commit()
            us = since_us(t0)
            thr["%s, %s" % (label, "group commit of 8" if g else "durable each append")] = m * 1e6 / us
            if mk is None:
                vfs.umount("/benchthr")
            dev.close()
            rm(p)
    res["throughput"] = thr
    print("BENCH-JSON " + json.dumps(res))


def posix_throughput():
    import shutil
    import tempfile

    out = {}
    for g in (False, True):
        d = tempfile.mkdtemp(prefix="tern-bench-")
        try:
            st = FileStore(d + "/outbox", group_commit=g).open()
            m = 400
            t0 = now_us()
            for i in range(m):
                st.append(PUBLISH, i + 1, HEAD, PAYLOAD)
                if g and i % 8 == 7:
                    st.commit()
                if i >= 16:
                    st.release(i + 1 - 16)
            st.commit()
            out["FileStore on POSIX (CPython, fsync), %s" % ("group commit of 8" if g else "durable each append")] = (
                m * 1e6 / since_us(t0)
            )
            st.close()
        finally:
            shutil.rmtree(d)
    return out


def render(res, cmd, date):
    rows = res["rows"]
    fl = rows[0]
    lfs = rows[2]
    out = []
    out.append("## Flash cost of the outbox (`tools/bench/flash_bench.py`)")
    out.append("")
    out.append("Command: `%s` — run %s, MicroPython unix port, emulated NOR flash of %d x 4 KiB sectors." % (cmd, date, BLOCKS))
    out.append(
        "Per QoS 1 message: one %d-byte PUBLISH packet (64-byte payload) appended, released on PUBACK, "
        "at most %d in flight; measured over %d messages (%d for the LittleFS stores) after a warm-up "
        "that wraps the storage." % (res["packet"], WINDOW, res["messages"], res["messages"] // 2)
    )
    out.append("")
    out.append("| store | bytes programmed / msg | program ops / msg | erases / msg | x physical min bytes | msgs/s (emulated) |")
    out.append("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        out.append(
            "| %s | %.1f | %.2f | %.4f | %.2f | %.0f |"
            % (r["name"], r["bytes_per_msg"], r["programs_per_msg"], r["erases_per_msg"], r["bytes_per_msg"] / res["record"], r["msgs_per_s"])
        )
    out.append("")
    out.append(
        "Physical minimum: the record programmed once = %d bytes (16-byte header + %d-byte packet + 4-byte CRC; "
        "the packet alone is %d), and record/4096 = %.4f erases per message."
        % (res["record"], res["packet"], res["packet"], res["record"] / 4096.0)
    )
    out.append(
        "FlashStore (in-place acks): %.2fx the record bytes (%.2fx the bare packet); %.1fx fewer erases than "
        "FileStore on LittleFS, %.1fx fewer than one file per message."
        % (
            fl["bytes_per_msg"] / res["record"],
            fl["bytes_per_msg"] / res["packet"],
            lfs["erases_per_msg"] / fl["erases_per_msg"] if fl["erases_per_msg"] else float("inf"),
            rows[3]["erases_per_msg"] / fl["erases_per_msg"] if fl["erases_per_msg"] else float("inf"),
        )
    )
    out.append("")
    b1, b2 = res["boot_window"], res["boot_full"]
    out.append("| boot (open) of a 64-sector FlashStore | time | pending | sectors scanned | bytes read |")
    out.append("|---|---:|---:|---:|---:|")
    out.append("| log wrapped 3x, 4 pending | %.1f ms | %d | %d | %d |" % (b1["ms"], b1["pending"], b1["sectors_scanned"], b1["bytes_read"]))
    out.append("| partition full of pending messages | %.1f ms | %d | %d | %d |" % (b2["ms"], b2["pending"], b2["sectors_scanned"], b2["bytes_read"]))
    out.append("")
    out.append(
        "RAM per pending message (FlashStore index, gc.mem_alloc delta over %d pending): %.2f bytes."
        % (res["ram_pending"], res["ram_per_pending"])
    )
    out.append("")
    out.append("| append throughput | appends/s |")
    out.append("|---|---:|")
    for k in sorted(res["throughput"]):
        out.append("| %s | %.0f |" % (k, res["throughput"][k]))
    out.append("")
    out.append(
        "Append throughput calls the stores directly (group commit: `commit()` after every 8 appends). "
        "Through the client, `publish()` commits each message before it returns, online or offline, so "
        "there group commit only lets acknowledgements and other small records share the next write."
    )
    out.append("")
    out.append(
        "The emulated flash runs at Python speed and writes through to a file, so throughput and boot times "
        "compare the stores' work, not real flash timing (real NOR: ~0.5 ms per 256-byte page program, "
        "tens of ms per sector erase — which is what the erase counts above cost)."
    )
    return "\n".join(out)


def write_section(path, text):
    from benchdoc import write_section as write

    write(path, "flash_bench", text)


def main(argv):
    if MICROPYTHON:  # the measuring child: `flash_bench.py --inner --messages N`
        inner(int(argv[argv.index("--messages") + 1]))
        return
    import argparse

    ap = argparse.ArgumentParser(description="Flash cost of the outbox per QoS 1 message, side by side with "
                                             "LittleFS stores (runs the measurement in the MicroPython unix port).")
    ap.add_argument("--messages", type=int, default=3000, help="messages per store (default 3000)")
    ap.add_argument("--write", metavar="FILE", help="rewrite this file's flash_bench section")
    a = ap.parse_args(argv)
    if a.messages < 1:
        ap.error("--messages must be at least 1")
    n = a.messages
    import datetime
    import json
    import subprocess

    exe = os.path.join(os.path.dirname(sys.executable), "micropython")
    from ternlab.paths import device_path

    env = dict(os.environ, MICROPYPATH=":".join([ROOT + "/lib"] + device_path("norflash")))
    proc = subprocess.run([exe, "-X", "heapsize=16m", __file__, "--inner", "--messages", str(n)], env=env, capture_output=True, text=True)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH-JSON ")]
    if proc.returncode or not line:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit("the MicroPython run failed")
    res = json.loads(line[-1][len("BENCH-JSON ") :])
    res["throughput"].update(posix_throughput())
    cmd = "python tools/bench/flash_bench.py" + (" --messages %d" % n if n != 3000 else "")
    text = render(res, cmd, datetime.date.today().isoformat())
    print(text)
    if a.write:
        write_section(a.write, text)


if __name__ == "__main__":
    main(sys.argv[1:])
