"""A model-based test of the session at its capacity edges (issue 14).

The real Session and a real store (MemoryStore, FileStore on POSIX files that
lose power, FlashStore on the emulated NOR flash) talk to a broker model
through two byte queues. A seeded generator (plain Python: CPython and
MicroPython run the same examples) draws a list of steps:

  pub q n        publish n bytes (and the message's number) at QoS q (0, 1, 2), online or not
  fill n         publish QoS 1 until the outbox or the store refuses
  sub f / unsub f   subscribe / unsubscribe filter f (online or offline)
  connect        open a connection (CONNECT; the broker answers)
  net            move every queued byte both ways (the broker reads, answers)
  drop           the connection is gone (bytes in flight are lost)
  hold / ack     the broker withholds its acknowledgements / sends them
  forget         the broker loses our session (next CONNACK: session present 0)
  deny k         a refused filter is answered by closing (k=1) or SUBACK 0x80
  in q r n       the broker sends n messages at QoS q (r=0: no PUBREL after PUBREC); after a
                 resumed session, over the Receive Maximum as Mosquitto 2.0.11 does
  cut k          the power goes at the store's k-th next operation; reboot
  restart m      a clean restart with max_pending m (a new session on the same store)

After every step the invariants are checked:
- every message publish() accepted is in the store, in publish order, until
  the broker acknowledged it (or, after a power cut, it was delivered);
- the session's pending list and the store's agree; the store reopens;
- tables stay bounded (ring, store, subscriptions, inbound QoS 2 ids; and the
  heap on MicroPython);
- every error the library raises is typed (OSError, MQTTError);
and at the end, with faults off, the outbox drains: every accepted message
was delivered at least once, QoS 2 exactly once (unless the broker lost the
session while it was pending, the documented exception), in publish order;
inbound QoS 2 was delivered at most once.

A failure is shrunk by removing steps while it still fails, and reported with
its seed and the minimal step list.
"""

import gc

from check import MICROPYTHON, Rng
from norflash import NorFlash, PowerCut
from tern.codec import Packet, encode, decode, frame_size
from tern.flashstore import FlashStore
from tern.session import Session, WOULD_BLOCK, EV_PUBLISHED, CONNECTED
from tern.store import MemoryStore
from tern.wire import MQTTError

FILTERS = ("a/#", "b", "c/+", "deny")
TOPIC = "a/x"
HEAP_BOUND = 600000  # bytes allocated on MicroPython after a collection, at any step


class Finding(Exception):
    pass


# -- rigs: a store that may lose power and boot again ----------------------------------
class MemRig:
    name = "memory"
    cuts = False

    def __init__(self, wraps=False):
        self.wraps = wraps

    def boot(self):
        self.st = MemoryStore()
        if self.wraps:
            from test_store_powercut import PID0

            self.st._last = PID0  # the session's packet ids wrap 35 messages in
        return self.st

    def cut_in(self, k):
        pass

    def reboot(self):
        return self.st  # RAM kept: a restart of the session only

    def cleanup(self):
        pass


class FlashRig:
    """FlashStore on a RAM NorFlash: a cut tears the k-th program or erase."""

    name = "flash"
    cuts = True

    def __init__(self, blocks=4, block_size=1024, wraps=False, **opts):
        self.blocks, self.bs, self.opts = blocks, block_size, opts
        self.dev = None
        self.wraps = wraps

    def _dev(self, seed=1):
        old = self.dev
        self.dev = NorFlash(None, blocks=self.blocks, block_size=self.bs, seed=seed)
        if old is not None:
            self.dev.mem[:] = old.mem
        return FlashStore(self.dev, verbose=False, **self.opts).open()

    def boot(self):
        self.dev = None
        if self.wraps:  # counters just before their wraps (test_store_powercut.near_wraps)
            from test_store_powercut import flash_near_wraps

            self.dev = NorFlash(None, blocks=self.blocks, block_size=self.bs)
            flash_near_wraps(self.dev, self.opts)
        return self._dev()

    def cut_in(self, k):
        self.dev.cut_at = self.dev.ops + k

    def reboot(self):
        return self._dev(self.dev.ops)

    def cleanup(self):
        pass


