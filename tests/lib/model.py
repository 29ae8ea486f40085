"""A model-based test of the session at its capacity edges (issue 14).

The real Session and a real store (MemoryStore, FileStore on POSIX files that
lose power, FlashStore on the emulated NOR flash) talk to a broker model
through two byte queues. A seeded generator (plain Python: CPython and
MicroPython run the same examples) draws a list of steps:

  pub q n f      publish n bytes (and the message's number) at QoS q (0, 1, 2), online or not;
                 f: 1 retained, 2 with a Topic Alias (MQTT 5, when the server takes one)
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
  cutpkt k       the power goes right after the client's k-th next write to the network (the
                 broker reads it); what the store had not made durable is gone; reboot
  limits ...     the broker's limits from its next CONNACK on (MQTT 5): Maximum Packet Size,
                 Topic Alias Maximum, Receive Maximum, Maximum QoS, Retain Available
  full k         ENOSPC from the filesystem (FileStore on POSIX) for the next k writes, -1: until the end
  restart m      a clean restart with max_pending m (a new session on the same store)

After every step the invariants are checked:
- every message publish() accepted is in the store, in publish order, until
  the broker acknowledged it (or, after a power cut, it was delivered);
- the session's pending list and the store's agree; the store reopens;
- tables stay bounded (ring, store, subscriptions, inbound QoS 2 ids; and the
  heap on MicroPython);
- every error the library raises is typed (OSError, MQTTError);
- no packet of the client breaks a limit the broker announced for that
  connection (see Broker): it would be refused at every reconnect;
and at the end, with faults off, the outbox drains: every accepted message
was delivered at least once, QoS 2 exactly once (unless the broker lost the
session while it was pending, the documented exception), in publish order, or
given back with a reason a limit of the server's justifies; inbound, every
message the client acknowledged reached the handler (unless a cut came between
its id made durable and its handler, documented) and QoS 2 at most once.

A failure is shrunk by removing steps while it still fails, and reported with
its seed and the minimal step list.
"""

import gc

from check import MICROPYTHON, Rng
from norflash import NorFlash, PowerCut
from tern.codec import Packet, encode, decode, frame_size
from tern.flashstore import FlashStore
from tern.session import Session, WOULD_BLOCK, EV_PUBLISHED, EV_SUBACK, EV_UNSUBACK, CONNECTED
from tern.store import MemoryStore
from tern.wire import MQTTError

FILTERS = ("a/#", "b", "c/+", "deny", "l/" + "x" * 90)  # (the last: a SUBSCRIBE of about 100 bytes)
TOPIC = "a/x"
HEAP_BOUND = 600000  # bytes allocated on MicroPython after a collection, at any step


class Finding(Exception):
    pass


def limit_error(e):
    """A ValueError of a call the server's announced limits refuse (said before anything is stored)."""
    return isinstance(e, ValueError) and "server" in str(e)


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

    def cut_now(self):
        pass  # (a cut after a packet is a reboot with RAM kept: the session starts again)

    def dead(self):
        return False

    def fill(self, k):
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

    def cut_now(self):
        self.dev.dead = True  # what the store had not programmed (a group buffer) is gone

    def dead(self):
        return self.dev.dead

    def fill(self, k):
        pass  # (the partition fills by itself: 4 KiB)

    def reboot(self):
        return self._dev(self.dev.ops)

    def cleanup(self):
        pass


