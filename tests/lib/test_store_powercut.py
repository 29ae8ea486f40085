"""Store-level crash-point sweep: cut the power at flash operation k, reboot, check.

A scripted workload (appends, marks, unmarks, releases, inbound ids, in_clear,
meta) runs across several reclaims on a small partition. For a seeded sample
of k it runs again on a fresh image with the power cut at the k-th flash
operation (a torn program or erase), then "reboots" (a new device object on
the same image file), reopens the store and checks, against a model of what
returned before the cut:
- the store always opens;
- every append that returned is pending (unless its release returned), in the
  original order, with its bytes and kind; marks preserved; releases that
  returned stay released; inbound ids and the latest meta values kept;
  last_pid kept. The one call the power cut interrupted may have happened or
  not, nothing else.
- the recovered store keeps working: more calls, another reboot, same checks.

tools/store_sweep.py runs the same engine at every k (the full sweep).
"""

import os

from check import MICROPYTHON, Rng, read_all
from cutfs import ShimFile, keep_synced
from norflash import NorFlash, PowerCut
from storekit import LfsVolume, tmppath, rm, rmtree
from tern.store import PUBLISH, SUBSCRIBE, UNSUBSCRIBE
from tern.flashstore import FlashStore
from tern.filestore import FileStore

MP_HEAPSIZE = "8m"
MP_TIMEOUT = 280


# -- counters near their wraps (issue 25): the state a long run leaves ------------
# A store's counters are set before its first write, which then carries them
# (a sector header, a SEG record) as a long run would have written them.
RSEQ0 = 0xFFFFFFFF - 40  # record sequence (32 bits)
SSEQ0 = 0xFFFFFFFF - 2  # FlashStore sector sequence (32 bits, 0 = free): the 3rd sector opened wraps
SEG0 = 99999997  # FileStore segment number (8 digits): the 3rd segment opened wraps
PID0 = 65500  # the last packet id: the workload's ids go on from it and wrap 65535 -> 1


def flash_near_wraps(dev, opts):
    st = FlashStore(dev, verbose=False, **opts)
    st._rseq, st._nextseq, st._last = RSEQ0, SSEQ0, PID0
    st.open()  # (blank: keeps them)
    st.set_meta("wrap", b"1")  # the first sector header
    st.close()


def file_near_wraps(path, fs, opts):
    """An empty segment file numbered SEG0 (a cut right after creating it
    leaves one), then a segment whose SEG record carries RSEQ0 and PID0."""
    os.mkdir(path)
    open("%s/%08d.seg" % (path, SEG0), "wb").close()
    st = FileStore(path, fs=fs, verbose=False, **opts).open()
    st._rseq, st._last = RSEQ0, PID0
    st._new_segment()
    st._gc()
    st.set_meta("wrap", b"1")
    st.close()


# -- rigs: a medium that can lose power at operation k and boot again -------------
class FlashRig:
    name = "flash"

    def __init__(self, blocks=4, block_size=1024, wraps=False, **opts):
        self.path = tmppath("cut")
        self.blocks = blocks
        self.bs = block_size
        self.opts = opts
        self.dev = None
        self.last0 = PID0 if wraps else 0  # (near_wraps: counters start just before their wraps)

    def fresh(self):
        NorFlash(self.path, blocks=self.blocks, block_size=self.bs, fresh=True).close()
        if self.last0:
            dev = NorFlash(self.path, blocks=self.blocks, block_size=self.bs)
            flash_near_wraps(dev, self.opts)
            dev.close()

    def boot(self, cut_at=0, seed=1):
        self.dev = NorFlash(self.path, blocks=self.blocks, block_size=self.bs, cut_at=cut_at, seed=seed)
        return FlashStore(self.dev, verbose=False, **self.opts).open()

    def dead(self):
        return self.dev.dead

    def ops(self):
        return self.dev.ops

    def off(self):
        if self.dev is not None:
            self.dev.close()
            self.dev = None

    def cleanup(self):
        self.off()
        rm(self.path)