class FileRig:
    """FileStore on POSIX files with a power cut at the k-th write/sync/remove
    (test_store_powercut's CutFs: a file keeps what was synced and a random
    part of what was written after)."""

    name = "file"
    cuts = True

    def __init__(self, **opts):
        from test_store_powercut import PosixRig

        self.rig = PosixRig(**opts)

    def boot(self):
        self.rig.fresh()
        return self.rig.boot()

    def cut_in(self, k):
        c = self.rig.cfs
        c.cut_at = c.n + k

    def reboot(self):
        return self.rig.boot(0, self.rig.cfs.n + 1)

    def cleanup(self):
        self.rig.cleanup()


# -- the broker model --------------------------------------------------------------------
def pid_of(p):
    return p[2] << 8 | p[3]


class Broker:
    def __init__(self, v):
        self.v = v
        self.sess = None  # {"subs": set, "q2": set of our pids awaiting PUBREL, "out": {pid: [qos, rel, msg]}}
        self.up = False
        self.rx = bytearray()
        self.tx = bytearray()
        self.forget = False
        self.hold = False
        self.held = []
        self.deny_close = False
        self.delivered = []  # payloads of the client's messages, in the order the broker took them
        self.next_pid = 0
        self.next_msg = 0
        self.extra = 0

    def send(self, b):
        if self.hold and b[0] >> 4 in (4, 5, 6, 7, 9, 11):
            self.held.append(b)
        else:
            self.tx += b

    def close(self):
        self.up = False
        self.rx = bytearray()
        self.tx = bytearray()
        self.held = []

    def read(self):
        # Handle every whole packet the client sent. Returns False when the broker closed.
        v = self.v
        while self.up:
            n = frame_size(self.rx, 0, len(self.rx), 1 << 20) if self.rx else -1
            if n < 0 or n > len(self.rx):
                return True
            b = bytes(self.rx[:n])
            self.rx = self.rx[n:]
            t = b[0] >> 4
            if t == 1:
                p = decode(b, v)
                sp = bool(self.sess) and not self.forget and not p.clean
                if not sp:
                    self.sess = {"subs": set(), "q2": set(), "out": {}}
                self.forget = False
                # Mosquitto 2.0.11: what it resends on a resumed session does not count
                # against Receive Maximum (more may come on top)
                self.extra = len(self.sess["out"]) * 2 if sp else 0
                self.tx += encode(Packet(2, session_present=sp), v)
                for pid in sorted(self.sess["out"]):  # resend our in-flight messages
                    q, rel, msg, _ = self.sess["out"][pid]
                    self.tx += (encode(Packet(6, pid=pid), v) if rel else
                                encode(Packet(3, topic="i", payload=b"%d" % msg, qos=q, pid=pid, dup=True), v))
                continue
            s = self.sess
            if t == 3:
                p = decode(b, v)
                if p.qos < 2 or p.pid not in s["q2"]:
                    self.delivered.append((int(bytes(p.payload).split(b":")[0]), p.qos))
                if p.qos == 1:
                    self.send(encode(Packet(4, pid=p.pid), v))
                elif p.qos == 2:
                    s["q2"].add(p.pid)
                    self.send(encode(Packet(5, pid=p.pid), v))
            elif t == 6:
                s["q2"].discard(pid_of(b))
                self.send(encode(Packet(7, pid=pid_of(b)), v))
            elif t == 8:
                p = decode(b, v)
                f = p.topics[0][0]
                if f == "deny":
                    if self.deny_close:
                        self.close()
                        return False
                    self.send(encode(Packet(9, pid=p.pid, reasons=[0x80]), v))
                else:
                    s["subs"].add(f)
                    self.send(encode(Packet(9, pid=p.pid, reasons=[p.topics[0][1]]), v))
            elif t == 10:
                p = decode(b, v)
                s["subs"].discard(p.topics[0])
                self.send(encode(Packet(11, pid=p.pid, reasons=[0] if v == 5 else []), v))
            elif t == 4 or t == 7:
                s["out"].pop(pid_of(b), None)
            elif t == 5:
                e = s["out"].get(pid_of(b))
                if e is not None:
                    e[1] = True
                    if e[3]:
                        self.tx += encode(Packet(6, pid=pid_of(b)), v)
            elif t == 14:
                self.close()
                return False
        return False

    def inbound(self, q, rel, cap):
        # A message for the client (it takes any topic to on_message), within its Receive Maximum
        if not self.up or q and len(self.sess["out"]) >= cap + self.extra:
            return
        self.next_msg += 1
        pid = 0
        if q:
            self.next_pid = self.next_pid % 65535 + 1
            pid = self.next_pid
            self.sess["out"][pid] = [q, False, self.next_msg, rel]
        self.tx += encode(Packet(3, topic="i", payload=b"%d" % self.next_msg, qos=q, pid=pid), self.v)