class FileRig:
    """FileStore on POSIX files with a power cut at the k-th write/sync/remove
    (test_store_powercut's CutFs: a file keeps what was synced and a random
    part of what was written after), and a disk that may be full: ENOSPC from
    the next k writes (transient), or from every write until `room` (lasting)."""

    name = "file"
    cuts = True

    def __init__(self, **opts):
        import test_store_powercut as tp

        class FullFile(tp.CutFile):
            def write(self, b):
                c = self.cfs
                if c.full:
                    if c.full > 0:  # (-1: lasting)
                        c.full -= 1
                    c.op()  # (a cut may come here too)
                    raise OSError(28, "ENOSPC")
                return tp.CutFile.write(self, b)

        class FullFs(tp.CutFs):
            full = 0

            def open(self, path, mode):
                return FullFile(self, path, mode)

        class Rig(tp.PosixRig):
            def boot(self, cut_at=0, seed=1):
                self.cfs = FullFs(cut_at, seed)
                return tp.FileStore(self.path, fs=self.cfs, verbose=False, **self.opts).open()

        self.rig = Rig(**opts)

    def boot(self):
        self.rig.fresh()
        return self.rig.boot()

    def cut_in(self, k):
        c = self.rig.cfs
        c.cut_at = c.n + k

    def cut_now(self):
        c = self.rig.cfs
        if not c.dead:
            c.cut_at = c.n + 1
            try:
                c.op()  # each file keeps what was synced and a random part of the rest
            except PowerCut:
                pass

    def fill(self, k):
        self.rig.cfs.full = k

    def dead(self):
        return self.rig.cfs.dead

    def reboot(self):
        # (the disk has room again after a reboot: FileStore.open() on a disk without room
        # raises ENOSPC, which is not what this model is about)
        return self.rig.boot(0, self.rig.cfs.n + 1)

    def cleanup(self):
        self.rig.cleanup()


class LfsRig:
    """FileStore on LittleFS on the emulated NOR flash (storekit.LfsVolume): a cut
    tears the k-th program or erase; what LittleFS had not written is gone. A
    small volume: ENOSPC comes from LittleFS itself when it is full."""

    name = "file-lfs"
    cuts = True

    def __init__(self, blocks=16, **opts):
        from storekit import tmppath

        self.path = tmppath("modellfs")
        self.blocks = blocks
        self.opts = opts
        self.vol = None

    def _mount(self, seed):
        from tern.filestore import FileStore

        d, fs = self.vol.mount(0, seed)
        return FileStore(d, fs=fs, verbose=False, **self.opts).open()

    def boot(self):
        from storekit import LfsVolume

        self.vol = LfsVolume(self.path, blocks=self.blocks)
        return self._mount(1)

    def cut_in(self, k):
        self.vol.dev.cut_at = self.vol.dev.ops + k

    def cut_now(self):
        self.vol.dev.dead = True

    def dead(self):
        # (LittleFS reports the dead flash as an I/O error, OSError 5, not as PowerCut)
        return self.vol.dev is not None and self.vol.dev.dead

    def fill(self, k):
        pass

    def reboot(self):
        seed = self.vol.dev.ops + 1
        self.vol.unmount()
        return self._mount(seed)

    def cleanup(self):
        if self.vol is not None:
            self.vol.cleanup()


# -- the broker model --------------------------------------------------------------------
def pid_of(p):
    return p[2] << 8 | p[3]


class Limits:
    """A server's limits for one connection, as its CONNACK announces them (MQTT 5)."""

    def __init__(self, mps=0, tam=0, rm=0, mq=2, ret=True):
        self.mps, self.tam, self.rm, self.mq, self.ret = mps, tam, rm, mq, ret

    def props(self):
        p = {}
        if self.mps:
            p[0x27] = self.mps
        if self.tam:
            p[0x22] = self.tam
        if self.rm:
            p[0x21] = self.rm
        if self.mq < 2:
            p[0x24] = self.mq
        if not self.ret:
            p[0x25] = 0
        return p or None


