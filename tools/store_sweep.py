"""Full crash-point sweep of the durable stores: a power cut at EVERY flash (or
file) operation of a scripted workload, then reboot and check.

    .venv/bin/python -m tools.store_sweep [--quick] [--only NAME[,NAME]] [--seed N] [--write docs/benchmarks.md]

(from the checkout's root: the engine is imported as the package tests.lib, no sys.path edit.)

Targets (the engine is tests/lib/storecut.py on the rigs of tests/lib/kit.py):
  flash        FlashStore, in-place acks, emulated NOR flash (4 x 4 KiB sectors)
  flash-acks   FlashStore, appended acks, same flash
  flash-small  FlashStore, in-place acks, 4 x 1 KiB sectors (many reclaims)
  posix        FileStore on POSIX files (cut at the k-th write/sync/remove;
               unsynced bytes lost at random)
  lfs          FileStore on LittleFS over the emulated NOR flash, under the
               MicroPython unix port's vfs.VfsLfs2 (run as a child process)
  lfs-host     the same on CPython with littlefs-python
  flash-full   FlashStore filled until it refuses an append, then the acks of a
               full outbox: PUBRECs, in_clear, unmarks, mark cycles, PUBACKs
               (4 x 1 KiB sectors; in-place acks, then appended acks)
  posix-full   the same full-outbox workload on FileStore over POSIX files
               (max_bytes=6000, 500-byte segments: compaction under acks)
  lfs-host-full  the same on LittleFS (littlefs-python, 16 blocks): ~50,000
               flash operations, so use --quick unless you have hours
  session-edge the real Session at the capacity edge (tests/lib/model.py on the
               kit's rigs and broker model): subscriptions registered offline, the outbox
               filled offline, connect (no broker session), acks withheld, the
               outbox full again, an unsubscribe waiting, inbound QoS 2, a
               reconnect with the session, one without it; then drained. A cut
               at every operation, on FlashStore (4 x 1 KiB sectors) and
               FileStore on POSIX (max_bytes=4000), MQTT 3.1.1 with max_pending
               4 and MQTT 5 with 8; the model's invariants after every step.
  group-flash, group-flash-acks, group-posix, group-lfs
               the write-ahead rule under group commit (tests/lib/walsweep.py on
               tests/lib/model.py's engine): a real Client on FlashStore in place /
               with appended acks / FileStore on POSIX / FileStore on LittleFS
               (littlefs-python), all with group_commit=True, against a broker
               model that keeps its session; a cut at every operation of the
               medium and right after every packet the client sends; checked at
               each reboot that no packet's announced state (record, mark,
               inbound id, its release) was lost, and at the end exactly-once /
               at-least-once delivery both ways, in order.
  faults-flash, faults-flash-acks, faults-group-flash, faults-group-flash-acks,
  faults-posix, faults-group-posix, faults-lfs, faults-group-lfs
               storage that fails and returns (issue 35), the same workload and
               checks: at every storage operation (program, erase; write, sync,
               file create, remove) the medium raises OSError before any byte
               lands, after all did, or torn, once or until the workload ends
               (six runs per operation); besides, a publish() that raised never
               reaches the broker, and once the fault is gone the store takes
               messages again without a reboot.
  flash-wrap   FlashStore, in-place acks, 4 x 1 KiB sectors, started with its
               counters just before their wraps (tests/lib/kit.py
               flash_near_wraps: record sequence 2^32 - 41, sector sequence 2^32 - 3,
               last packet id 65500): all three wrap inside the workload
  flash-acks-wrap  the same with appended acks
  posix-wrap   FileStore on POSIX files (1 KiB segments, max_segments 3),
               record sequence 2^32 - 41, segment number 99999997, last packet
               id 65500: all three wrap inside the workload
  flash-stale, flash-acks-stale, posix-stale  a message never acknowledged,
               then the record sequence 2^28 + 5 further on, then the
               workload: the stuck message's next relocation gives it a
               fresh sequence (a scan that finds both copies keeps the new)

Prints each failing cut point and a summary per target; exit status 1 if any
cut point failed. The goal is zero. --write FILE puts the summary in FILE's
store_sweep section (the targets of that run), or its store_sweep_group
section when only group-* targets ran.
"""

