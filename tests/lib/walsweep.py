"""Crash sweep of the write-ahead rule in every group-commit mode (issue 25).

A real Session on a real store in group-commit mode (FlashStore in place,
FlashStore with appended acks, FileStore on POSIX files, FileStore on LittleFS
over the emulated NOR flash) runs a fixed workload against a broker model that
keeps its session across power cuts: QoS 1 and 2 both ways (the broker reuses
a packet id as soon as it is free, as the spec allows), SUBSCRIBE and
UNSUBSCRIBE, acknowledgements withheld and a reconnect, a broker that loses
the session. One run per cut point: the power goes at the k-th operation of
the medium (a torn program, erase, write or sync), or right after the j-th
packet the client sent (everything not synced is lost: a FlashStore's group
buffer is RAM, a file keeps what was synced); the device boots again and the
workload goes on, then drains with faults off. Checked:

- at the reboot, the write-ahead invariant: every packet's announced state is
  in the store unless a later change (an acknowledgement, a lost session) may
  have moved it on: a PUBLISH / SUBSCRIBE / UNSUBSCRIBE sent -> its record;
  PUBREL sent -> the mark; PUBREC sent -> the inbound id; PUBCOMP sent -> the
  id released; a CONNACK without our session handled -> the inbound ids gone;
- at the end: every accepted message delivered at least once, QoS 2 exactly
  once (unless the broker lost the session while it was pending), in publish
  order; every inbound message delivered, QoS 2 at most once (a cut between
  its id being recorded and its handler's end may lose that one delivery, the
  documented trade-off: never a repeat).

tools/store_sweep.py runs every cut point (targets group-*); the pytest part
(test_group_commit_sweep.py) runs a sample on both runtimes.
"""

from check import MICROPYTHON
from norflash import NorFlash, PowerCut
from storekit import _GRAVEYARD, LfsVolume, rmtree, tmppath
from test_store_powercut import CutFs
from tern.codec import Packet, decode, encode, frame_size
from tern.filestore import FileStore
from tern.flashstore import FlashStore
from tern.session import Session, WOULD_BLOCK, EV_PUBLISHED, EV_CONNACK, CONNECTED


class Finding(Exception):
    pass


# -- rigs: a group-commit store on a medium that can die now, or at its k-th operation ----
class FlashRig:
    def __init__(self, **opts):
        self.opts = dict(opts, group_commit=True)
        self.dev = None

    def boot(self, cut_at=0):
        old = self.dev
        self.dev = NorFlash(None, blocks=4, block_size=1024, cut_at=cut_at, seed=cut_at or 1)
        if old is not None:
            self.dev.mem[:] = old.mem
        return FlashStore(self.dev, verbose=False, **self.opts).open()

    def fresh(self, cut_at):
        self.dev = None
        return self.boot(cut_at)

    def ops(self):
        return self.dev.ops

    def dead(self):
        return self.dev.dead

    def kill(self):
        self.dev.dead = True  # the group buffer (RAM) is gone with it

    def cleanup(self):
        pass


class PosixRig:
    def __init__(self, **opts):
        self.opts = dict(opts, group_commit=True)
        self.path = tmppath("walposix")
        self.cfs = None

    def boot(self, cut_at=0):
        self.cfs = CutFs(cut_at, cut_at or 1)
        return FileStore(self.path, fs=self.cfs, verbose=False, **self.opts).open()

    def fresh(self, cut_at):
        rmtree(self.path)
        return self.boot(cut_at)

    def ops(self):
        return self.cfs.n

    def dead(self):
        return self.cfs.dead

    def kill(self):
        c = self.cfs
        c.rng.below = lambda n: 0  # right after a packet: what was not synced is lost
        c.cut_at = c.n + 1
        try:
            c.op()
        except PowerCut:
            pass

    def cleanup(self):
        rmtree(self.path)


