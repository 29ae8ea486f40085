"""The send ring's lifecycle (issue 39): the states and transitions listed once, in tern.replay's
docstring, are the only ones the code makes.

Each Session the model's runs create (tests/lib/model.py: a real Client over a byte stream to its
broker model, a real store; publishes at QoS 0/1/2 through Client.publish, acknowledgements held
and sent, reconnects with everything pending, the server's limits refusing what is stored, power
cuts, storage that fails and returns) gets its ring's two arrays wrapped: every write of a packet
id or of a flags byte is turned into a transition of that packet id's entry (from its state to the
state the new flags make) and looked up in the table. A flags byte that is no listed state, or a
transition the table does not list, fails the test. Under CPython the function that made the
write (the nearest of the table's code column up the stack) must be one the row names, too.
The table is read from the module's text (MicroPython keeps no docstrings), on both runtimes.
"""

import sys

from tests.lib import model
import tern.session
import tern.wire
from check import MICROPYTHON

MP_HEAPSIZE = "2m"
MP_TIMEOUT = 280

LIB = tern.wire.__file__.rpartition("/")[0]
FLAGS = ("SENT", "QOS2", "MARKED", "CTRL", "EVER", "OLD", "GONE", "TOLD")


def _text(name):
    with open(LIB + "/" + name) as f:
        return f.read()


def flag_values(module="session.py"):
    """{"_SENT": 1, ...}: the ring's flags as session.py (or replay.py) defines them."""
    out = {}
    for line in _text(module).split("\n"):
        for n in FLAGS:
            if line.startswith("_%s = const(" % n):
                out["_" + n] = int(line.split("const(")[1].split(")")[0])
    assert len(out) == len(FLAGS), out
    return out


def read_table():
    """(states, transitions) from tern.replay's docstring: states {name: (kind, flags)};
    transitions {(from, to): set of code names}."""
    text = _text("replay.py")
    doc = text.split('"""')[1]
    fv = flag_values()
    lines = doc.split("\n")
    states = {}
    i = 0
    while not lines[i].startswith("  state "):
        i += 1
    i += 1
    while lines[i].strip():
        tok = lines[i].split()
        bits = 0
        for t in tok[2:]:
            if t == "-":
                break
            if not t.startswith("_"):
                break
            bits |= fv[t]
        states[tok[0]] = (tok[1], bits)
        i += 1
    while not lines[i].startswith("  Transitions"):
        i += 1
    rows = []
    for line in lines[i + 1 :]:
        if line.startswith("    ") and rows:
            rows[-1] += " " + line.strip()
        elif line.strip():
            rows.append(line.strip())
    trans = {}
    for r in rows:
        left, _, rest = r.partition(" > ")
        tos, _, rest = rest.partition(":")
        codes = rest[rest.rindex("[") + 1 : rest.rindex("]")].split()
        froms = list(states) if left.strip() == "*" else left.split()
        for a in froms:
            for b in tos.split():
                assert a in states and b in states, "table row names an unknown state: %r" % r
                trans.setdefault((a, b), set()).update(codes)
    return states, trans


STATES, TRANS = read_table()
FV = flag_values()
CODES = set()
for _c in TRANS.values():
    CODES |= _c


def classify(f):
    """The state a flags byte makes (None: none the table lists)."""
    q2, ctl = FV["_QOS2"], FV["_CTRL"]
    for name, (kind, bits) in STATES.items():
        if name == "free":
            continue
        base = f & ~q2 if bits & ctl else f & ~(q2 | ctl)
        if base != bits:
            continue
        if kind == "pub" and f & ctl or kind == "q2" and (f & ctl or not f & q2) or kind == "ctl" and not f & ctl:
            continue
        return name
    return None