import sys
import time

try:
    import os
except ImportError:  # pragma: no cover
    import uos as os

try:
    if sys.implementation.name != "micropython":  # (MicroPython's MICROPYPATH has norflash and cutfs: main)
        from ternlab.paths import use_device

        use_device("testing")
    from tests.lib import kit, storecut, walsweep
except ImportError as e:  # (run as a file, not as tools.store_sweep from the checkout's root)
    raise SystemExit("store_sweep: run it from the checkout's root as `python -m tools.store_sweep` (%s)" % e)

MICROPYTHON = sys.implementation.name == "micropython"
ROOT = (__file__.rpartition("/")[0] or ".") + "/.."  # the checkout (the lfs target's MICROPYPATH)

TARGETS = ("flash", "flash-acks", "flash-small", "posix", "lfs", "lfs-host", "flash-full", "posix-full", "lfs-host-full",
           "session-edge", "group-flash", "group-flash-acks", "group-posix", "group-lfs", "flash-wrap",
           "flash-acks-wrap", "posix-wrap", "flash-stale", "flash-acks-stale", "posix-stale", "faults-flash",
           "faults-flash-acks", "faults-group-flash", "faults-group-flash-acks", "faults-posix", "faults-group-posix",
           "faults-lfs", "faults-group-lfs")

# The capacity-edge workload of session-edge, in tests/lib/model.py's steps.
EDGE = [("sub", 0), ("sub", 1), ("sub", 2), ("fill", 160), ("connect",), ("net",), ("hold",), ("fill", 0),
        ("unsub", 1), ("in", 2, True), ("drop",), ("connect",), ("net",), ("forget",), ("drop",), ("connect",),
        ("in", 2, False), ("ack",), ("fill", 40), ("net",), ("drop",), ("connect",), ("net",)]


def edge_ops(rig_name, v, mp):
    """Store operations of a clean run of EDGE, settled (drain() then cuts the power and reboots, and
    a new medium's count starts at 0: counted after it, the sweep cut at a handful of points)."""
    from tests.lib import model

    r = model.Run(model.RIGS[rig_name](), v, mp)
    try:
        for st in EDGE:
            r.step(st)
        r.settle()
        return r.rig.ops()
    finally:
        r.rig.cleanup()


def run_edge(seed, quick):
    from tests.lib import model

    t0 = time.time()
    nks = 0
    fails = 0
    for rig_name in ("flash", "file"):
        for v, mp in ((4, 4), (5, 8)):
            total = edge_ops(rig_name, v, mp)
            ks = kit.sample(total, 200, seed) if quick else list(range(1, total + 1))
            print("session-edge %s MQTT %d max_pending %d: %d operations; cutting at %d points"
                  % (rig_name, v, mp, total, len(ks)))

            def one(k):
                err = model.run(rig_name, seed, [("cut", k)] + EDGE, v, mp)
                return err and "session-edge %s v%d mp%d k=%d: %s" % (rig_name, v, mp, k, err)

            fails += len(kit.sweep(ks, one, print))
            nks += len(ks)
    print("RESULT %s: %d cut points, %d failures, %.1f s" % ("session-edge", nks, fails, time.time() - t0))
    return nks, fails


GROUP = {}  # group-* target -> (operations cut at, packets cut after)


def run_group(name, quick):
    t0 = time.time()
    ops, pkts = walsweep.totals(name)
    ks = kit.sample(ops, 200, 1) if quick else list(range(1, ops + 1))
    print("%s: %d medium operations, %d packets; cutting at %d operations and after %d packets"
          % (name, ops, pkts, len(ks), pkts))
    found = walsweep.sweep(name, ks, range(1, pkts + 1), report=print)
    n = len(ks) + pkts
    GROUP[name] = (len(ks), pkts)
    print("RESULT %s: %d cut points, %d failures, %.1f s" % (name, n, len(found), time.time() - t0))
    return n, len(found)


FAULTS = {}  # faults-* target -> storage operations failed at