class LfsRig:
    def __init__(self, **opts):
        self.opts = dict(opts, group_commit=True)
        self.path = tmppath("wallfs")
        self.vol = None
        self.made = []

    def boot(self, cut_at=0):
        self.vol.unmount()
        d, fs = self.vol.mount(cut_at, cut_at or 1)
        st = FileStore(d, fs=fs, verbose=False, **self.opts)
        # kept for good, as the volume keeps its filesystems: a dead store's open file, closed
        # by the collector after its filesystem went, is what littlefs-python asserts on
        _GRAVEYARD.append(st)
        self.made.append(st)
        return st.open()

    def fresh(self, cut_at):
        if self.vol is not None:
            self.vol.cleanup()
        self.vol = LfsVolume(self.path, blocks=24)
        return self.boot(cut_at)

    def ops(self):
        return self.vol.dev.ops

    def dead(self):
        return self.vol.dev is not None and self.vol.dev.dead

    def kill(self):
        self.vol.dev.dead = True  # LittleFS keeps a file's unsynced data out of its metadata

    def cleanup(self):
        for st in self.made:  # their files closed while their filesystems are still there
            f = st._f
            st._f = None
            try:
                if f is not None:
                    f.close()
            except Exception:
                pass
        self.made = []
        if self.vol is not None:
            self.vol.cleanup()


RIGS = {
    "group-flash": lambda: FlashRig(),
    "group-flash-acks": lambda: FlashRig(append_acks=True),
    "group-posix": lambda: PosixRig(segment_bytes=600, max_segments=3),
    "group-lfs": lambda: LfsRig(segment_bytes=2048, max_segments=3),
}

# -- the workload -------------------------------------------------------------------------
WORK = [("sub", "a/#"), ("connect",), ("pub", 2), ("pub", 1), ("pub", 2), ("net",),
        ("in", 2), ("in", 1), ("in", 2), ("net",),
        ("hold",), ("pub", 2), ("pub", 1), ("net",), ("in", 2), ("net",), ("drop",), ("pub", 2), ("connect",),
        ("ack",), ("net",),
        ("unsub", "a/#"), ("sub", "b"), ("net",), ("pub", 2), ("in", 2), ("in", 2), ("net",),
        ("hold",), ("pub", 1), ("pub", 2), ("net",), ("in", 2), ("net",), ("forget",), ("drop",), ("connect",),
        ("ack",), ("net",), ("in", 2), ("in", 2), ("pub", 2), ("net",), ("pub", 1), ("net",)]


def pid_of(b):
    return b[2] << 8 | b[3]


class Broker:
    """Keeps its session (our QoS 2 ids awaiting PUBREL, its messages to us in flight) across cuts."""

    def __init__(self):
        self.sess = None
        self.up = False
        self.rx = bytearray()
        self.tx = bytearray()
        self.hold = False
        self.held = []
        self.forget = False
        self.delivered = []  # (seq, qos) of the client's messages as the broker took them
        self.next_msg = 0
        self.sent_in = []  # (msg, qos) of every inbound message first sent

    def close(self):
        self.up = False
        self.rx = bytearray()
        self.tx = bytearray()
        self.held = []

    def reply(self, b):
        if self.hold:
            self.held.append(b)
        else:
            self.tx += b

    def read(self):
        while self.up and self.rx:
            n = frame_size(self.rx, 0, len(self.rx), 1 << 20)
            if n < 0 or n > len(self.rx):
                return
            b = bytes(self.rx[:n])
            self.rx = self.rx[n:]
            t = b[0] >> 4
            if t == 1:
                p = decode(b, 4)
                sp = bool(self.sess) and not self.forget and not p.clean
                if not sp:
                    self.sess = {"q2": set(), "out": {}}
                self.forget = False
                self.tx += encode(Packet(2, session_present=sp), 4)
                for pid in sorted(self.sess["out"]):
                    q, rel, msg = self.sess["out"][pid]
                    self.tx += (encode(Packet(6, pid=pid), 4) if rel else
                                encode(Packet(3, topic="i", payload=b"%d" % msg, qos=q, pid=pid, dup=True), 4))
                continue
            s = self.sess
            if t == 3:
                p = decode(b, 4)
                if p.qos < 2 or p.pid not in s["q2"]:
                    self.delivered.append((int(bytes(p.payload).split(b":")[0]), p.qos))
                if p.qos == 1:
                    self.reply(encode(Packet(4, pid=p.pid), 4))
                elif p.qos == 2:
                    s["q2"].add(p.pid)
                    self.reply(encode(Packet(5, pid=p.pid), 4))
            elif t == 6:
                s["q2"].discard(pid_of(b))
                self.reply(encode(Packet(7, pid=pid_of(b)), 4))
            elif t == 8:
                self.reply(encode(Packet(9, pid=pid_of(b), reasons=[1]), 4))
            elif t == 10:
                self.reply(encode(Packet(11, pid=pid_of(b)), 4))
            elif t == 4 or t == 7:
                s["out"].pop(pid_of(b), None)
            elif t == 5:
                e = s["out"].get(pid_of(b))
                if e is not None:
                    e[1] = True
                    self.reply(encode(Packet(6, pid=pid_of(b)), 4))
            elif t == 14:
                self.close()

    def inbound(self, q):
        if not self.up:
            return
        self.next_msg += 1
        pid = 1
        while pid in self.sess["out"]:  # the lowest free id: reused as soon as it is released
            pid += 1
        self.sess["out"][pid] = [q, False, self.next_msg]
        self.sent_in.append((self.next_msg, q))
        self.tx += encode(Packet(3, topic="i", payload=b"%d" % self.next_msg, qos=q, pid=pid), 4)