class Watch:
    """The transitions one run makes, checked as they happen."""

    def __init__(self):
        self.state = {}  # packet id -> state
        self.slot = {}  # packet id -> its ring slot
        self.bad = []
        self.seen = set()  # (from, to) made
        self.ring = None

    def cause(self):
        # CPython: the nearest function up the stack that the table's code column names (in
        # lib/tern); MicroPython has no frames to walk: None.
        if MICROPYTHON:
            return None
        f = sys._getframe(3)
        chain = []
        while f is not None:
            n = f.f_code.co_name
            chain.append(n)
            if n in CODES and f.f_code.co_filename.startswith(LIB):
                return n
            f = f.f_back
        return "?" + "<".join(chain[:6])

    def move(self, pid, a, b, code):
        if b is None:
            self.bad.append("packet %d: flags that make no listed state (from %s) by %s" % (pid, a, code))
            return
        self.seen.add((a, b))
        ok = TRANS.get((a, b))
        if ok is None:
            self.bad.append("packet %d: %s > %s is not in the table (by %s)" % (pid, a, b, code))
        elif code is not None and code not in ok:
            self.bad.append("packet %d: %s > %s made by %s, the table says %s" % (pid, a, b, code, sorted(ok)))
        if b == "free":
            self.state.pop(pid, None)
            self.slot.pop(pid, None)
        else:
            self.state[pid] = b

    def ring_write(self, i, old, v):
        if old and old != v and self.slot.get(old) == i:
            self.move(old, self.state.get(old, "free"), "free", self.cause())
        if v:
            self.slot[v] = i

    def flags_write(self, i, f):
        pid = self.ring.a[i]
        if not pid:
            if f:
                self.bad.append("flags 0x%02x written to a free slot" % f)
            return
        self.move(pid, self.state.get(pid, "free"), classify(f), self.cause())

    def attach(self, s, code):
        # Wrap s's arrays (at a boot, and after tern.replay.follow made larger ones): the entries
        # they hold came from the earlier state of their packet ids (free at a boot).
        if isinstance(s._rflags, Flags):
            return
        live = {}
        i = s._head
        for _ in range(s._n):
            if s._ring[i]:
                live[s._ring[i]] = (i, s._rflags[i])
            i = (i + 1) % s._cap
        for pid in list(self.state):
            if pid not in live:
                self.move(pid, self.state[pid], "free", code)
        for pid, (i, f) in live.items():
            self.slot[pid] = i
            if classify(f) != self.state.get(pid):
                self.move(pid, self.state.get(pid, "free"), classify(f), code)
        self.ring = s._ring = Ring(s._ring, self)
        s._rflags = Flags(s._rflags, self)

    def settle(self, s):
        # After a step: arrays tern.replay.follow replaced are wrapped; entries it dropped from the
        # ring without a write (it rebuilds from the head) are gone by it.
        if not isinstance(s._rflags, Flags):
            self.attach(s, "_follow" if not MICROPYTHON else None)
            return
        live = set()
        i = s._head
        for _ in range(s._n):
            if s._ring[i]:
                live.add(s._ring[i])
            i = (i + 1) % s._cap
        for pid in list(self.state):
            if pid not in live:
                self.move(pid, self.state[pid], "free", "_follow" if not MICROPYTHON else None)


class Ring:
    def __init__(self, a, w):
        self.a = a
        self.w = w

    def __getitem__(self, i):
        return self.a[i]

    def __setitem__(self, i, v):
        old = self.a[i]
        self.a[i] = v
        self.w.ring_write(i, old, v)

    def __len__(self):
        return len(self.a)


class Flags(Ring):
    def __setitem__(self, i, f):
        self.a[i] = f
        self.w.flags_write(i, f)


def watched(rigs, seeds, n_steps):
    """Run the model's examples with every session's ring watched; returns the Watch (all runs)."""
    w = Watch()
    init = tern.session.Session.__init__
    settle_ = tern.session.Session._settle
    run_step = model.Run.step

    def session_init(s, *a, **k):
        init(s, *a, **k)
        w.state = {}
        w.slot = {}
        w.attach(s, "boot")

    def step(run, st):
        run_step(run, st)
        w.settle(run.s)

    def settle(s):
        # tern.replay.follow runs under _settle: what it dropped from the ring is gone by it
        try:
            settle_(s)
        finally:
            w.settle(s)

    tern.session.Session.__init__ = session_init
    tern.session.Session._settle = settle
    model.Run.step = step
    try:
        for seed in seeds:
            v, mp, lowest = model.params(seed)
            for rig in rigs:
                err = model.run(rig, seed, model.gen_steps(seed, 120), v, mp, lowest=lowest)
                assert err is None, "%s seed %d: %s" % (rig, seed, err)
                assert not w.bad, "%s seed %d:\n%s" % (rig, seed, "\n".join(w.bad[:10]))
    finally:
        tern.session.Session.__init__ = init
        tern.session.Session._settle = settle_
        model.Run.step = run_step
    return w


# What the runs below must have made (else they would pass having checked little).
MUST = [("free", "fresh"), ("free", "sent"), ("fresh", "sent"), ("sent", "free"), ("sent", "released"),
        ("released", "free"), ("sent", "waiting"), ("waiting", "sent"), ("released", "release"),
        ("release", "released"), ("free", "waiting"), ("given", "told"), ("told", "free")]


