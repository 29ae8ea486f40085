"""Sweeps of one session workload (issues 25, 35) on the model's engine (tests/lib/model.py: its
device and invariants; the rigs, the broker model and the sweep loop are the test kit's,
tests/lib/kit.py; nothing of its own but the workload and its runs). Imported as tests.lib.walsweep.

The workload: QoS 1 and 2 both ways (the broker reuses a packet id as soon as it is free, as the
spec allows), SUBSCRIBE and UNSUBSCRIBE, acknowledgements withheld and a reconnect, a broker that
loses the session; drained at the end with faults off, then a last power cut and reboot. Run on a
store on a medium that
- loses power at its k-th operation (a torn program, erase, write or sync), or right after the
  client's j-th packet: `sweep` (tools/store_sweep.py targets group-*: group commit, where the
  write-ahead rule is the session's);
- fails and returns at its k-th operation, before any byte lands, after all did, or torn, once or
  until the workload ends: `fault_sweep` (tools/store_sweep.py target faults: every store mode).
Checked throughout by the model: at every reboot, no packet announced state the store does not
durably hold; at the end, a publish() that raised never reached the broker, every accepted message
did (QoS 2 once), in order, every inbound message reached the handler (QoS 2 once), and the store
took messages again once the fault was gone, without a reboot.

The pytest parts (test_group_commit_sweep.py, test_store_faults.py) run samples on both runtimes.
"""

from . import kit, model
from .faults import AFTER, BEFORE, TORN, WHEN
from .kit import FileRig, Finding, FlashRig, LfsRig

RIGS = {
    # group commit (the power-cut sweep)
    "group-flash": lambda: FlashRig(blocks=4, block_size=1024, group_commit=True),
    "group-flash-acks": lambda: FlashRig(blocks=4, block_size=1024, append_acks=True, group_commit=True),
    "group-posix": lambda: FileRig(segment_bytes=600, max_segments=3, group_commit=True),
    "group-lfs": lambda: LfsRig(blocks=24, segment_bytes=2048, max_segments=3, group_commit=True),
    # and without it (the fault sweep runs both)
    "flash": lambda: FlashRig(blocks=4, block_size=1024),
    "flash-acks": lambda: FlashRig(blocks=4, block_size=1024, append_acks=True),
    "posix": lambda: FileRig(segment_bytes=600, max_segments=3),
    "lfs": lambda: LfsRig(blocks=24, segment_bytes=2048, max_segments=3),
}

# the workload, in the model's steps (filters: model.FILTERS; "a/#" is 0, "b" is 1)
WORK = [("sub", 0), ("connect",), ("pub", 2, 150), ("pub", 1, 150), ("pub", 2, 150), ("net",),
        ("in", 2, True, 1), ("in", 1, True, 1), ("in", 2, True, 1), ("net",),
        ("hold",), ("pub", 2, 150), ("pub", 1, 150), ("net",), ("in", 2, True, 1), ("net",), ("drop",),
        ("pub", 2, 150), ("connect",), ("ack",), ("net",),
        ("unsub", 0), ("sub", 1), ("net",), ("pub", 2, 150), ("in", 2, True, 1), ("in", 2, True, 1), ("net",),
        ("hold",), ("pub", 1, 150), ("pub", 2, 150), ("net",), ("in", 2, True, 1), ("net",), ("forget",), ("drop",),
        ("connect",), ("ack",), ("net",), ("in", 2, True, 1), ("in", 2, True, 1), ("pub", 2, 150), ("net",),
        ("pub", 1, 150), ("net",)]


def run(name, op_cut=0, pkt_cut=0, fault=None):
    """One run of the workload: a power cut at the medium's op_cut-th operation or right after
    the pkt_cut-th packet, or fault = (kind, when, k, times) armed from the first boot on.
    Returns (None or the finding, medium operations, packets, storage operations) of the
    workload (the drain not counted)."""
    rig = RIGS[name]()
    what = ("cut at op %d" % op_cut if op_cut else "cut after packet %d" % pkt_cut if pkt_cut else
            "fault %s %s at op %d%s" % (fault[0], WHEN[fault[1]], fault[2], "" if fault[3] == 1 else ", lasting")
            if fault else "no fault")
    try:
        if fault:
            rig.fault.arm(*fault)
        r = model.Run(rig, 4, 8, lowest=True, cut_at=op_cut)
        if pkt_cut:
            r.cut_after = pkt_cut
        for st in WORK:
            r.step(st)
            r.check()
        counts = (rig.ops() if not r.reboots else 0, r.packets, rig.fault.ops)
        hit = r.reboots if (op_cut or pkt_cut) else rig.fault.fired if fault else 1
        r.drain()
        r.check()
        if not hit:
            return "%s %s: it never happened" % (name, what), 0, 0, 0
        return (None,) + counts
    except Finding as e:
        return "%s %s: %s" % (name, what, e), 0, 0, 0
    finally:
        rig.cleanup()


def totals(name):
    """Medium operations and packets of a clean run (the cut points of a sweep)."""
    err, ops, pkts, _ = run(name)
    if err:
        raise Finding("the clean run fails: " + err)
    return ops, pkts


def sweep(name, ops_ks, pkt_ks, report=None):
    """Runs with a cut at each of ops_ks and right after each of pkt_ks; the findings."""
    points = [{"op_cut": k} for k in ops_ks] + [{"pkt_cut": j} for j in pkt_ks]
    return kit.sweep(points, lambda cut: run(name, **cut)[0], report)


MODES = ((BEFORE, 1), (AFTER, 1), (TORN, 1), (BEFORE, -1), (AFTER, -1), (TORN, -1))


def fault_ops(name):
    """Storage operations of a clean run (the fault points of a fault sweep)."""
    err, _, _, ops = run(name)
    if err:
        raise Finding("the clean run fails: " + err)
    return ops


def fault_sweep(name, ks, modes=MODES, report=None):
    """Runs with a storage failure at each of ks (any kind of operation) in each mode; the findings."""
    points = [(k, when, times) for k in ks for when, times in modes]
    return kit.sweep(points, lambda p: run(name, fault=("any", p[1], p[0], p[2]))[0], report)
