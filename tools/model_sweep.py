"""The model-based test (tests/lib/model.py) on a long budget.

    .venv/bin/python tools/model_sweep.py [--rigs memory,flash,file] [--seeds 1:2001]
        [--steps 300] [--micropython]
    .venv/bin/python tools/model_sweep.py --rig flash --seed 1052 [--steps 300]   (replay one, step by step)

Each example is a seeded list of steps (publish at QoS 0/1/2 online and
offline, fill the outbox, subscribe/unsubscribe, connect, drop, the broker
withholding acks, forgetting the session, refusing a filter, inbound QoS 1/2
with or without PUBREL, a power cut at the store's k-th next operation and a
reboot, a restart with another max_pending) run on the real Session and a
store at small capacities; the invariants are checked after every step and the
outbox drained at the end. Prints per rig the examples run, the steps taken,
the findings (seed and shrunk step list) and the time; exit status 1 on any
finding. --micropython runs the same examples under the MicroPython unix port.
"""

import sys
import time

MICROPYTHON = sys.implementation.name == "micropython"


def _root():
    here = __file__ if "/" in __file__ else "./" + __file__
    return (here.rpartition("/")[0] or ".") + "/.."


ROOT = _root()
for _p in ("/tests/lib", "/lib", "/boards/emulated"):
    if ROOT + _p not in sys.path:
        sys.path.insert(0, ROOT + _p)

import model  # noqa: E402


def clock():
    return time.ticks_ms() / 1000 if MICROPYTHON else time.time()


def sweep(rigs, first, last, steps):
    bad = 0
    for name in rigs:
        t0 = clock()
        count, found = model.budget([name], range(first, last), steps)
        bad += len(found)
        print("RESULT %s: %d examples of %d steps (seeds %d..%d), %d findings, %.1f s"
              % (name, count, steps, first, last - 1, len(found), clock() - t0))
        for f in found:
            print(f)
    return bad


def replay(name, seed, steps):
    v, mp = (4, 5)[seed % 2], 4 + seed % 5
    r = model.Run(model.RIGS[name](), v, mp)
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
    rigs = opt("--rigs", "memory,flash,file").split(",")
    for r in rigs:
        if r not in model.RIGS:
            print("unknown rig %s; choose from %s" % (r, ",".join(model.RIGS)))
            return 2
    a, _, b = opt("--seeds", "1:2001").partition(":")
    if "--micropython" in argv and not MICROPYTHON:
        import os
        import subprocess

        exe = os.path.join(os.path.dirname(sys.executable), "micropython")
        env = dict(os.environ, MICROPYPATH=":".join([".frozen"] + [ROOT + p for p in ("/tests/lib", "/lib",
                                                                                       "/boards/emulated")]))
        args = [a for a in argv if a != "--micropython"]
        return subprocess.run([exe, "-X", "heapsize=4m", __file__] + args, env=env).returncode
    return 1 if sweep(rigs, int(a), int(b), steps) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