def test_the_table_is_read():
    assert STATES["sent"] == ("any", FV["_SENT"] | FV["_EVER"])
    assert STATES["told"][0] == "ctl" and classify(FV["_GONE"] | FV["_TOLD"] | FV["_SENT"] | FV["_CTRL"]) == "told"
    assert classify(FV["_SENT"]) is None and classify(FV["_OLD"] | FV["_CTRL"]) is None
    assert TRANS[("free", "sent")] == {"pub1"} and ("sent", "fresh") not in TRANS
    assert ("fresh", "released") not in TRANS and ("sent", "waiting5") in TRANS


def test_replay_names_the_flags_as_the_session_does():
    # (each module keeps its own const()s: a const is compiled into its module's code)
    assert flag_values("replay.py") == flag_values(), (flag_values("replay.py"), flag_values())


def test_an_unlisted_transition_fails():
    # The checker itself: a write the table does not list is caught (a sent entry made fresh
    # again, flags that make no state).
    w = Watch()
    w.ring = Ring(bytearray(4), w)
    fl = Flags(bytearray(4), w)
    w.ring[1] = 7
    fl[1] = FV["_SENT"] | FV["_EVER"]  # free > sent: listed (by pub1; here by no listed function)
    fl[1] = 0  # sent > fresh: not listed
    fl[1] = FV["_SENT"]  # no state
    assert any("sent > fresh is not in the table" in b for b in w.bad), w.bad
    assert any("no listed state" in b for b in w.bad), w.bad


def test_the_ring_makes_only_listed_transitions():
    n = 8 if MICROPYTHON else 40
    w = watched(["memory", "flash-gc", "file"], range(300, 300 + n), 120)
    missing = [t for t in MUST if t not in w.seen]
    assert not missing, "the runs never made %r (seen %r)" % (missing, sorted(w.seen))


# Two paths the model's runs do not reach (found by reading the code against the table).
def _watched_session(v, store, **kw):
    from tern.session import Session

    s = Session("c", v, False, store=store, **kw)
    w = Watch()
    w.attach(s, "boot")
    return s, w


def _connack(s, sp, props=None):
    from tern.codec import Packet, encode

    s.connect_packet(0)
    s.feed(encode(Packet(2, session_present=sp, props=props), s.version), 0)


def test_a_subscribe_whose_send_failed_then_superseded_offline_is_released_from_fresh():
    # subscribe() while the link dies leaves its SUBSCRIBE fresh; the app subscribes to the filter
    # again offline, and a CONNACK without our session releases the superseded one: fresh > free.
    from tern.store import MemoryStore

    s, w = _watched_session(4, MemoryStore())
    up = [True]

    def send(b, o, n):
        if not up[0]:
            raise OSError(104, "ECONNRESET")

    s.send = send
    _connack(s, False)
    up[0] = False
    try:
        s.subscribe("cmd/#", 1, 0)
    except OSError:
        pass
    s.connection_lost()
    s.subscribe("cmd/#", 1, 0)
    up[0] = True
    _connack(s, False)
    assert len(s.pending()) == 1, s.pending()  # one SUBSCRIBE of the filter: the first released
    assert ("fresh", "free") in w.seen and not w.bad, (sorted(w.seen), w.bad)


def test_a_message_given_back_at_a_connack_that_failed_before_telling_is_looked_at_again():
    # MQTT 5: a CONNACK whose Maximum Packet Size gives the first stored message back, and whose
    # replay then fails (the store cannot read the second record) before the application is told;
    # the next CONNACK (no limit now) reads both again from their records and sends them, in order.
    from tern.store import MemoryStore
    from tests.lib.kit import Wire

    class FailingRead(MemoryStore):
        fail_pid = 0

        def read(self, pid, off, buf):
            if pid == self.fail_pid:
                self.fail_pid = 0
                raise OSError(5, "EIO")
            return MemoryStore.read(self, pid, off, buf)

    st = FailingRead()
    s, w = _watched_session(5, st, session_expiry=60, window=4)
    wire = Wire(s)
    p1 = s.publish("t/big", b"x" * 300, 1, False, 0)
    p2 = s.publish("t/small", b"y", 1, False, 0)
    st.fail_pid = p2
    try:
        _connack(s, False, {0x27: 100})
    except OSError:
        pass
    wire.take()
    _connack(s, True)
    assert [p.pid for p in wire.take() if p.type == 3] == [p1, p2]
    assert ("given", "waiting5") in w.seen and not w.bad, (sorted(w.seen), w.bad)