# -- the generator -------------------------------------------------------------------
def gen_steps(seed, n):
    r = Rng(seed)
    out = []
    for _ in range(n):
        c = r.below(100)
        if c < 22:
            out.append(("pub", (1, 1, 2, 0)[r.below(4)], (0, 0, 40, 160, 400)[r.below(5)]))
        elif c < 26:
            out.append(("fill", (0, 160)[r.below(2)]))
        elif c < 32:
            out.append(("sub", r.below(len(FILTERS))))
        elif c < 35:
            out.append(("unsub", r.below(len(FILTERS))))
        elif c < 47:
            out.append(("connect",))
        elif c < 68:
            out.append(("net",))
        elif c < 74:
            out.append(("drop",))
        elif c < 78:
            out.append(("hold",))
        elif c < 83:
            out.append(("ack",))
        elif c < 86:
            out.append(("forget",))
        elif c < 88:
            out.append(("deny", r.below(2)))
        elif c < 95:
            out.append(("in", r.below(3), r.below(4) != 0, 1 + r.below(6)))
        elif c < 98:
            out.append(("cut", 1 + r.below(24)))
        else:
            out.append(("restart", 4 + r.below(5)))
    return out


# -- one run ---------------------------------------------------------------------------
class Run:
    def __init__(self, rig, v, max_pending, receive_max=4):
        self.rig = rig
        self.v = v
        self.max_pending = max_pending
        self.rm = receive_max
        self.b = Broker(v)
        self.seq = 0
        self.live = []  # [pid, seq, qos] of accepted messages not yet acknowledged, in publish order
        self.acked = set()
        self.maybe = set()  # seqs of a publish the power cut interrupted (stored or not)
        self.maybe_pids = set()  # and the packet ids they were stored under, when they were
        self.dup_ok = set()  # QoS 2 seqs the broker may take twice (it lost the session meanwhile)
        self.in_got = []  # inbound messages delivered to the app (QoS, msg)
        self.errors = []  # typed errors seen (kept for the report)
        self.now = 0
        self.st = rig.boot()
        self.s = self._session()

    def _session(self):
        s = Session("model", self.v, False, store=self.st, max_pending=self.max_pending, window=2,
                    rx_size=512, tx_size=256, receive_max=self.rm)
        s.send = self._send
        s.on_event = self._event
        s.on_message = lambda m: self.in_got.append((m.qos, int(bytes(m.payload))))
        return s

    def _send(self, buf, off, n):
        if self.b.up:
            self.b.rx += bytes(buf[off : off + n])

    def _event(self, kind, a, b):
        if kind == EV_PUBLISHED:
            if b >= 0x80:
                raise Finding("message %d refused with 0x%02X" % (a, b))
            for e in self.live:
                if e[0] == a:
                    self.live.remove(e)
                    self.acked.add(e[1])
                    return
            if a in self.maybe_pids:
                self.maybe_pids.discard(a)
                return
            raise Finding("EV_PUBLISHED for packet %d, not a live message" % a)

    # faults and library calls ---------------------------------------------------------
    def call(self, f, *a):
        """A library call: PowerCut reboots, typed errors are kept, others are findings."""
        try:
            return f(*a)
        except PowerCut:
            self.reboot()
        except (OSError, MQTTError) as e:
            self.errors.append(repr(e))
            if self.s.state != CONNECTED:
                self.b.close()
        except Finding:
            raise
        except Exception as e:
            raise Finding("untyped error %r from %s" % (e, getattr(f, "__name__", f)))
        return None

    def reboot(self):
        self.b.close()
        try:
            self.st = self.rig.reboot()
            self.s = self._session()
        except Exception as e:
            raise Finding("the store does not reopen after a power cut: %r" % e)
        have = self.st.pending()
        lp = [e[0] for e in self.live]
        self.maybe_pids = set(p for p in have if self.st.kind(p) == 3 and p not in lp)
        for e in self.live[:]:
            if e[0] not in have:
                # lost unless the broker had it (the cut came in the release after its ack)
                if not any(d[0] == e[1] for d in self.b.delivered):
                    raise Finding("accepted message %d (pid %d) lost at a power cut" % (e[1], e[0]))
                self.live.remove(e)
                self.acked.add(e[1])

    def connect(self):
        if self.s.state != 0:
            return
        if self.b.forget and self.b.sess:
            # what the broker took at QoS 2 and the client still holds may now come twice
            for e in self.live:
                if e[2] == 2:
                    self.dup_ok.add(e[1])
        self.b.close()
        self.b.up = True
        self.call(self.s.connect_packet, self.now)
        self.net()

    def net(self):
        for _ in range(50):
            if not self.b.up:
                break
            if not self.b.read():
                self.s.connection_lost()
                break
            if not self.b.tx:
                break
            data = bytes(self.b.tx)
            self.b.tx = bytearray()
            self.call(self.s.feed, data, self.now)

    def publish(self, q, size):
        self.seq += 1
        seq = self.seq
        try:
            pid = self.s.publish(TOPIC, b"%d:" % seq + b"x" * size, q, False, self.now)
        except PowerCut:
            self.maybe.add(seq)
            self.reboot()
            return False
        except (OSError, MQTTError) as e:  # NotConnected (QoS 0 offline), ENOSPC, a lost connection
            self.errors.append(repr(e))
            if self.s.state != CONNECTED:
                self.b.close()
            return False
        except Exception as e:
            raise Finding("untyped error %r from publish" % e)
        if pid == WOULD_BLOCK or not q:
            return False
        if q and pid:
            self.live.append([pid, seq, q])
        return True

    def step(self, st):
        k = st[0]
        s = self.s
        self.now += 10
        if k == "pub":
            self.publish(st[1], st[2])
        elif k == "fill":
            for _ in range(self.max_pending + 2):
                if not self.publish(1, st[1]):
                    break
        elif k == "sub":
            self.call(s.subscribe, FILTERS[st[1]], 1, self.now)
        elif k == "unsub":
            self.call(s.unsubscribe, FILTERS[st[1]], self.now)
        elif k == "connect":
            self.connect()
        elif k == "net":
            self.net()
        elif k == "drop":
            self.b.close()
            s.connection_lost()
        elif k == "hold":
            self.b.hold = True
        elif k == "ack":
            self.b.hold = False
            if self.b.up:
                for h in self.b.held:
                    self.b.tx += h
            self.b.held = []
            self.net()
        elif k == "forget":
            self.b.forget = True
        elif k == "deny":
            self.b.deny_close = bool(st[1])
        elif k == "in":
            for _ in range(st[3] if len(st) > 3 else 1):
                self.b.inbound(st[1], st[2], self.rm)
            self.net()
        elif k == "cut":
            if self.rig.cuts:
                self.rig.cut_in(st[1])
        elif k == "restart":
            self.max_pending = st[1]
            self.call(s.disconnect, self.now)
            self.b.close()
            self.reboot()

    # invariants --------------------------------------------------------------------
    def check(self):
        s, st = self.s, self.st
        try:
            sp = s.pending()
            stp = st.pending()
            kinds = [st.kind(p) for p in stp]
        except PowerCut:
            return  # a read after the power went: the next step reboots
        if sp != stp:
            raise Finding("session pending %r != store pending %r" % (sp, stp))
        pubs = [p for p, kd in zip(stp, kinds) if kd == 3]
        want = [e[0] for e in self.live]
        j = 0
        for p in pubs:  # the live messages appear in the store in publish order
            if j < len(want) and p == want[j]:
                j += 1
        if j != len(want):
            raise Finding("live message pid %d missing or out of order in the store %r (live %r)"
                          % (want[j], stp, [e[:2] for e in self.live]))
        cap = len(s._rflags)
        if cap > max(self.max_pending, 8) or s._n > cap or st.count() > cap:
            raise Finding("ring or store over its bound: cap %d, n %d, store %d" % (cap, s._n, st.count()))
        if len(s._subs) > len(FILTERS) or len(s._gone) > len(FILTERS) or s._in2 > s._in_cap:
            raise Finding("a table grew: subs %d, gone %d, inbound QoS 2 %d" % (len(s._subs), len(s._gone), s._in2))
        if MICROPYTHON and self.now % 200 == 0:
            gc.collect()
            if gc.mem_alloc() > HEAP_BOUND:
                raise Finding("heap %d over %d" % (gc.mem_alloc(), HEAP_BOUND))

    def drain(self):
        """Faults off: connect, acknowledge, until the outbox is empty."""
        b = self.b
        b.hold = False
        b.deny_close = False
        b.forget = False
        for h in b.held:
            if b.up:
                b.tx += h
        b.held = []
        for _ in range(400):
            if not self.live and not self.s.pending() and not b.held:
                break
            if self.s.state == 0:
                self.connect()
            self.net()
            if self.s.state == CONNECTED and not b.tx and not b.rx:
                # nothing moves: resends come only after a reconnect
                self.b.close()
                self.s.connection_lost()
        if self.live or self.s.pending():
            raise Finding("outbox did not drain: live %r, pending %r" % ([e[:2] for e in self.live], self.s.pending()))
        # delivered: every accepted message, first deliveries in publish order, QoS 2 once
        first = []
        seen = {}
        for seq, q in b.delivered:
            if seq in seen:
                if q == 2 and seq not in self.dup_ok and seq not in self.maybe:
                    raise Finding("QoS 2 message %d delivered twice" % seq)
                continue
            seen[seq] = q
            if seq not in self.maybe:
                first.append(seq)
        accepted = sorted(self.acked)
        got = [x for x in first if x in self.acked]
        if got != accepted:
            missing = [x for x in accepted if x not in seen]
            raise Finding("deliveries %r, accepted %r (missing %r)" % (first, accepted, missing))
        if got != sorted(got):
            raise Finding("delivered out of publish order: %r" % got)
        ins = {}
        for q, m in self.in_got:
            if q == 2 and m in ins:
                raise Finding("inbound QoS 2 message %d delivered twice" % m)
            ins[m] = q


