"""The model-based test (tests/lib/model.py, on the rigs and broker model of tests/lib/kit.py) on a
long budget. Run from the checkout's root (the model is imported as the package tests.lib):

    .venv/bin/python -m tools.model_sweep [--rigs memory,flash,file] [--seeds 1:2001]
        [--steps 300] [--micropython] [--mp-seeds 1:501 --write docs/benchmarks.md]
    .venv/bin/python -m tools.model_sweep --rig flash --seed 1052 [--steps 300]   (replay one, step by step)
    .venv/bin/python -m tools.model_sweep --first [--rigs file,file-gc,flash-gc,flash-gc-inplace] [--seeds 1:2001]
        (examples until the first finding of each of issue 35's defects 1-4; no shrinking)

Each example is a seeded list of steps (publish at QoS 0/1/2 online and
offline through Client.publish, fill the outbox, subscribe/unsubscribe,
connect, drop, the broker withholding acks, forgetting the session, refusing a
filter, inbound QoS 1/2 with or without PUBREL, a power cut at the medium's
k-th next operation or right after the client's k-th next packet and a
reboot, a storage operation that fails and returns (before, after, torn; once
or until healed), ENOSPC from the filesystem, the broker's limits changed, a
restart with another max_pending) run on the real Client and a store at small
capacities; the invariants are checked after every step, at every reboot and
at the end (tests/lib/model.py's docstring). Prints per rig the examples run, the steps taken,
the findings (seed and shrunk step list) and the time; exit status 1 on any
finding. --micropython runs the same examples under the MicroPython unix port.
--write FILE runs the CPython budget, then --mp-seeds under MicroPython, and
writes the results as FILE's model_sweep section (in its older form: the
section now in docs/benchmarks.md was written from the commands it names).
"""

import sys
import time

MICROPYTHON = sys.implementation.name == "micropython"
ROOT = (__file__.rpartition("/")[0] or ".") + "/.."  # the checkout (the MicroPython runs' MICROPYPATH)
if not MICROPYTHON:  # MicroPython has norflash and cutfs on its MICROPYPATH (set from device_path when launched here)
    from ternlab.paths import use_device

    use_device("testing")
try:
    from tests.lib import model
except ImportError as e:  # (run as a file, not as tools.model_sweep from the checkout's root)
    raise SystemExit("model_sweep: run it from the checkout's root as `python -m tools.model_sweep` (%s)" % e)


def clock():
    return time.ticks_ms() / 1000 if MICROPYTHON else time.time()


def sweep(rigs, first, last, steps, lines=None):
    bad = 0
    for name in rigs:
        t0 = clock()
        count, found = model.budget([name], range(first, last), steps)
        bad += len(found)
        line = "RESULT %s: %d examples of %d steps (seeds %d..%d), %d findings, %.1f s" % (
            name, count, steps, first, last - 1, len(found), clock() - t0)
        print(line)
        if lines is not None:
            lines.append(line)
        for f in found:
            print(f)
            if lines is not None:
                lines.append("    " + f.replace("\n", " / "))
    return bad


# Issue 35's defects, told apart by the rig and the model's finding (its first line). "Kept": the
# store holds a record the session does not (the check after each step): what publish() refused.
REFUSED = "reached the broker after publish() raised"


def kept(f):
    if not f.startswith("session pending"):
        return False
    a, _, b = f.partition(" != store pending ")
    return bool(set(eval(b.split("\n")[0])) - set(eval(a[len("session pending "):])))


DEFECTS = (
    ("1", "FileStore: a sync that failed after the bytes landed, the record kept: what publish() refused is sent",
     lambda rig, f: rig.startswith("file") and (REFUSED in f or kept(f))),
    ("2", "FlashStore group commit: a program that failed in publish()'s commit, the record kept: sent",
     lambda rig, f: rig.startswith("flash-gc") and (REFUSED in f or kept(f) or "delivered twice" in f)),
    ("3", "FileStore group commit: a mark lost with a failed release, PUBREL sent from the session's RAM",
     lambda rig, f: rig.startswith("file") and ("its mark lost" in f or "delivered twice" in f)),
    ("4", "FileStore group commit: AttributeError from a commit with no segment open",
     lambda rig, f: "AttributeError" in f),
)


def first(rigs, a, b, steps, lines=None):
    """Examples, seed by seed (every rig per seed, in the order given), until each defect's
    first finding; no shrinking. Prints per defect the examples run up to its first finding."""
    found = {}
    other = []
    count = 0
    t0 = clock()
    for seed in range(a, b):
        for name in rigs:
            count += 1
            v, mp, _ = model.params(seed)
            f = model.run(name, seed, model.gen_steps(seed, steps), v, mp)
            if not f:
                continue
            for key, _, match in DEFECTS:
                if match(name, f):
                    if key not in found:
                        found[key] = (count, name, seed, f)
                    break
            else:
                other.append("%s seed %d: %s" % (name, seed, f))
        if len(found) == len(DEFECTS):
            break
    out = ["FIRST %s, seeds %d.. (%d examples of %d steps run, %.1f s):" % (",".join(rigs), a, count, steps,
                                                                            clock() - t0)]
    for key, what, _ in DEFECTS:
        if key in found:
            n, name, seed, f = found[key]
            out.append("  defect %s (%s): example %d (%s seed %d): %s" % (key, what, n, name, seed, f))
        else:
            out.append("  defect %s (%s): not found in %d examples" % (key, what, count))
    kinds = {}
    for o in other:  # the others, by kind (their first words)
        k = o.partition(": ")[2][:48]
        kinds[k] = kinds.get(k, 0) + 1
    out += ["  other findings: %d, e.g. %s" % (len(other), other[0])] if other else []
    out += ["    %d x %s..." % (n, k) for k, n in sorted(kinds.items(), key=lambda e: -e[1])[:6]]
    for ln in out:
        print(ln)
        if lines is not None:
            lines.append(ln)
    return found