class LfsRig:
    """FileStore on LittleFS (VfsLfs2 / littlefs-python) on the emulated NOR flash."""

    name = "file-lfs"

    def __init__(self, blocks=24, **opts):
        self.path = tmppath("cutlfs")
        self.blocks = blocks
        self.opts = opts
        self.vol = None

    def fresh(self):
        if self.vol is not None:
            self.vol.unmount()
        self.vol = LfsVolume(self.path, blocks=self.blocks)

    def boot(self, cut_at=0, seed=1):
        d, fs = self.vol.mount(cut_at, seed)
        return FileStore(d, fs=fs, verbose=False, **self.opts).open()

    def dead(self):
        return self.vol.dev is not None and self.vol.dev.dead

    def ops(self):
        return self.vol.dev.ops

    def off(self):
        if self.vol is not None:
            self.vol.unmount()

    def cleanup(self):
        if self.vol is not None:
            self.vol.cleanup()


class CutFile(ShimFile):
    """A real file whose writes count as operations of a CutFs."""

    def __init__(self, cfs, path, mode):
        ShimFile.__init__(self, path, mode)
        self.cfs = cfs
        self.writing = "w" in mode or "a" in mode
        if self.writing:
            cfs.synced.setdefault(path, 0)

    def write(self, b):
        self.cfs.op()
        n = self.f.write(b)
        if not MICROPYTHON:
            self.f.flush()  # what a killed process leaves: the OS has it, the disk may not
        return n

    def flush(self):
        self.cfs.op()
        if not MICROPYTHON:  # (MicroPython's files are unbuffered; its flush is an fsync)
            self.f.flush()
        self.cfs.synced[self.path] = self.f.tell()


class CutFs:
    """POSIX files with a power cut at the k-th write/sync/remove: each file
    keeps what was synced plus a random prefix of what was written after."""

    def __init__(self, cut_at, seed):
        self.cut_at = cut_at
        self.n = 0
        self.dead = False
        self.rng = Rng(seed * 7919 + 1)
        self.synced = {}

    def op(self):
        if self.dead:
            raise PowerCut("power is off")
        self.n += 1
        if self.cut_at and self.n >= self.cut_at:
            self.dead = True
            keep_synced(self.synced, self.rng.below)
            raise PowerCut("power cut at file operation %d" % self.n)

    def open(self, path, mode):
        return CutFile(self, path, mode)

    def listdir(self, path):
        return os.listdir(path)

    def mkdir(self, path):
        os.mkdir(path)

    def remove(self, path):
        self.op()
        os.remove(path)


class CutLayer:
    """A CutFs as a complete FileStore filesystem layer (what tests/lib/faults.py's FaultFs
    wraps): a file's sync is its flush (what CutFs counts as durable); a torn sync makes a
    random part of what waited durable; directories need no sync here; no statvfs (max_bytes
    is the budget)."""

    def __init__(self, cfs):
        self.cfs = cfs

    def open(self, path, mode):
        return self.cfs.open(path, mode)

    def listdir(self, path):
        return self.cfs.listdir(path)

    def mkdir(self, path):
        self.cfs.mkdir(path)

    def remove(self, path):
        self.cfs.remove(path)

    def statvfs(self, path):
        raise OSError(95, "no statvfs")

    def sync_file(self, f):
        f.flush()

    def torn_sync(self, f, below):
        old = self.cfs.synced.get(f.path, 0)
        f.flush()
        new = self.cfs.synced.get(f.path, 0)
        if new > old:
            self.cfs.synced[f.path] = old + below(new - old)

    def sync_dir(self, path):
        pass


class PosixRig:
    name = "file-posix"

    def __init__(self, wraps=False, **opts):
        self.path = tmppath("cutposix")
        self.opts = opts
        self.cfs = None
        self.last0 = PID0 if wraps else 0

    def fresh(self):
        rmtree(self.path)
        if self.last0:
            file_near_wraps(self.path, CutFs(0, 1), self.opts)

    def boot(self, cut_at=0, seed=1):
        self.cfs = CutFs(cut_at, seed)
        return FileStore(self.path, fs=self.cfs, verbose=False, **self.opts).open()

    def dead(self):
        return self.cfs.dead

    def ops(self):
        return self.cfs.n

    def off(self):
        pass

    def cleanup(self):
        rmtree(self.path)