class Broker:
    """The server, from the MQTT specs (3.1.1, 5.0), not from the client's code.

    Its session outlives connections and the client's power cuts (unless it
    forgets it, or the client starts clean): the subscriptions, the QoS 2
    ids received and not yet released (a PUBLISH under such an id is answered
    PUBREC and not delivered again; after PUBREL the id is free, and a PUBLISH
    under it is a new message: 4.3.3) and its own messages to the client not
    yet completed, resent after a resumed CONNECT (4.4). Its own packet ids
    are any not in use (2.2.1): the lowest free one, or the next after the
    last, per example.

    Under MQTT 5 it announces limits in each CONNACK (`limits` changes them
    from the next connection on). A packet of the client that breaks one
    is a finding: the server would close the connection, and a client that
    sends it again after every reconnect never gets further
    ([MQTT-3.1.2-24] Maximum Packet Size, [MQTT-3.3.2-9] Topic Alias
    Maximum, [MQTT-3.3.2-7] an alias set on another connection,
    [MQTT-3.3.4-7] Receive Maximum, 3.2.2.3.4 Maximum QoS, 3.2.2.3.5
    Retain Available)."""

    def __init__(self, v, lowest=False):
        self.v = v
        self.sess = None  # {"subs": set, "q2": set of our pids awaiting PUBREL, "out": {pid: [qos, rel, msg, send PUBREL]}}
        self.up = False
        self.rx = bytearray()
        self.tx = bytearray()
        self.forget = False
        self.hold = False
        self.held = []
        self.deny_close = False
        self.delivered = []  # payloads of the client's messages, in the order the broker took them
        self.completed = []  # (qos, msg) of its own messages the client acknowledged (PUBACK, PUBCOMP)
        self.next_pid = 0
        self.next_msg = 0
        self.extra = 0
        self.lowest = lowest
        self.lim = self.next_lim = Limits()
        self.unseen = False
        self.aliases = {}
        self.inflight = set()  # the client's QoS 1/2 PUBLISHes on this connection not yet acknowledged

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

    def bad(self, what):
        raise Finding("the client broke the server's limit: " + what)

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
            lim = self.lim
            if t == 1:
                p = decode(b, v)
                sp = bool(self.sess) and not self.forget and not p.clean
                if not sp:
                    self.sess = {"subs": set(), "q2": set(), "out": {}}
                    self.next_pid = 0
                self.unseen = not sp  # a new session, until the client reads this CONNACK
                self.forget = False
                self.lim = lim = self.next_lim if v == 5 else Limits()
                self.aliases = {}
                self.inflight = set()
                # Mosquitto 2.0.11: what it resends on a resumed session does not count
                # against Receive Maximum (more may come on top)
                self.extra = len(self.sess["out"]) * 2 if sp else 0
                self.tx += encode(Packet(2, session_present=sp, props=lim.props() if v == 5 else None), v)
                for pid in sorted(self.sess["out"]):  # resend our in-flight messages
                    q, rel, msg, _ = self.sess["out"][pid]
                    self.tx += (encode(Packet(6, pid=pid), v) if rel else
                                encode(Packet(3, topic="i", payload=b"%d" % msg, qos=q, pid=pid, dup=True), v))
                continue
            if lim.mps and n > lim.mps:
                self.bad("a packet of type %d, %d bytes, over Maximum Packet Size %d" % (t, n, lim.mps))
            s = self.sess
            if t == 3:
                p = decode(b, v)
                a = p.props.get(0x23) if v == 5 and p.props else None
                if a is not None:
                    if not 0 < a <= lim.tam:
                        self.bad("Topic Alias %d, Topic Alias Maximum %d" % (a, lim.tam))
                    if p.topic:
                        self.aliases[a] = p.topic
                    elif a not in self.aliases:
                        self.bad("Topic Alias %d not set on this connection" % a)
                if p.qos > lim.mq:
                    self.bad("QoS %d, Maximum QoS %d" % (p.qos, lim.mq))
                if p.retain and not lim.ret:
                    self.bad("a retained message, Retain Available 0")
                if p.qos:
                    self.inflight.add(p.pid)
                    if lim.rm and len(self.inflight) > lim.rm:
                        self.bad("%d QoS 1/2 messages unacknowledged, Receive Maximum %d" % (len(self.inflight), lim.rm))
                if p.qos < 2 or p.pid not in s["q2"]:
                    self.delivered.append((int(bytes(p.payload).split(b":")[0]), p.qos))
                if p.qos == 1:
                    self.inflight.discard(p.pid)
                    self.send(encode(Packet(4, pid=p.pid), v))
                elif p.qos == 2:
                    s["q2"].add(p.pid)
                    self.send(encode(Packet(5, pid=p.pid), v))
            elif t == 6:
                s["q2"].discard(pid_of(b))
                self.inflight.discard(pid_of(b))
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
                e = s["out"].pop(pid_of(b), None)
                if e is not None:
                    self.completed.append((e[0], e[2]))
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

    def _pid(self):
        out = self.sess["out"]
        p = 0 if self.lowest else self.next_pid
        for _ in range(65535):
            p = p % 65535 + 1
            if p not in out:
                break
        self.next_pid = p
        return p

    def inbound(self, q, rel, cap):
        # A message for the client (it takes any topic to on_message), within its Receive Maximum
        if not self.up or q and len(self.sess["out"]) >= cap + self.extra:
            return
        self.next_msg += 1
        pid = 0
        if q:
            pid = self._pid()
            self.sess["out"][pid] = [q, False, self.next_msg, rel]
        self.tx += encode(Packet(3, topic="i", payload=b"%d" % self.next_msg, qos=q, pid=pid), self.v)
        return pid, self.next_msg