class Run:
    def __init__(self, rig, op_cut=0, pkt_cut=0):
        self.rig = rig
        self.b = Broker()
        self.pkt_cut = pkt_cut
        self.packets = 0
        self.seq = 0
        self.live = []  # [pid, seq, qos] accepted, not acknowledged
        self.acked = set()
        self.maybe = set()  # seqs of a publish the cut interrupted
        self.maybe_pids = set()
        self.dup_ok = set()
        self.pid_seq = {}  # pid -> (seq, qos) of the message last published under it
        self.in_got = []  # (msg, qos) delivered to the application
        self.in_maybe = set()  # inbound messages a cut may have lost (between their id and their handler)
        self.ann = {}  # outbound pid -> [level announced (1 record, 2 mark), may have moved on since]
        self.ann_in = {}  # inbound pid -> [present (PUBREC) / absent (PUBCOMP, in_clear), may have moved on]
        self.cuts = 0
        try:
            self.st = rig.fresh(op_cut)
            self.s = self._session()
        except Exception:
            if not rig.dead():
                raise
            self.reboot()  # the cut came in the first boot

    def _session(self):
        s = Session("wal", 4, False, store=self.st, max_pending=8, window=2, rx_size=512, tx_size=256)
        s.send = self._send
        s.on_event = self._event
        s.on_message = lambda m: self.in_got.append((int(bytes(m.payload)), m.qos))
        return s

    # the wire: what leaves announces; a cut may come right after --------------------------
    def _send(self, buf, off, n):
        if self.rig.dead():
            raise PowerCut("power is off")
        data = bytes(buf[off : off + n])
        if self.b.up:
            self.b.rx += data
        k = 0
        while k < len(data):  # (the session hands over whole packets)
            m = frame_size(data, k, len(data), 1 << 20)
            self._announce(data[k : k + m])
            k += m
            self.packets += 1
            if self.packets == self.pkt_cut:
                self.rig.kill()
                raise PowerCut("power cut right after packet %d" % self.packets)

    def _announce(self, b):
        t = b[0] >> 4
        if t == 3 and b[0] & 6:
            p = decode(b, 4)
            e = self.ann.get(p.pid)
            if e is None or e[1] or e[0] < 1:
                self.ann[p.pid] = [1, False]
        elif t == 6 or t == 8 or t == 10:
            self.ann[pid_of(b)] = [2 if t == 6 else 1, False]
        elif t == 5:
            self.ann_in[pid_of(b)] = [True, False]
        elif t == 7:
            self.ann_in[pid_of(b)] = [False, False]

    def _event(self, kind, a, b):
        if kind == EV_PUBLISHED:
            for e in self.live:
                if e[0] == a:
                    self.live.remove(e)
                    self.acked.add(e[1])
                    return
            if a in self.maybe_pids:
                self.maybe_pids.discard(a)
                return
            raise Finding("EV_PUBLISHED for packet %d, not a live message" % a)
        if kind == EV_CONNACK and not a:
            for p in self.ann_in:  # cleared: durable now (the broker's new session exists)
                self.ann_in[p] = [False, False]

    def feed(self, data):
        # What the fed packets change in the store may move announced states on.
        k = 0
        while k < len(data):
            m = frame_size(data, k, len(data), 1 << 20)
            t = data[k] >> 4
            if t == 2 and not data[k + 2] & 1:  # CONNACK without our session: unmarks, in_clear
                for p in self.ann:
                    self.ann[p][1] = True
                for p in self.ann_in:
                    self.ann_in[p][1] = True
            elif t in (4, 7, 9, 11):
                e = self.ann.get(pid_of(data[k:]))
                if e:
                    e[1] = True
            elif t == 6 or t == 3 and data[k] & 4:
                p = decode(data[k : k + m], 4).pid if t == 3 else pid_of(data[k:])
                e = self.ann_in.get(p)
                if e:
                    e[1] = True
            if t == 3 and data[k] & 6:
                msg = int(bytes(decode(data[k : k + m], 4).payload))
                if (msg, 2) not in self.in_got and (msg, 1) not in self.in_got:
                    self.in_pending = getattr(self, "in_pending", set())
                    self.in_pending.add(msg)
            k += m
        self.s.feed(data, 0)

    # faults and calls ---------------------------------------------------------------------
    def call(self, f, *a):
        try:
            return f(*a)
        except Finding:
            raise
        except Exception as e:
            if not self.rig.dead() and not isinstance(e, PowerCut):
                raise Finding("%r from %s without a power cut" % (e, getattr(f, "__name__", f)))
            self.reboot()
        return None

    def reboot(self):
        self.cuts += 1
        self.b.close()
        # a cut while inbound messages were being handled may lose those deliveries (never repeat them)
        for m in getattr(self, "in_pending", ()):
            if not any(g[0] == m for g in self.in_got):
                self.in_maybe.add(m)
        self.in_pending = set()
        try:
            self.st = self.rig.boot()
            self.s = self._session()
        except Exception as e:
            raise Finding("the store does not reopen after the cut: %r" % e)
        st = self.st
        # the write-ahead invariant: nothing a packet announced is lost
        for p in self.ann:
            lvl, moved = self.ann[p]
            if moved:
                continue
            if not st.has(p):
                raise Finding("packet %d: %s sent, its record lost at the cut" % (p, "PUBREL" if lvl == 2 else "PUBLISH/SUBSCRIBE/UNSUBSCRIBE"))
            if lvl == 2 and not st.marked(p):
                raise Finding("packet %d: PUBREL sent, its mark lost at the cut" % p)
        for p in self.ann_in:
            want, moved = self.ann_in[p]
            if not moved and st.in_has(p) != want:
                raise Finding("inbound id %d: %s, yet the store %s it after the cut" % (
                    p, "PUBREC sent" if want else "PUBCOMP sent (or cleared at CONNACK)", "lost" if want else "kept"))
        have = st.pending()
        self.ann = {}
        for p in have:  # durable now: what the store gave back
            self.ann[p] = [2 if st.kind(p) == 3 and st.marked(p) else 1, False]
        self.ann_in = {}
        lp = [e[0] for e in self.live]
        self.maybe_pids = set(p for p in have if st.kind(p) == 3 and p not in lp)
        for e in self.live[:]:
            if e[0] not in have:
                if not any(d[0] == e[1] for d in self.b.delivered):
                    raise Finding("accepted message %d (pid %d) lost at the cut" % (e[1], e[0]))
                self.live.remove(e)
                self.acked.add(e[1])

    def connect(self):
        if self.s.state != 0:
            return
        if self.b.forget and self.b.sess:
            # what the broker took at QoS 2 and the store still holds (live, or acknowledged with
            # the release not yet durable when the power went) may now come twice
            for p in self.s.pending():
                e = self.pid_seq.get(p)
                if e and e[1] == 2:
                    self.dup_ok.add(e[0])
        self.b.close()
        self.b.up = True
        self.call(self.s.connect_packet, 0)
        self.net()

    def net(self):
        for _ in range(60):
            if not self.b.up:
                break
            self.b.read()
            if not self.b.up:
                self.s.connection_lost()
                break
            if not self.b.tx:
                break
            data = bytes(self.b.tx)
            self.b.tx = bytearray()
            self.call(self.feed, data)

    def publish(self, q):
        self.seq += 1
        seq = self.seq
        try:
            pid = self.s.publish("a/x", b"%d:" % seq + b"x" * 150, q, False, 0)
        except Exception as e:
            if not self.rig.dead() and not isinstance(e, PowerCut):
                raise Finding("%r from publish without a power cut" % e)
            self.maybe.add(seq)
            self.reboot()
            return
        if pid == WOULD_BLOCK:
            raise Finding("publish would block: the workload outgrew the outbox")
        self.live.append([pid, seq, q])
        self.pid_seq[pid] = (seq, q)

    def step(self, st):
        k = st[0]
        if k == "pub":
            self.publish(st[1])
        elif k == "sub":
            self.call(self.s.subscribe, st[1], 1, 0)
        elif k == "unsub":
            self.call(self.s.unsubscribe, st[1], 0)
        elif k == "connect":
            self.connect()
        elif k == "net":
            self.net()
        elif k == "drop":
            self.b.close()
            self.s.connection_lost()
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
        elif k == "in":
            self.b.inbound(st[1])
            self.net()

    def drain(self):
        b = self.b
        b.hold = False
        b.forget = False
        for h in b.held:
            if b.up:
                b.tx += h
        b.held = []
        for _ in range(60):
            if not self.live and not self.s.pending() and not (b.sess and b.sess["out"]):
                break
            if self.s.state == 0:
                self.connect()
            self.net()
            if self.s.state == CONNECTED and not b.tx and not b.rx:
                b.close()
                self.s.connection_lost()
        if self.live or self.s.pending() or (b.sess and b.sess["out"]):
            raise Finding("did not drain: live %r, pending %r, broker in flight %r" % (
                [e[:2] for e in self.live], self.s.pending(), b.sess and b.sess["out"]))
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
        got = [x for x in first if x in self.acked]
        if got != sorted(self.acked):
            raise Finding("deliveries %r, accepted %r" % (first, sorted(self.acked)))
        if got != sorted(got):
            raise Finding("delivered out of publish order: %r" % got)
        ins = {}
        for m, q in self.in_got:
            if q == 2 and m in ins:
                raise Finding("inbound QoS 2 message %d delivered twice" % m)
            ins[m] = q
        for m, q in b.sent_in:
            if m not in ins and m not in self.in_maybe:
                raise Finding("inbound QoS %d message %d never delivered" % (q, m))