# -- the workload and its model ----------------------------------------------------
def script(seed, steps, first=0):
    """A deterministic list of store calls (packet ids from first + 1 on)."""
    r = Rng(seed)
    out = []
    pend = []
    marked = []
    nxt = first
    held = []
    for _ in range(steps):
        c = r.below(100)
        if c < 40 and len(pend) < 6 or not pend:
            nxt = nxt % 65535 + 1
            kind = (PUBLISH, PUBLISH, PUBLISH, SUBSCRIBE, UNSUBSCRIBE)[r.below(5)]
            n = 8 + r.below(150)
            data = bytes(r.bytes(n))
            out.append(("append", kind, nxt, data))
            pend.append(nxt)
        elif c < 70:
            p = pend[r.below(min(3, len(pend)))]
            out.append(("release", p))
            pend.remove(p)
            if p in marked:
                marked.remove(p)
        elif c < 80:
            p = pend[r.below(len(pend))]
            out.append(("mark", p))
            if p not in marked:
                marked.append(p)
        elif c < 83 and marked:
            p = marked.pop(0)
            out.append(("unmark", p))
        elif c < 90:
            p = 1 + r.below(12)
            out.append(("in_add", p))
            held.append(p)
        elif c < 95 and held:
            out.append(("in_release", held.pop(0)))
        elif c < 96:
            out.append(("in_clear",))
            held = []
        else:
            out.append(("set_meta", ("client", "subs", "boot")[r.below(3)], bytes(r.bytes(1 + r.below(40)))))
    return out


class Model:
    def __init__(self):
        self.order = []
        self.data = {}
        self.kinds = {}
        self.marked = set()
        self.ins = set()
        self.meta = {}
        self.last = 0
        self.inflight = None
        self.floating = set()  # ids that may go behind later ones (a stale record's refresh)

    def apply(self, st, step):
        op = step[0]
        self.inflight = step
        if op == "jump":  # the record sequence as step[1] more records would leave it
            st._rseq = (st._rseq + step[1]) & 0xFFFFFFFF
        elif op == "float":
            pass
        elif op == "append":
            st.append(step[1], step[2], step[3][:2], step[3][2:])
        elif op == "set_meta":
            st.set_meta(step[1], step[2])
        elif op == "in_clear":
            st.in_clear()
        else:
            getattr(st, op)(step[1])

    def done(self, step):
        op = step[0]
        if op == "append":
            self.order.append(step[2])
            self.data[step[2]] = step[3]
            self.kinds[step[2]] = step[1]
            self.last = step[2]
        elif op == "release":
            if step[1] in self.order:
                self.order.remove(step[1])
            self.marked.discard(step[1])
        elif op == "mark":
            self.marked.add(step[1])
        elif op == "unmark":
            self.marked.discard(step[1])
        elif op == "in_add":
            self.ins.add(step[1])
        elif op == "in_release":
            self.ins.discard(step[1])
        elif op == "in_clear":
            self.ins = set()
        elif op == "set_meta":
            self.meta[step[1]] = step[2]
        elif op == "float":
            self.floating.add(step[1])
        self.inflight = None