# -- the generator -------------------------------------------------------------------
def gen_steps(seed, n):
    r = Rng(seed)
    out = []
    for _ in range(n):
        c = r.below(100)
        if c < 20:
            # QoS, payload size, flags: 1 retained, 2 with a Topic Alias (MQTT 5, where the server takes one)
            out.append(("pub", (1, 1, 2, 0)[r.below(4)], (0, 0, 40, 160, 400)[r.below(5)],
                        (r.below(8) == 0) | (r.below(4) == 0) << 1))
        elif c < 24:
            out.append(("fill", (0, 160)[r.below(2)]))
        elif c < 30:
            out.append(("sub", r.below(len(FILTERS))))
        elif c < 33:
            out.append(("unsub", r.below(len(FILTERS))))
        elif c < 45:
            out.append(("connect",))
        elif c < 64:
            out.append(("net",))
        elif c < 69:
            out.append(("drop",))
        elif c < 72:
            out.append(("hold",))
        elif c < 76:
            out.append(("ack",))
        elif c < 78:
            out.append(("forget",))
        elif c < 80:
            out.append(("deny", r.below(2)))
        elif c < 87:
            out.append(("in", r.below(3), r.below(4) != 0, 1 + r.below(6)))
        elif c < 89:
            out.append(("cut", 1 + r.below(24)))
        elif c < 94:
            out.append(("cutpkt", 1 + r.below(4)))
        elif c < 97:
            out.append(("limits", (0, 0, 60, 120, 1000)[r.below(5)], (0, 0, 1, 4)[r.below(4)],
                        (0, 1, 2, 8)[r.below(4)], (2, 2, 1, 0)[r.below(4)], r.below(3) != 0))
        elif c < 99:
            out.append(("full", (-1, 0, 1, 3)[r.below(4)]))
        else:
            out.append(("restart", 4 + r.below(5)))
    return out