def run(name, op_cut=0, pkt_cut=0):
    """One run of the workload with at most one cut; (None or the finding, ops, packets)."""
    rig = RIGS[name]()
    try:
        r = Run(rig, op_cut, pkt_cut)
        for st in WORK:
            r.step(st)
        r.drain()
        if (op_cut or pkt_cut) and not r.cuts:
            return "no cut happened", 0, 0
        return None, rig.ops(), r.packets
    except Finding as e:
        return "%s cut at %s %d: %s" % (name, "op" if op_cut else "packet", op_cut or pkt_cut, e), 0, 0
    finally:
        rig.cleanup()


def totals(name):
    """Medium operations and packets of a clean run (the cut points of a sweep)."""
    err, ops, pkts = run(name)
    if err:
        raise Finding("the clean run fails: " + err)
    return ops, pkts


def sweep(name, ops_ks, pkt_ks, report=None):
    """Runs with a cut at each of ops_ks and right after each of pkt_ks; the findings."""
    found = []
    for k in ops_ks:
        err = run(name, op_cut=k)[0]
        if err:
            found.append(err)
            if report:
                report("FAIL " + err)
    for j in pkt_ks:
        err = run(name, pkt_cut=j)[0]
        if err:
            found.append(err)
            if report:
                report("FAIL " + err)
    return found
