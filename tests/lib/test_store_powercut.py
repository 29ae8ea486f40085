"""Store-level crash-point sweep: cut the power at flash operation k, reboot, check (the engine:
tests/lib/storecut.py, on the rigs of tests/lib/kit.py).

A scripted workload (appends, marks, unmarks, releases, inbound ids, in_clear,
meta) runs across several reclaims on a small partition. For a seeded sample
of k it runs again on a fresh image with the power cut at the k-th flash
operation (a torn program or erase), then "reboots" (a new device object on
the same image), reopens the store and checks it against a model of what
returned before the cut (storecut.py's docstring).

tools/store_sweep.py runs the same engine at every k (the full sweep).
"""

from norflash import NorFlash
from tern.flashstore import FlashStore
from tern.store import PUBLISH
from tests.lib.check import Rng
from tests.lib.kit import FileRig, FlashRig, LfsRig, sample
from tests.lib.storecut import (
    Model, file_full_store_steps, full_store_steps, run, script, stale_steps, sweep, total_ops, verify,
)

MP_HEAPSIZE = "8m"
MP_TIMEOUT = 280


def _sampled(rig, nsteps, count, seed):
    steps = script(seed, nsteps)
    try:
        total = total_ops(rig, steps)
        ks = sample(total, count, seed)
        fails = sweep(rig, steps, ks, seed)
        assert not fails, "%d of %d crash points failed: %r" % (len(fails), len(ks), fails[:3])
    finally:
        rig.cleanup()
    return total


def test_workload_reclaims_several_times():
    """The sweep's workload really wraps the partition (else it proves little)."""
    rig = FlashRig()
    try:
        steps = script(11, 420)
        m, ops, cut = run(rig, steps, 0, 1)
        erases = rig.dev.counters()["erases_total"]  # (one boot, no cut: the whole run)
        assert erases >= 6, erases
    finally:
        rig.cleanup()


def test_powercut_flash_in_place():
    total = _sampled(FlashRig(), 420, 250, 11)
    assert total > 500, total


def test_powercut_flash_appended_acks():
    _sampled(FlashRig(append_acks=True), 420, 200, 12)


def test_powercut_flash_torn_erases():
    """Cut right at every erase and the program before and after it."""
    rig = FlashRig(block_size=4096)
    steps = script(13, 600)
    try:
        # find the erase operations of an uncut run
        dev = NorFlash(None, blocks=rig.blocks, block_size=rig.bs)
        erases = []
        orig = dev.erase

        def spy(block):
            erases.append(dev.ops + 1)
            return orig(block)

        dev.erase = spy
        st = FlashStore(dev, verbose=False).open()
        m = Model()
        for s in steps:
            m.apply(st, s)
            m.done(s)
        assert len(erases) >= 3, erases
        ks = []
        for e in erases[:6]:
            ks += [e - 1, e, e + 1]
        fails = sweep(rig, steps, ks, 5)
        assert not fails, fails[:3]
    finally:
        rig.cleanup()


def test_powercut_across_the_wraps():
    """Record sequence, sector sequence, segment number and packet ids all
    wrap inside the workload (tools/store_sweep.py *-wrap: every cut point)."""
    for rig, n, count, seed in ((FlashRig(wraps=True), 300, 50, 16), (FlashRig(wraps=True, append_acks=True), 300, 40, 17),
                                (FileRig(wraps=True, segment_bytes=1024, max_segments=3), 200, 40, 18)):
        steps = script(seed, n, rig.last0)
        try:
            m, ops, cut = run(rig, steps, 0, 1)
            st = rig.power_on()
            wrapped = st._rseq < 1000 and (st._nextseq < 100 if rig.name == "flash" else max(st._segs) < 100)
            rig.off()
            assert wrapped, "%s: the workload does not reach the wraps" % rig.name
            ks = sample(ops, count, seed)
            fails = sweep(rig, steps, ks, seed)
            assert not fails, "%s: %d of %d crash points failed: %r" % (rig.name, len(fails), len(ks), fails[:3])
        finally:
            rig.cleanup()


def test_powercut_across_a_stale_refresh():
    for rig, seed in ((FlashRig(), 19), (FlashRig(append_acks=True), 20),
                      (FileRig(segment_bytes=1024, max_segments=3), 21)):
        steps = stale_steps(seed, 200)
        try:
            m, ops, cut = run(rig, steps, 0, 1)
            st = rig.power_on()
            if rig.name == "flash":
                r = st._rseq_of(st._iaddr[st._find(65000)] & ~7)
            else:
                r = st._irs[st._find(65000)]
            rig.off()
            assert (st._rseq - r) & 0xFFFFFFFF < 1000, "%s: the stuck record was not refreshed" % rig.name
            ks = sample(ops, 40, seed)
            fails = sweep(rig, steps, ks, seed)
            assert not fails, "%s: %d of %d crash points failed: %r" % (rig.name, len(fails), len(ks), fails[:3])
        finally:
            rig.cleanup()


def test_powercut_file_posix():
    _sampled(FileRig(segment_bytes=1024, max_segments=3), 200, 150, 14)


def test_powercut_file_littlefs_on_nor():
    _sampled(LfsRig(blocks=24, segment_bytes=2048, max_segments=3), 120, 80, 15)