# -- one run ---------------------------------------------------------------------------
class Run:
    def __init__(self, rig, v, max_pending, receive_max=4, lowest=False):
        self.rig = rig
        self.v = v
        self.max_pending = max_pending
        self.rm = receive_max
        self.b = Broker(v, lowest)
        self.seq = 0
        self.live = []  # [pid, seq, qos, stored size, retain] of accepted messages not yet acknowledged, in publish order
        self.refused = set()  # seqs given back refused (a limit of the server's they break)
        self.cut_after = 0  # > 0: the power goes right after that many more writes of the client
        self.dead = False  # the power went: nothing more leaves
        self.in_maybe = set()  # inbound QoS 2 messages a power cut may have lost (id durable, handler not run)
        self.reboots = 0
        self.pid_seq = {}  # packet id -> the seq last published under it
        self.stale = False  # the client holds inbound ids of a broker session that was replaced (see reboot)
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
        if self.dead:
            raise PowerCut("power is off")
        if self.b.up:
            self.b.rx += bytes(buf[off : off + n])
        if self.cut_after:
            self.cut_after -= 1
            if not self.cut_after:
                # The power goes right after this write: it is on the wire (the broker reads it
                # before it sees the connection go, see reboot), what the store had not made
                # durable is not.
                self.dead = True
                self.rig.cut_now()
                raise PowerCut("power cut after a write to the network")

    def _event(self, kind, a, b):
        lim = self.b.lim
        if kind == 1 and not a:  # EV_CONNACK, session present 0: the client clears its inbound ids
            self.stale = False
        if kind == EV_PUBLISHED:
            for e in self.live:
                if e[0] == a:
                    if b >= 0x80:
                        # given back: only for a limit of this connection's server the message breaks
                        if not (b == 0x95 and lim.mps and e[3] > lim.mps or b == 0x9B and e[2] > lim.mq
                                or b == 0x9A and e[4] and not lim.ret):
                            raise Finding("message %d (QoS %d, %d bytes, retain %d) refused with 0x%02X; server "
                                          "limits: Maximum Packet Size %d, Maximum QoS %d, Retain Available %d"
                                          % (e[1], e[2], e[3], e[4], b, lim.mps, lim.mq, lim.ret))
                        self.refused.add(e[1])
                    else:
                        self.acked.add(e[1])
                    self.live.remove(e)
                    return
            if a in self.maybe_pids:
                self.maybe_pids.discard(a)
                return
            raise Finding("EV_PUBLISHED for packet %d, not a live message" % a)
        if kind == EV_SUBACK or kind == EV_UNSUBACK:
            if b and b[0] == 0x95 and not lim.mps:
                raise Finding("%s %d refused as over a Maximum Packet Size the server did not set" % (
                    "SUBSCRIBE" if kind == EV_SUBACK else "UNSUBSCRIBE", a))

    # faults and library calls ---------------------------------------------------------
    def call(self, f, *a):
        """A library call: PowerCut reboots, typed errors are kept, others are findings."""
        try:
            return f(*a)
        except PowerCut:
            self.reboot()
        except (OSError, MQTTError) as e:
            if self.rig.dead():
                self.reboot()
                return None
            self.errors.append(repr(e))
            if getattr(f, "__name__", "") == "feed":
                self.s.connection_lost()  # as the drivers do: an error out of feed ends the connection
            if self.s.state != CONNECTED:
                self.b.close()
        except Finding:
            raise
        except Exception as e:
            if self.rig.dead():  # (code that ran on after the power went, e.g. in a finally: no device runs it)
                self.reboot()
                return None
            if not limit_error(e):
                raise Finding("untyped error %r from %s" % (e, getattr(f, "__name__", f)))
            self.errors.append(repr(e))
        return None

    def reboot(self):
        b = self.b
        if b.up:
            b.read()  # what left before the power went reaches the broker
        if b.unseen:
            # The broker started a new session at a CONNECT whose CONNACK (session present 0) the
            # client never read: the client keeps the inbound QoS 2 ids of the old one, and the
            # new session may use them for new messages (no client can tell; see step "in").
            self.stale = True
        if b.sess:
            for e in b.sess["out"].values():
                if e[0] == 2 and not e[1]:
                    self.in_maybe.add(e[2])  # its id may be durable, its handler not run: lost, not repeated
        b.close()
        self.dead = False
        self.cut_after = 0
        self.reboots += 1
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
            # what the broker took at QoS 2 and the client still holds may now come twice: the
            # documented exception (the session publishes a message whose PUBREC it saw again
            # rather than lose it). "Holds": in its store, which after a power cut under group
            # commit may again hold a message already completed (its release was not durable yet).
            for e in self.live:
                if e[2] == 2:
                    self.dup_ok.add(e[1])
            try:
                for p in self.st.pending():
                    if p in self.pid_seq:
                        self.dup_ok.add(self.pid_seq[p])
            except (PowerCut, OSError):
                if not self.rig.dead():
                    raise
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
            n = self.reboots
            self.call(self.s.feed, data, self.now)
            if n == self.reboots:
                self.b.unseen = False  # the client has handled the CONNACK (and cleared its inbound ids)

    def publish(self, q, size, flags=0):
        self.seq += 1
        seq = self.seq
        s = self.s
        props = None
        if flags & 2 and self.v == 5 and s.state == CONNECTED and s.server.get(0x22, 0):
            props = {0x23: 1}
        try:
            pid = s.publish(TOPIC, b"%d:" % seq + b"x" * size, q, bool(flags & 1), self.now, props)
        except ValueError as e:
            if not limit_error(e):
                raise Finding("untyped error %r from publish" % e)
            self.errors.append(repr(e))
            return False
        except PowerCut:
            self.maybe.add(seq)
            self.reboot()
            return False
        except (OSError, MQTTError) as e:  # NotConnected (QoS 0 offline), ENOSPC, a lost connection
            if self.rig.dead():
                self.maybe.add(seq)
                self.reboot()
                return False
            self.errors.append(repr(e))
            if self.s.state != CONNECTED:
                self.b.close()
            return False
        except Exception as e:
            raise Finding("untyped error %r from publish" % e)
        if pid == WOULD_BLOCK or not q:
            return False
        if q and pid:
            self.live.append([pid, seq, q, self.st.size(pid), flags & 1])
            self.pid_seq[pid] = seq
        return True

    def step(self, st):
        k = st[0]
        s = self.s
        self.now += 10
        if k == "pub":
            self.publish(st[1], st[2], st[3] if len(st) > 3 else 0)
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
                got = self.b.inbound(st[1], st[2], self.rm)
                if got and st[1] == 2 and self.stale:
                    try:
                        if self.st.in_has(got[0]):
                            self.in_maybe.add(got[1])  # taken for a repeat of the old session's message
                    except (PowerCut, OSError):
                        if not self.rig.dead():
                            raise
            self.net()
        elif k == "cut":
            if self.rig.cuts:
                self.rig.cut_in(st[1])
        elif k == "cutpkt":
            self.cut_after = st[1]
        elif k == "limits":
            self.b.next_lim = Limits(*st[1:])
        elif k == "full":
            self.rig.fill(st[1])
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
        except (PowerCut, OSError):
            if not self.rig.dead():
                raise
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
        if len(s.subs) > len(FILTERS) or len(s._gone) > len(FILTERS) or s.in2 > s._in_cap:
            raise Finding("a table grew: subs %d, gone %d, inbound QoS 2 %d" % (len(s.subs), len(s._gone), s.in2))
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
        self.cut_after = 0
        self.rig.fill(0)
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
        for q, m in b.completed:  # what the client acknowledged (PUBACK, PUBCOMP) it was given
            if m not in ins and m not in self.in_maybe:
                raise Finding("inbound QoS %d message %d acknowledged but never delivered" % (q, m))