def run_faults(name, quick):
    t0 = time.time()
    rig = name[len("faults-"):]
    ops = walsweep.fault_ops(rig)
    ks = kit.sample(ops, 40, 1) if quick else list(range(1, ops + 1))
    print("%s: %d storage operations; a failure at %d of them, %d ways each" % (name, ops, len(ks), len(walsweep.MODES)))
    found = walsweep.fault_sweep(rig, ks, report=print)
    FAULTS[name] = len(ks)
    n = len(ks) * len(walsweep.MODES)
    print("RESULT %s: %d fault points, %d failures, %.1f s" % (name, n, len(found), time.time() - t0))
    return n, len(found)


# target -> (the kit's rig class, its options, the workload's size: scripted calls)
SCRIPTED = {
    "flash-stale": (kit.FlashRig, {}, 300),
    "flash-acks-stale": (kit.FlashRig, {"append_acks": True}, 300),
    "posix-stale": (kit.FileRig, {"segment_bytes": 1024, "max_segments": 3}, 300),
    "flash-wrap": (kit.FlashRig, {"wraps": True}, 420),
    "flash-acks-wrap": (kit.FlashRig, {"wraps": True, "append_acks": True}, 420),
    "posix-wrap": (kit.FileRig, {"wraps": True, "segment_bytes": 1024, "max_segments": 3}, 300),
    "flash": (kit.FlashRig, {"block_size": 4096}, 700),
    "flash-acks": (kit.FlashRig, {"block_size": 4096, "append_acks": True}, 700),
    "flash-small": (kit.FlashRig, {}, 420),
    "posix": (kit.FileRig, {"segment_bytes": 1024, "max_segments": 3}, 300),
    "lfs": (kit.LfsRig, {"blocks": 24, "segment_bytes": 2048, "max_segments": 3}, 150),
}
SCRIPTED["lfs-host"] = SCRIPTED["lfs"]  # (FlashRig: 4 blocks of 1 KiB unless said)


def make(name):
    """(rig, workload size): a number of scripted calls, or a full-store workload."""
    t = kit
    if name == "flash-full":
        return [(t.FlashRig(blocks=4, block_size=1024, **o), ("flash", o)) for o in ({}, {"append_acks": True})]
    if name == "posix-full":
        return [(t.FileRig(max_bytes=6000, segment_bytes=500), ("file", 60))]
    if name == "lfs-host-full":
        return [(t.LfsRig(blocks=16), ("file", 40))]
    if name not in SCRIPTED:
        raise SystemExit("unknown target " + name)
    rig, opts, size = SCRIPTED[name]
    return rig(**opts), size


def run_target(name, seed, quick):
    t = storecut
    if name == "session-edge":
        return run_edge(seed, quick)
    if name.startswith("group-"):
        return run_group(name, quick)
    if name.startswith("faults-"):
        return run_faults(name, quick)
    made = make(name)
    if not isinstance(made, list):
        made = [(made[0], made[1])]
    t0 = time.time()
    nks = 0
    fails = []
    for rig, work in made:
        try:
            if isinstance(work, int):
                steps = t.stale_steps(seed, work) if name.endswith("-stale") else t.script(seed, work, getattr(rig, "last0", 0))
            elif work[0] == "flash":
                steps = t.full_store_steps(rig.blocks, rig.bs, work[1])
            else:
                steps = t.file_full_store_steps(rig, work[1])
            total = t.total_ops(rig, steps)
            ks = kit.sample(total, 200, seed) if quick else list(range(1, total + 1))
            print("%s: workload of %d calls = %d operations; cutting at %d points" % (name, len(steps), total, len(ks)))
            for i in range(0, len(ks), 250):  # (progress every 250 cut points)
                fails += t.sweep(rig, steps, ks[i : i + 250], seed, report=print)
                if i + 250 < len(ks):
                    print("  %s: %d/%d cut points, %d failures, %.0f s" % (name, i + 250, len(ks), len(fails), time.time() - t0))
            nks += len(ks)
        finally:
            rig.cleanup()
    print("RESULT %s: %d cut points, %d failures, %.1f s" % (name, nks, len(fails), time.time() - t0))
    return nks, len(fails)