RIGS = {
    "memory": lambda: MemRig(),
    "flash": lambda: FlashRig(blocks=4, block_size=1024),
    "file": lambda: FileRig(max_bytes=4000, segment_bytes=500),
    # the same with every counter just before its wrap (packet id; record and
    # sector sequence; segment number): see test_store_powercut.near_wraps
    "memory-wrap": lambda: MemRig(wraps=True),
    "flash-wrap": lambda: FlashRig(blocks=4, block_size=1024, wraps=True),
    "file-wrap": lambda: FileRig(max_bytes=4000, segment_bytes=500, wraps=True),
}


def run(rig_name, seed, steps, v=4, max_pending=6):
    """Run one example; returns None, or the Finding's message."""
    rig = RIGS[rig_name]()
    try:
        r = Run(rig, v, max_pending)
        for st in steps:
            r.step(st)
            r.check()
        r.drain()
        r.check()
        return None
    except Finding as e:
        return str(e)
    finally:
        rig.cleanup()


def shrink(rig_name, seed, steps, v, max_pending):
    """Remove steps while the example still fails: chunks first, then one by one."""
    cur = list(steps)
    while True:
        before = len(cur)
        n = len(cur) // 2
        while n >= 1:
            i = 0
            while i < len(cur):
                trial = cur[:i] + cur[i + n :]
                if run(rig_name, seed, trial, v, max_pending):
                    cur = trial
                else:
                    i += n
            n //= 2
        if len(cur) == before:
            return cur


def example(rig_name, seed, n_steps):
    """Example `seed` on a rig: its protocol version and max_pending come from the seed."""
    v = (4, 5)[seed % 2]
    mp = 4 + seed % 5
    steps = gen_steps(seed, n_steps)
    err = run(rig_name, seed, steps, v, mp)
    if err is None:
        return None
    small = shrink(rig_name, seed, steps, v, mp)
    return "%s seed %d (MQTT %d, max_pending %d): %s\nminimal steps (%d of %d): %r" % (
        rig_name, seed, v, mp, run(rig_name, seed, small, v, mp), len(small), len(steps), small)


def budget(rigs, seeds, n_steps):
    """Run every seed on every rig; returns (examples run, findings)."""
    found = []
    count = 0
    for seed in seeds:
        for name in rigs:
            count += 1
            f = example(name, seed, n_steps)
            if f:
                found.append(f)
    return count, found