def test_powercut_flash_full_store_acks_and_mark_cycles():
    """A cut at every operation while a full store takes its acks: nothing
    accepted is lost, no ack fails for room, marks read back as last set."""
    for opts in ({}, {"append_acks": True}):
        # (1 KiB sectors: on 512 B ones the 640 bytes a message leaves free
        # for inbound ids and meta let one message in, and nothing filled)
        rig = FlashRig(blocks=4, block_size=1024, **opts)
        steps = full_store_steps(4, 1024, opts)
        assert sum(1 for s in steps if s[0] == "append") >= 5, steps
        try:
            total = total_ops(rig, steps)
            fails = sweep(rig, steps, range(1, total + 1), 17)
            assert not fails, "%r: %d of %d crash points failed: %r" % (opts, len(fails), total, fails[:3])
        finally:
            rig.cleanup()


def test_powercut_file_full_store_acks():
    """FileStore filled until it refuses (its byte budget on POSIX files; the
    budget LittleFS's free blocks give on the emulated NOR flash), then the
    acks of a full outbox, with enough mark cycles that segments must be
    compacted: a power cut at a seeded sample of operations (300 of ~1,200 on
    POSIX, 12 of ~50,000 flash operations on LittleFS): nothing accepted is
    lost, no ack fails for room, a refused append leaves nothing behind."""
    for rig, cycles, count in (
        (FileRig(max_bytes=6000, segment_bytes=500), 60, 300),
        (LfsRig(blocks=16), 40, 12),
    ):
        try:
            steps = file_full_store_steps(rig, cycles)
            assert len(steps) > 30, len(steps)
            total = total_ops(rig, steps)
            fails = sweep(rig, steps, sample(total, count, 19), 19)
            assert not fails, "%s: %d of %d crash points failed: %r" % (rig.name, len(fails), count, fails[:3])
        finally:
            rig.cleanup()


def _ram(img, bs, opts, cut_at=0, seed=1):
    """Boot a FlashStore on a RAM flash holding img (cut at its op cut_at)."""
    dev = NorFlash(None, blocks=len(img) // bs, block_size=bs, cut_at=cut_at, seed=seed)
    dev.mem[:] = img
    return dev, FlashStore(dev, verbose=False, **opts).open()


def _play(dev, st, m, steps):
    """Run steps until done or the power is cut; returns the index reached."""
    for j in range(len(steps)):
        try:
            m.apply(st, steps[j])
        except Exception:
            if not dev.dead:
                raise
            return j
        if dev.dead:
            return j
        m.done(steps[j])
    return len(steps)


def test_two_power_cuts_in_a_row_never_wedge_the_flash():
    """A cut that tears the head leaves it sealed; the next write takes the
    spare sector. A second cut that tears that head before a reclaim has
    given a spare back left no free sector and a sealed head: every append,
    set_meta, in_add (and in appended-ack mode every ack) failed with ENOSPC
    for good, on a store far from full. Here the second cut comes at every
    operation of the workload that follows the first one (both ack modes):
    the store opens with what was accepted and keeps taking appends, meta and
    acks, across one more reboot."""
    bs = 1024
    for opts in ({}, {"append_acks": True}):
        r = Rng(5)
        steps = []
        live = []
        for pid in range(1, 121):
            steps.append(("append", PUBLISH, pid, b"\x32\x10" + bytes(r.bytes(40 + r.below(40)))))
            if pid > 1:  # (1 stays pending: the oldest sector keeps a live record)
                live.append(pid)
            if len(live) > 8:
                steps.append(("release", live.pop(0)))
        # an uncut run to where the ring has wrapped and one spare is left
        dev = NorFlash(None, blocks=4, block_size=bs)
        st = FlashStore(dev, verbose=False, **opts).open()
        m = Model()
        j = 0
        while j < 60 or st._free() != 1 or steps[j][0] != "append":
            m.apply(st, steps[j])
            m.done(steps[j])
            j += 1
        img = bytes(dev.mem)
        # cut 1: tear the next append's first program (its header)
        dev, st = _ram(img, bs, opts, cut_at=1)
        j += _play(dev, st, m, steps[j : j + 1])
        img1 = bytes(dev.mem)
        rest = steps[j + 1 : j + 41]
        dev, st = _ram(img1, bs, opts)
        verify(st, m, "after cut 1")
        assert st._sealed, "cut 1 did not leave a torn head: the case is not set up"
        m1 = (list(m.order), dict(m.data), dict(m.kinds), m.last)
        _play(dev, st, Model(), rest)
        total = dev.ops
        assert total > 40, total
        for k in range(1, total + 1):
            m = Model()
            m.order, m.data, m.kinds, m.last = list(m1[0]), dict(m1[1]), dict(m1[2]), m1[3]
            dev, st = _ram(img1, bs, opts, cut_at=k, seed=k)
            _play(dev, st, m, rest)
            where = "%r: second cut at op %d" % (opts, k)
            assert dev.dead, where
            dev, st = _ram(bytes(dev.mem), bs, opts)
            verify(st, m, where)
            for i in range(3):
                s = ("append", PUBLISH, 60000 + i, b"\x32\x03new%d" % i)
                m.apply(st, s)
                m.done(s)
            s = ("release", m.order[0])
            m.apply(st, s)
            m.done(s)
            st.set_meta("boot", b"%d" % k)
            m.meta["boot"] = b"%d" % k
            dev, st = _ram(bytes(dev.mem), bs, opts)
            verify(st, m, where + ", second boot")