def verify(st, m, where):
    """st holds what m says, give or take the one interrupted call; then m
    adopts the store's answer for that call."""
    u = m.inflight
    op = u[0] if u else None
    up = u[1] if op in ("release", "mark", "unmark", "in_add", "in_release") else (u[2] if op == "append" else None)
    got = st.pending()
    exp = list(m.order)
    if op == "append" and up in got:
        exp.append(up)
    if op == "release" and up not in got and up in exp:
        exp.remove(up)
    fl = m.floating
    same = got == exp or (fl and [p for p in got if p not in fl] == [p for p in exp if p not in fl]
                          and sorted(got) == sorted(exp))
    assert same, "%s: pending %r, expected %r (in flight %r)" % (where, got, exp, u)
    assert st.count() == len(exp), where
    for pid in got:
        d = u[3] if (op == "append" and pid == up) else m.data[pid]
        k = u[1] if (op == "append" and pid == up) else m.kinds[pid]
        assert read_all(st, pid) == d, "%s: bytes of %d differ" % (where, pid)
        assert st.kind(pid) == k, where
        want = pid in m.marked
        if (op == "mark" or op == "unmark") and pid == up:
            want = st.marked(pid)
        assert st.marked(pid) == want, "%s: mark of %d is %r (in flight %r)" % (where, pid, st.marked(pid), u)
    for pid in range(1, 13):
        want = pid in m.ins
        if (op in ("in_add", "in_release") and pid == up) or op == "in_clear":
            want = st.in_has(pid) if (want or op != "in_clear") else False
        assert st.in_has(pid) == want, "%s: inbound id %d is %r (in flight %r)" % (where, pid, st.in_has(pid), u)
    for k in ("client", "subs", "boot"):
        v = st.meta(k)
        ok = v == m.meta.get(k) or (op == "set_meta" and u[1] == k and v == u[2])
        assert ok, "%s: meta %s is %r, expected %r (in flight %r)" % (where, k, v, m.meta.get(k), u)
    last = st.last_pid()
    assert last == m.last or (op == "append" and last == up), "%s: last_pid %d, expected %d" % (where, last, m.last)
    # adopt what the store says about the interrupted call
    if u is not None:
        if op == "append" and up in got:
            m.done(u)
        elif op == "release" and up not in got:
            m.done(u)
        elif op in ("mark", "unmark") and up in got:
            if st.marked(up):
                m.marked.add(up)
            else:
                m.marked.discard(up)
        elif op in ("in_add", "in_release", "in_clear"):
            m.ins = set(p for p in range(1, 13) if st.in_has(p))
        elif op == "set_meta" and st.meta(u[1]) == u[2]:
            m.meta[u[1]] = u[2]
        m.inflight = None


def run(rig, steps, cut_at, seed):
    """Fresh medium, power cut at op cut_at; returns (model, ops done, cut happened)."""
    rig.fresh()
    m = Model()
    m.last = getattr(rig, "last0", 0)
    cut = False
    try:
        st = rig.boot(cut_at, seed)
        for step in steps:
            m.apply(st, step)
            if rig.dead():
                raise PowerCut("died inside the call")
            m.done(step)
    except Exception:  # any failure once the power is gone is the cut itself
        if not rig.dead():
            raise
        cut = True
    n = rig.ops()
    rig.off()
    return m, n, cut


def crash_and_check(rig, steps, k, seed=1):
    """One crash point: returns True if the power was cut (k within the workload)."""
    m, n, cut = run(rig, steps, k, seed)
    where = "%s cut at op %d (seed %d)" % (rig.name, k, seed)
    st = rig.boot()
    try:
        verify(st, m, where)
        # the recovered store keeps working, and another reboot keeps it all
        base = 60000 + (k % 1000)
        for i in range(3):
            if not st.has(base + i):
                s = ("append", PUBLISH, base + i, b"\x32\x05after%d" % i)
                try:
                    m.apply(st, s)
                except OSError as e:  # a full store may refuse it (cleanly: the reboot checks that)
                    assert e.args[0] == 28, "%s: %r" % (where, e)
                    m.inflight = None
                    continue
                m.done(s)
        if m.order:
            p = m.order[0]
            m.apply(st, ("release", p))
            m.done(("release", p))
        st.set_meta("boot", b"again")
        m.meta["boot"] = b"again"
        st.close()
    finally:
        rig.off()
    st = rig.boot()
    try:
        verify(st, m, where + ", second boot")
        st.close()
    finally:
        rig.off()
    return cut


def total_ops(rig, steps):
    m, n, cut = run(rig, steps, 0, 1)
    assert not cut
    return n


def sweep(rig, steps, ks, seed=1, report=None):
    """Cut at every k in ks; returns the list of failures (k, message)."""
    failures = []
    for k in ks:
        try:
            crash_and_check(rig, steps, k, seed + k)
        except Exception as e:  # noqa: B902 - collected and reported
            failures.append((k, "%s: %s" % (type(e).__name__, e)))
            if report:
                report("FAIL k=%d %s" % (k, failures[-1][1]))
    return failures