RIGS = {
    "memory": lambda: MemRig(),
    "flash": lambda: FlashRig(blocks=4, block_size=1024),
    "flash-acks": lambda: FlashRig(blocks=4, block_size=1024, append_acks=True),
    "flash-gc": lambda: FlashRig(blocks=4, block_size=1024, append_acks=True, group_commit=True),
    "file": lambda: FileRig(max_bytes=4000, segment_bytes=500),
    "file-gc": lambda: FileRig(max_bytes=4000, segment_bytes=500, group_commit=True),
    "file-lfs": lambda: LfsRig(segment_bytes=2048, max_segments=3),
    "file-lfs-gc": lambda: LfsRig(segment_bytes=2048, max_segments=3, group_commit=True),
    # the same with every counter just before its wrap (packet id; record and
    # sector sequence; segment number): see test_store_powercut.near_wraps
    "memory-wrap": lambda: MemRig(wraps=True),
    "flash-wrap": lambda: FlashRig(blocks=4, block_size=1024, wraps=True),
    "file-wrap": lambda: FileRig(max_bytes=4000, segment_bytes=500, wraps=True),
}


def params(seed):
    """An example's protocol version, max_pending and the broker's way of choosing packet ids."""
    return (4, 5)[seed % 2], 4 + seed % 5, seed % 3 != 0


def run(rig_name, seed, steps, v=4, max_pending=6):
    """Run one example; returns None, or the Finding's message."""
    rig = RIGS[rig_name]()
    try:
        r = Run(rig, v, max_pending, lowest=params(seed)[2])
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
    v, mp, _ = params(seed)
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