def main(argv):
    if MICROPYTHON:  # the child running one target: `store_sweep.py --inner NAME --seed S [--quick]`
        n, f = run_target(argv[argv.index("--inner") + 1], int(argv[argv.index("--seed") + 1]), "--quick" in argv)
        sys.exit(1 if f else 0)
    import argparse
    import subprocess

    ap = argparse.ArgumentParser(description="Cut power at every flash operation of a store workload, reboot, "
                                             "check the store contract; prints cut points and failures.")
    ap.add_argument("--only", default=",".join(TARGETS),
                    help="comma-separated targets (default all: %s)" % ",".join(TARGETS))
    ap.add_argument("--seed", type=int, default=21, help="seed of the torn writes (default 21)")
    ap.add_argument("--quick", action="store_true", help="a sample of cut points instead of every one")
    ap.add_argument("--write", metavar="FILE", help="rewrite this file's store_sweep section with the summary")
    ap.add_argument("--section", default="store_sweep",
                    help="the section --write rewrites (default store_sweep; the counter wraps: store_sweep_wrap)")
    a = ap.parse_args(argv)
    only = a.only.split(",")
    unknown = [t for t in only if t not in TARGETS]
    if unknown:
        ap.error("unknown target(s) %s; choose from %s" % (",".join(unknown), ",".join(TARGETS)))
    seed, quick = a.seed, a.quick

    totals = []
    t_start = time.time()
    for name in only:
        if name == "lfs":
            exe = os.path.join(os.path.dirname(sys.executable), "micropython")
            from ternlab.paths import device_path

            env = dict(os.environ, MICROPYPATH=":".join([ROOT, ROOT + "/lib"] + device_path("testing")))
            cmd = [exe, "-X", "heapsize=16m", __file__, "--inner", "lfs", "--seed", str(seed)] + (["--quick"] if quick else [])
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            sys.stdout.write(proc.stdout)
            # (stderr holds finalisers of the dead mounts meeting the dead flash: noise)
            res = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT lfs")]
            if not res:
                sys.stdout.write(proc.stderr[-3000:])
                totals.append((name, 0, 1, 0.0))
                continue
            parts = res[-1].split()
            totals.append((name, int(parts[2]), int(parts[5]), float(parts[7])))
        else:
            t0 = time.time()
            n, f = run_target(name, seed, quick)
            totals.append((name, n, f, time.time() - t0))
    print("")
    print("%-12s %10s %9s" % ("target", "cut points", "failures"))
    for name, n, f, _ in totals:
        print("%-12s %10d %9d" % (name, n, f))
    if a.write:
        import datetime

        from tools.bench.benchdoc import write_section

        group = all(t.startswith("group-") for t in only)  # (their own section: the other table stays)
        faults = all(t.startswith("faults-") for t in only)
        section = ("store_sweep_group" if group else "store_sweep_faults" if faults else a.section) \
            if a.section == "store_sweep" else a.section
        title = {"store_sweep": "", "store_sweep_group": ", group commit",
                 "store_sweep_faults": ": storage that fails and returns"}.get(section, " across the counter wraps")
        text = ["## Store crash-point sweep%s (`tools/store_sweep.py`)" % title, "",
                "Command: `python -m tools.store_sweep --only %s%s --seed %d --write %s%s`, %s (targets: the "
                "tool's docstring). %s" % (
                    ",".join(only), " --quick" if quick else "", seed, a.write,
                    " --section " + a.section if a.section != "store_sweep" else "", datetime.date.today().isoformat(),
                    "A storage failure at %s operation of the workload, six ways (before any byte lands, after "
                    "all did, torn; once or until the workload ends), then drained with the fault gone, a power "
                    "cut, reboot, check." % ("a sample of 40 storage operations of" if quick else "every")
                    if faults else
                    "A power cut at %s operation of each workload%s, reboot, check." % (
                        "a sample of 200 cut points of each" if quick else "every",
                        " and right after every packet the client sends" if group else "")),
                "", "| target | %s points | failures | time |" % ("failure" if faults else "cut"), "|---|---:|---:|---:|"]
        text += ["| %s | %s | %d | %.1f s |" % (
            t[0], "%d operations + %d packets" % GROUP[t[0]] if t[0] in GROUP else
            "%d operations x 6" % FAULTS[t[0]] if t[0] in FAULTS else t[1], t[2], t[3]) for t in totals]
        write_section(a.write, section, "\n".join(text))
    sys.exit(1 if any(t[2] for t in totals) else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