def sample(total, count, seed):
    r = Rng(seed)
    ks = set([1, 2, total])
    while len(ks) < min(count, total):
        ks.add(1 + r.below(total))
    return sorted(ks)


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
        run(rig, steps, 0, 1)
        dev = NorFlash(rig.path, blocks=rig.blocks, block_size=rig.bs)
        erases = dev.counters()["erases_total"]
        dev.close()
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
        rig.fresh()
        dev = NorFlash(rig.path, blocks=rig.blocks, block_size=rig.bs)
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
        dev.close()
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
                                (PosixRig(wraps=True, segment_bytes=1024, max_segments=3), 200, 40, 18)):
        steps = script(seed, n, rig.last0)
        try:
            m, ops, cut = run(rig, steps, 0, 1)
            st = rig.boot()
            wrapped = st._rseq < 1000 and (st._nextseq < 100 if rig.name == "flash" else max(st._segs) < 100)
            rig.off()
            assert wrapped, "%s: the workload does not reach the wraps" % rig.name
            ks = sample(ops, count, seed)
            fails = sweep(rig, steps, ks, seed)
            assert not fails, "%s: %d of %d crash points failed: %r" % (rig.name, len(fails), len(ks), fails[:3])
        finally:
            rig.cleanup()


def stale_steps(seed, n):
    """A message never acknowledged, then the record sequence 2^28 + 5 further
    on (what that many records leave), then the script: the next relocation
    of the stuck message gives it a fresh sequence, cut at any point."""
    return [("float", 65000), ("append", PUBLISH, 65000, b"\x32\x05stuck"), ("mark", 65000),
            ("jump", (1 << 28) + 5)] + script(seed, n)


def test_powercut_across_a_stale_refresh():
    for rig, seed in ((FlashRig(), 19), (FlashRig(append_acks=True), 20),
                      (PosixRig(segment_bytes=1024, max_segments=3), 21)):
        steps = stale_steps(seed, 200)
        try:
            m, ops, cut = run(rig, steps, 0, 1)
            st = rig.boot()
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
    _sampled(PosixRig(segment_bytes=1024, max_segments=3), 200, 150, 14)


def test_powercut_file_littlefs_on_nor():
    _sampled(LfsRig(segment_bytes=2048, max_segments=3), 120, 80, 15)


def full_store_steps(blocks, bs, opts, st=None, cycles=3):
    """Appends until the store refuses one (found on a RAM flash of the same
    geometry, or on st), then what a full outbox meets: PUBRECs, a broker that
    lost the session (in_clear, unmark), PUBRECs again, marks toggled back and
    forth past the three in-place mark bytes, and the PUBACKs that drain it."""
    if st is None:
        st = FlashStore(NorFlash(None, blocks=blocks, block_size=bs), verbose=False, **opts).open()
    r = Rng(7)
    out = [("in_add", 3)]
    st.in_add(3)
    pid = 0
    while True:
        pid += 1
        s = ("append", PUBLISH, pid, b"\x34\x4e" + bytes(r.bytes(20 + r.below(bs // 4))))
        try:
            st.append(s[1], s[2], s[3][:2], s[3][2:])
        except OSError:
            break
        out.append(s)
    kept = list(range(1, pid))
    out += [("mark", p) for p in kept[::2]]
    out += [("in_clear",)] + [("unmark", p) for p in kept[::2]]
    for _ in range(cycles):
        out += [("mark", kept[0]), ("mark", kept[-1]), ("unmark", kept[0]), ("unmark", kept[-1])]
    out += [("mark", p) for p in kept[1::2]]
    out += [("release", p) for p in kept]
    return out


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


def file_full_store_steps(rig, cycles):
    """full_store_steps for a FileStore rig: the refusal point is found by an
    uncut run on the rig itself."""
    rig.fresh()
    st = rig.boot()
    try:
        return full_store_steps(0, 512, None, st, cycles)
    finally:
        st.close()
        rig.off()


def test_powercut_file_full_store_acks():
    """FileStore filled until it refuses (its byte budget on POSIX files; the
    budget LittleFS's free blocks give on the emulated NOR flash), then the
    acks of a full outbox, with enough mark cycles that segments must be
    compacted: a power cut at a seeded sample of operations (300 of ~1,200 on
    POSIX, 12 of ~50,000 flash operations on LittleFS): nothing accepted is
    lost, no ack fails for room, a refused append leaves nothing behind."""
    for rig, cycles, count in (
        (PosixRig(max_bytes=6000, segment_bytes=500), 60, 300),
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