def replay(name, seed, steps):
    v, mp, lowest = model.params(seed)
    r = model.Run(model.RIGS[name](), v, mp, lowest=lowest)
    print("%s seed %d: MQTT %d, max_pending %d" % (name, seed, v, mp))
    try:
        for i, st in enumerate(model.gen_steps(seed, steps)):
            r.step(st)
            r.check()
            print("%4d %-22r live %r pending %r delivered %d" % (
                i, st, [e[1] for e in r.live], r.s.pending(), len(r.b.delivered)))
        r.drain()
        print("drained: %d acknowledged, %d deliveries" % (len(r.acked), len(r.b.delivered)))
    except model.Finding as e:
        print("FINDING:", e)
        return 1
    finally:
        r.rig.cleanup()
    return 0


def main(argv):
    def opt(name, default):
        return argv[argv.index(name) + 1] if name in argv else default

    steps = int(opt("--steps", "300"))
    if "--seed" in argv:
        return replay(opt("--rig", "memory"), int(opt("--seed", "1")), steps)
    if "--first" in argv:
        a, _, b = opt("--seeds", "1:2001").partition(":")
        first(opt("--rigs", "file,file-gc,flash-gc,flash-gc-inplace").split(","), int(a), int(b), steps)
        return 0
    rigs = opt("--rigs", "memory,flash,file").split(",")
    for r in rigs:
        if r not in model.RIGS:
            print("unknown rig %s; choose from %s" % (r, ",".join(model.RIGS)))
            return 2
    a, _, b = opt("--seeds", "1:2001").partition(":")
    if "--write" in argv:
        return write(opt("--write", ""), rigs, int(a), int(b), steps, opt("--mp-seeds", "1:501"))
    if "--micropython" in argv and not MICROPYTHON:
        import os
        import subprocess

        exe = os.path.join(os.path.dirname(sys.executable), "micropython")
        env = dict(os.environ, MICROPYPATH=_micropypath())
        args = [a for a in argv if a != "--micropython"]
        return subprocess.run([exe, "-X", "heapsize=4m", __file__] + args, env=env).returncode
    return 1 if sweep(rigs, int(a), int(b), steps) else 0


def _micropypath():
    from ternlab.paths import device_path

    return ":".join([".frozen", ROOT, ROOT + "/lib"] + device_path("testing"))


def write(path, rigs, a, b, steps, mp_seeds):
    import datetime
    import os
    import subprocess

    from tools.bench.benchdoc import write_section

    lines = []
    bad = sweep(rigs, a, b, steps, lines)
    exe = os.path.join(os.path.dirname(sys.executable), "micropython")
    env = dict(os.environ, MICROPYPATH=_micropypath())
    mp = subprocess.run([exe, "-X", "heapsize=4m", __file__, "--rigs", ",".join(rigs), "--seeds", mp_seeds,
                         "--steps", str(steps)], env=env, capture_output=True, text=True)
    sys.stdout.write(mp.stdout)
    mp_lines = [ln for ln in mp.stdout.splitlines() if ln.startswith(("RESULT", "    "))]
    bad += mp.returncode != 0
    cmd = "python -m tools.model_sweep --rigs %s --seeds %d:%d --steps %d --mp-seeds %s --write %s" % (
        ",".join(rigs), a, b, steps, mp_seeds, path)
    text = ["## Model-based test of the client at its edges (`tools/model_sweep.py`)", "",
            "Command: `%s`, %s. Each example: a seeded list of steps (see tests/lib/model.py) over the real "
            "Client and a store at small capacities (max_pending 4-8; FlashStore on a 4 x 1 KiB emulated NOR "
            "partition, FileStore on POSIX with max_bytes=4000 and on a 64 KiB LittleFS volume; MemoryStore), "
            "losing power at the k-th operation a `cut` step names or after a packet, and failing and "
            "returning (before, after, torn; once or until healed), MQTT 3.1.1 and 5 alternately, against a "
            "broker model (acks withheld, session forgotten, a filter refused by closing, inbound QoS 1/2 with "
            "or without PUBREL, Mosquitto 2.0.11's Receive Maximum overrun after a resume, its limits changed). "
            "Invariants after every step and at every reboot, the outbox drained at the end with faults "
            "healed and no reboot, then again after a last power cut; a finding is shrunk to its minimal "
            "step list. CI budgets: tests/lib/test_model.py."
            % (cmd, datetime.date.today().isoformat()), "", "CPython:", "", "```"] + lines + ["```", "",
                                                                                        "MicroPython unix port:",
                                                                                        "", "```"] + mp_lines + ["```"]
    write_section(path, "model_sweep", "\n".join(text))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
