"""The store-level power-cut engine: a scripted workload of store calls (appends, marks, unmarks,
releases, inbound ids, in_clear, meta) run on a kit rig with the power cut at its k-th operation (a
torn program, erase, write or sync), then a reboot and the store contract checked against a model of
what returned before the cut:
- the store always opens;
- every append that returned is pending (unless its release returned), in the original order, with
  its bytes and kind; marks preserved; releases that returned stay released; inbound ids and the
  latest meta values kept; last_pid kept. The one call the power cut interrupted may have happened
  or not, nothing else.
- the recovered store keeps working: more calls, another reboot, same checks.

test_store_powercut.py runs samples of it on both runtimes; tools/store_sweep.py every cut point.
"""

from norflash import NorFlash, PowerCut
from tern.flashstore import FlashStore
from tern.store import PUBLISH, SUBSCRIBE, UNSUBSCRIBE

from . import kit
from .check import Rng, read_all


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
        st = rig.power_on(cut_at, seed)
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
    st = rig.power_on()
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
    st = rig.power_on()
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
    """Cut at every k in ks; returns the failures ("k=K Error: message"), each reported as it comes."""

    def one(k):
        try:
            crash_and_check(rig, steps, k, seed + k)
        except Exception as e:  # noqa: B902 - collected and reported
            return "k=%d %s: %s" % (k, type(e).__name__, e)
        return None

    return kit.sweep(ks, one, report)


def stale_steps(seed, n):
    """A message never acknowledged, then the record sequence 2^28 + 5 further
    on (what that many records leave), then the script: the next relocation
    of the stuck message gives it a fresh sequence, cut at any point."""
    return [("float", 65000), ("append", PUBLISH, 65000, b"\x32\x05stuck"), ("mark", 65000),
            ("jump", (1 << 28) + 5)] + script(seed, n)


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


def file_full_store_steps(rig, cycles):
    """full_store_steps for a FileStore rig: the refusal point is found by an
    uncut run on the rig itself."""
    rig.fresh()
    st = rig.power_on()
    try:
        return full_store_steps(0, 512, None, st, cycles)
    finally:
        st.close()
        rig.off()
