"""A model-based test of the client at its edges (issues 14, 25, 35): the one engine of the
session-level sweeps (tests/lib/walsweep.py, tools/store_sweep.py and tools/model_sweep.py run it),
on the rigs and the broker model of the test kit (tests/lib/kit.py). Imported as tests.lib.model.

The device is a real `tern.client.Client` (its `publish` and the steady routes it takes,
Session.pub0 and pub1; its reads and its rule for errors: an OSError or MQTTError out of a
read ends the connection) over a byte stream to a broker model, with a real store
(MemoryStore; FlashStore on the emulated NOR flash, acks in place, appended, group commit;
FileStore on POSIX files and on LittleFS, with and without group commit) on a medium that may
lose power and may fail and return (tests/lib/faults.py). A seeded generator (plain Python:
CPython and MicroPython run the same examples) draws a list of steps:

  pub q n f      publish n bytes at QoS q (0, 1, 2), online or not, through Client.publish;
                 f: 1 retained, 2 with a Topic Alias (MQTT 5, when the server takes one). A reading
                 publish() refused is published again at the next pub, as an app does.
  fill n         publish QoS 1 until the outbox or the store refuses
  sub f / unsub f   subscribe / unsubscribe filter f (online or offline)
  connect        Client.connect() (the broker answers)
  net            Client.loop(0) until nothing moves
  drop           the connection is gone (the client finds out at its next read or write)
  hold / ack     the broker withholds its acknowledgements / sends them
  forget         the broker loses our session (next CONNACK: session present 0)
  deny k         a refused filter is answered by closing (k=1) or SUBACK 0x80
  in q r n       the broker sends n messages at QoS q (r=0: no PUBREL after PUBREC); after a
                 resumed session, over the Receive Maximum as Mosquitto 2.0.11 does
  cut k          the power goes at the medium's k-th next operation; reboot
  cutpkt k       the power goes right after the client's k-th next packet (the broker reads it);
                 what the store had not made durable is gone; reboot
  fault d w k t  the medium's k-th next operation of kind d (faults.KINDS[d], as the rig has
                 them) raises OSError before any byte lands, after all did, or torn (w: 0, 1, 2,
                 3 drawn each time), for t operations in a row (-1: until heal)
  heal           a lasting fault is gone
  limits ...     the broker's limits from its next CONNACK on (MQTT 5): Maximum Packet Size,
                 Topic Alias Maximum, Receive Maximum, Maximum QoS, Retain Available
  full k         ENOSPC from the filesystem (FileStore on POSIX) for the next k writes, -1: until heal
  restart m      Client.disconnect(), then a new client with max_pending m on the same store

Checked after every step:
- every message publish() accepted is in the store, in publish order, until the broker
  acknowledged it (or, after a power cut or a failure, it was delivered);
- the session's pending list and the store's agree (once the session has followed a store
  that read its medium again: lib/tern/store.py);
- tables stay bounded (ring, store, subscriptions, inbound QoS 2 ids; the heap on MicroPython);
- every error the library raises is typed (OSError, MQTTError; ValueError for a server's limit);
- no packet of the client breaks a limit the broker announced for that connection (Broker);
at every reboot, that no packet announced state the store does not durably hold (a PUBLISH,
SUBSCRIBE or UNSUBSCRIBE its record, PUBREL the mark, PUBREC the inbound id, PUBCOMP its
release, a CONNACK without our session the inbound ids gone), unless a later packet moved it
on; and at the end, with faults healed and no reboot needed (the store takes messages again by
itself), once drained, then after a last power cut and reboot, drained again:
- a reading publish() refused at QoS 1/2 never reached the broker (OutboxUnknown: it may have,
  once); every reading it accepted did, in publish order, QoS 2 exactly once (unless the broker
  lost the session while it was pending, the documented exception), or was given back with a
  reason a limit of the server's justifies;
- inbound, every QoS 1/2 message the broker sent reached the handler (unless a cut came between
  its id made durable and its handler, or the write of its id left the store's state unknown:
  lost then, documented) and QoS 2 at most once.

A failure is shrunk by removing steps while it still fails, and reported with its seed and the
minimal step list.
"""

import gc

from norflash import PowerCut
from tern.client import Client
from tern.codec import decode, frame_size
from tern.session import EV_PUBLISHED, EV_SUBACK, EV_UNSUBACK, CONNECTED
from tern.wire import MQTTError

from .check import MICROPYTHON, Rng
from .faults import BEFORE, ENOSPC, KINDS
from .kit import Broker, FileRig, Finding, FlashRig, LfsRig, Limits, MemRig, pid_of, reading, sweep

try:
    from tern.filestore import OutboxUnknown
except ImportError:  # (a library from before issue 35: tools/model_sweep.py --first runs this model on it)
    OutboxUnknown = ()


def following(st):
    """The session has not yet followed a store that read its medium again (lib/tern/store.py)."""
    return getattr(st, "epoch", 0) != getattr(st, "seen", 0)

FILTERS = ("a/#", "b", "c/+", "deny", "l/" + "x" * 90)  # (the last: a SUBSCRIBE of about 100 bytes)
TOPIC = "a/x"
HEAP_BOUND = 600000  # bytes allocated on MicroPython after a collection, at any step


def limit_error(e):
    """A ValueError of a call the server's announced limits refuse (said before anything is stored)."""
    return isinstance(e, ValueError) and "server" in str(e)


# -- the device's byte stream --------------------------------------------------------------
try:
    from io import IOBase as _Base  # (MicroPython polls an object that is one: its ioctl)
except ImportError:  # pragma: no cover
    _Base = object


class Link(_Base):
    """Client(stream=...)'s byte stream to the broker model (non-blocking readinto/write, pollable
    on both runtimes). What the client writes reaches the broker packet by packet, each noted as
    an announcement (Run.announce); a power cut may come right after any of them. What it reads
    is whole packets the broker sent, each noted as moving announcements on (Run.moved)."""

    def __init__(self, run):
        self.run = run
        self.rest = bytearray()  # the client's bytes short of a whole packet
        self._fd = None

    def fileno(self):  # (CPython's poll: a descriptor that is always readable)
        if self._fd is None:
            import os

            self._fd = os.open("/dev/null", os.O_RDONLY)
        return self._fd

    def ioctl(self, req, arg):  # (MicroPython's poll)
        return arg & 1 if req == 3 else 0

    def pending(self):  # (MicroPython: Client._io reads without polling)
        return True

    def close(self):
        if self._fd is not None:
            import os

            os.close(self._fd)
            self._fd = None

    def readinto(self, buf, n=-1):
        b = self.run.b
        if not b.up:
            return 0  # the broker closed: end of stream
        if n < 0:
            n = len(buf)
        k = 0
        while k < len(b.tx):
            m = frame_size(b.tx, k, len(b.tx), 1 << 20)
            if m < 0 or k + m > n:
                break
            self.run.moved(bytes(b.tx[k : k + m]))
            k += m
        if not k:
            return None  # nothing (whole) to read: would block
        buf[:k] = b.tx[:k]
        b.tx = b.tx[k:]
        return k

    def write(self, buf, off=0, n=-1):
        if n < 0:
            n = len(buf) - off
        run = self.run
        if run.dead:
            raise PowerCut("power is off")
        if not run.b.up:
            raise OSError(32, "broken pipe")
        self.rest += bytes(memoryview(buf)[off : off + n])
        while self.rest:
            m = frame_size(self.rest, 0, len(self.rest), 1 << 20)
            if m < 0 or m > len(self.rest):
                break
            p = bytes(self.rest[:m])
            self.rest = self.rest[m:]
            run.packets += 1
            run.announce(p)
            if run.b.up:
                run.b.rx += p
                run.b.read()
            if run.cut_after:
                run.cut_after -= 1
                if not run.cut_after:
                    # The power goes right after this packet: it is on the wire (the broker read
                    # it), what the store had not made durable is not.
                    run.dead = True
                    run.rig.cut_now()
                    raise PowerCut("power cut right after a packet")
        return n


# -- the generator -------------------------------------------------------------------
def gen_steps(seed, n):
    r = Rng(seed)
    out = []
    for _ in range(n):
        c = r.below(100)
        if c < 18:
            # QoS, payload size, flags: 1 retained, 2 with a Topic Alias (MQTT 5, where the server takes one)
            out.append(("pub", (1, 1, 2, 0)[r.below(4)], (0, 0, 40, 160, 400)[r.below(5)],
                        (r.below(8) == 0) | (r.below(4) == 0) << 1))
        elif c < 22:
            out.append(("fill", (0, 160)[r.below(2)]))
        elif c < 28:
            out.append(("sub", r.below(len(FILTERS))))
        elif c < 31:
            out.append(("unsub", r.below(len(FILTERS))))
        elif c < 43:
            out.append(("connect",))
        elif c < 61:
            out.append(("net",))
        elif c < 66:
            out.append(("drop",))
        elif c < 69:
            out.append(("hold",))
        elif c < 73:
            out.append(("ack",))
        elif c < 75:
            out.append(("forget",))
        elif c < 77:
            out.append(("deny", r.below(2)))
        elif c < 84:
            out.append(("in", r.below(3), r.below(4) != 0, 1 + r.below(6)))
        elif c < 86:
            out.append(("cut", 1 + r.below(24)))
        elif c < 90:
            out.append(("cutpkt", 1 + r.below(4)))
        elif c < 93:
            out.append(("limits", (0, 0, 60, 120, 1000)[r.below(5)], (0, 0, 1, 4)[r.below(4)],
                        (0, 1, 2, 8)[r.below(4)], (2, 2, 1, 0)[r.below(4)], r.below(3) != 0))
        elif c < 94:
            out.append(("full", (-1, 0, 1, 3)[r.below(4)]))
        elif c < 98:
            out.append(("fault", r.below(len(KINDS)), r.below(4), 1 + r.below(24), (1, 1, 2, -1)[r.below(4)]))
        elif c < 99:
            out.append(("heal",))
        else:
            out.append(("restart", 4 + r.below(5)))
    return out


# -- one run ---------------------------------------------------------------------------
class Run:
    def __init__(self, rig, v, max_pending, receive_max=4, lowest=False, cut_at=0):
        self.rig = rig
        self.v = v
        self.max_pending = max_pending
        self.rm = receive_max
        self.b = Broker(v, lowest)
        self.link = Link(self)
        self.seq = 0
        self.again = None  # (seq, attempt + 1, qos, size, flags): the reading to publish again
        self.live = []  # [pid, (seq, attempt), qos, stored size, retain] accepted, not acknowledged, in publish order
        self.order = []  # (seq, attempt) of every accepted reading, in publish order
        self.acked = set()
        self.given = set()  # given back refused (a limit of the server's they break)
        self.refused = set()  # publish() raised: these must never reach the broker
        self.unknown = set()  # publish() raised OutboxUnknown: they may reach it (once)
        self.maybe = set()  # a publish the power cut interrupted (stored or not)
        self.maybe_pids = set()  # and the packet ids they were stored under, when they were
        self.back = set()  # packet ids of acknowledged messages the store holds again (a release that failed)
        self.dup_ok = set()  # QoS 2 seqs the broker may take twice (it lost the session meanwhile)
        self.pid_seq = {}  # packet id -> (seq, attempt) last published under it
        self.cut_after = 0  # > 0: the power goes right after that many more packets of the client
        self.packets = 0  # packets the client sent
        self.dead = False  # the power went: nothing more leaves
        self.in_got = []  # inbound messages delivered to the app (QoS, msg)
        self.in_maybe = set()  # inbound QoS 2 messages that may be lost (id durable, handler not run)
        self.in_fed = []  # inbound QoS 2 messages handed to the client in the loop pass under way
        self.ann = {}  # outbound pid -> [level announced (1 record, 2 mark), moved on since]
        self.ann_in = {}  # inbound pid -> [present (PUBREC) / absent (PUBCOMP, cleared), moved on since]
        self.reboots = 0
        self.stale = False  # the client holds inbound ids of a broker session that was replaced (see reboot)
        self.errors = []  # typed errors seen (kept for the report)
        self.draining = False
        self.now = 0
        try:
            self.st = rig.boot(cut_at)
            self.c = self._client()
        except Exception:
            if not rig.dead():
                raise
            self.reboot()  # the cut came in the first boot

    def _client(self):
        # (a session the broker keeps, as the model's does: under MQTT 5 that takes a session expiry)
        c = Client("model", version=self.v, clean=False, store=self.st, stream=self.link, reconnect=False,
                   connect_timeout=1, max_pending=self.max_pending, window=2, rx_size=512, tx_size=256,
                   receive_max=self.rm, session_expiry=600 if self.v == 5 else None)
        s = c.session
        drv = s.on_event

        def on_event(kind, a, b):
            self._event(kind, a, b)
            drv(kind, a, b)

        s.on_event = on_event
        c.on_message = lambda m: self.in_got.append((m.qos, int(bytes(m.payload))))
        return c

    @property
    def s(self):
        return self.c.session

    # the wire: what leaves announces, what arrives moves announcements on -----------------
    def announce(self, b):
        t = b[0] >> 4
        if t == 3 and b[0] & 6:
            p = decode(b, self.v)
            e = self.ann.get(p.pid)
            if e is None or e[1] or e[0] < 1:
                self.ann[p.pid] = [1, False]
        elif t == 6 or t == 8 or t == 10:
            self.ann[pid_of(b)] = [2 if t == 6 else 1, False]
        elif t == 5:
            self.ann_in[pid_of(b)] = [True, False]
        elif t == 7:
            self.ann_in[pid_of(b)] = [False, False]

    def moved(self, b):
        t = b[0] >> 4
        if t == 2 and not b[2] & 1:  # CONNACK without our session: unmarks, in_clear
            for p in self.ann:
                self.ann[p][1] = True
            for p in self.ann_in:
                self.ann_in[p][1] = True
        elif t in (4, 5, 7, 9, 11):
            e = self.ann.get(pid_of(b))
            if e and (t != 5 or len(b) > 4 and b[4] >= 0x80):  # (a PUBREC moves it on only when refusing)
                e[1] = True
        elif t == 6 or t == 3 and b[0] & 4:
            p = decode(b, self.v).pid if t == 3 else pid_of(b)
            e = self.ann_in.get(p)
            if e:
                e[1] = True
        if t == 3 and b[0] & 4:
            self.in_fed.append(int(bytes(decode(b, self.v).payload)))

    def _event(self, kind, a, b):
        lim = self.b.lim
        if kind == 1 and not a:  # EV_CONNACK, session present 0: the client clears its inbound ids
            self.stale = False
            for p in self.ann_in:  # cleared: durable now (the broker's new session exists)
                self.ann_in[p] = [False, False]
        if kind == EV_PUBLISHED:
            e = self.ann.get(a)
            if e:
                e[1] = True
            for e in self.live:
                if e[0] == a:
                    if b >= 0x80:
                        # given back: only for a limit of this connection's server the message breaks
                        if not (b == 0x95 and lim.mps and e[3] > lim.mps or b == 0x9B and e[2] > lim.mq
                                or b == 0x9A and e[4] and not lim.ret):
                            raise Finding("message %r (QoS %d, %d bytes, retain %d) refused with 0x%02X; server "
                                          "limits: Maximum Packet Size %d, Maximum QoS %d, Retain Available %d"
                                          % (e[1], e[2], e[3], e[4], b, lim.mps, lim.mq, lim.ret))
                        self.given.add(e[1])
                        self.back.add(a)  # (told again if a failure voids its release: store.py)
                    else:
                        self.acked.add(e[1])
                    self.live.remove(e)
                    return
            if a in self.maybe_pids:
                self.maybe_pids.discard(a)
                return
            if a in self.back:
                self.back.discard(a)
                return
            if self.rig.fault.fired and self.pid_seq.get(a) in self.acked | self.given:
                return  # acknowledged again: a storage failure voided its release (store.py)
            raise Finding("EV_PUBLISHED for packet %d, not a live message" % a)
        if kind == EV_SUBACK or kind == EV_UNSUBACK:
            e = self.ann.get(a)
            if e:
                e[1] = True
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
        if self.draining:
            raise Finding("a reboot while draining with faults healed (%s)" % (self.errors[-1:],))
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
        self.link.rest = bytearray()
        self.dead = False
        self.cut_after = 0
        self.reboots += 1
        try:
            self.st = self.rig.reboot()
            self.c = self._client()
        except Exception as e:
            raise Finding("the store does not reopen after a power cut: %r" % e)
        st = self.st
        # the write-ahead rule: nothing a packet announced is lost (unless moved on since)
        for p in self.ann:
            lvl, moved = self.ann[p]
            if moved:
                continue
            if not st.has(p):
                raise Finding("packet %d: %s sent, its record lost at the cut" % (
                    p, "PUBREL" if lvl == 2 else "PUBLISH/SUBSCRIBE/UNSUBSCRIBE"))
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
        self.back = set()
        for e in self.live[:]:
            if e[0] not in have:
                self._gone(e, "at a power cut")

    def _gone(self, e, when):
        # a live message the store no longer holds: lost, unless the broker had it (the power
        # went, or a failure came, in the release after its acknowledgement)
        if not any(d[0] == e[1] for d in self.b.delivered):
            raise Finding("accepted message %r (pid %d) lost %s" % (e[1], e[0], when))
        self.live.remove(e)
        self.acked.add(e[1])
        self.back.add(e[0])  # (a session that has not followed yet may still report it)

    def key_of(self, pid):
        """The (seq, attempt) of the message the store holds under pid (its payload), or None."""
        try:
            if self.st.kind(pid) != 3:
                return None
            b = bytearray(self.st.size(pid))
            self.st.read(pid, 0, b)
            return reading(decode(bytes(b), self.v).payload)
        except Exception:  # (a store whose state is unknown, a dead medium)
            return None

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
                    self.dup_ok.add(e[1][0])
            for p in self.st.pending():
                k = self.key_of(p)
                if k:
                    self.dup_ok.add(k[0])
        self.b.close()
        self.b.up = True
        self.link.rest = bytearray()
        n = self.reboots
        self.drive(self.c.connect)
        if n == self.reboots and self.s.state == CONNECTED:
            self.b.unseen = False  # the client has handled the CONNACK (and cleared its inbound ids)
        self.net()

    def drive(self, f, *a):
        """A driver call that reads (connect, loop): an inbound QoS 2 message it handed over that
        was not delivered when the store's state became unknown may be lost (documented)."""
        err = self.c.last_error
        del self.in_fed[:]
        self.call(f, *a)
        if self.rig.dead():  # (the driver took the dead medium's OSError for a lost connection)
            self.reboot()
            return
        e = self.c.last_error
        if e is not err and isinstance(e, OutboxUnknown):
            got = [m for _, m in self.in_got]
            for m in self.in_fed:
                if m not in got:
                    self.in_maybe.add(m)

    def net(self):
        for _ in range(50):
            if self.s.state != CONNECTED or (self.b.up and not self.b.tx):
                break
            self.drive(self.c.loop, 0)  # (the broker closed: it reads the end of stream)

    def publish(self, q, size, flags=0):
        if self.again:  # the reading publish() refused last, at its own QoS
            seq, att, q, size, flags = self.again
        else:
            self.seq += 1
            seq, att = self.seq, 1
        self.again = None
        key = (seq, att)
        props = None
        if flags & 2 and self.v == 5 and self.s.state == CONNECTED and self.s.server.get(0x22, 0):
            props = {0x23: 1}
        try:
            pid = self.c.publish(TOPIC, b"%d.%d:" % key + b"x" * size, qos=q, retain=bool(flags & 1), props=props,
                                 timeout=0)
        except ValueError as e:
            if not limit_error(e):
                raise Finding("untyped error %r from publish" % e)
            self.errors.append(repr(e))
            return False
        except PowerCut:
            self.maybe.add(key)
            self.reboot()
            return False
        except OSError as e:  # NotConnected (QoS 0 offline), a full outbox, a store that failed
            if self.rig.dead():
                self.maybe.add(key)
                self.reboot()
                return False
            self.errors.append(repr(e))
            if q:
                if isinstance(e, OutboxUnknown):
                    self.unknown.add(key)  # it may still go: not published again
                else:
                    self.refused.add(key)  # not accepted: published again next time, as an app does
                    self.again = (seq, att + 1, q, size, flags)
            return False
        except Exception as e:
            raise Finding("untyped error %r from publish" % e)
        if not q:
            return False
        self.live.append([pid, key, q, self.st.size(pid), flags & 1])
        self.order.append(key)
        self.pid_seq[pid] = key
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
            if s.state != 0:
                self.drive(self.c.loop, 0)  # the client finds the end of stream
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
                if got and st[1] == 2 and self.stale and self.st.in_has(got[0]):
                    self.in_maybe.add(got[1])  # taken for a repeat of the old session's message
            self.net()
        elif k == "cut":
            if self.rig.cuts:
                self.rig.cut_in(st[1])
        elif k == "cutpkt":
            self.cut_after = st[1]
        elif k == "fault":
            kinds = self.rig.kinds
            if kinds:
                self.rig.fault.arm(kinds[st[1] % len(kinds)], st[2], st[3], st[4])
        elif k == "heal":
            self.rig.fault.heal()
        elif k == "limits":
            self.b.next_lim = Limits(*st[1:])
        elif k == "full":
            if isinstance(self.rig, FileRig):
                if st[1]:
                    self.rig.fault.arm("write", BEFORE, 1, st[1], ENOSPC)
                else:
                    self.rig.fault.heal()
        elif k == "restart":
            self.max_pending = st[1]
            self.call(self.c.disconnect)
            self.b.close()
            self.reboot()

    # invariants --------------------------------------------------------------------
    def check(self):
        s, st = self.s, self.st
        if self.rig.dead():
            return  # the next step reboots
        stp = st.pending()
        kinds = [st.kind(p) for p in stp]
        if not following(st):  # (else the session follows before its next packet: store.py)
            sp = s.pending()
            if sp != stp:
                raise Finding("session pending %r != store pending %r" % (sp, stp))
        pubs = [p for p, kd in zip(stp, kinds) if kd == 3]
        lp = [e[0] for e in self.live]
        for p in pubs:
            if p not in lp and p not in self.maybe_pids:
                self.back.add(p)  # an acknowledged message whose release a failure voided
        for e in self.live[:]:
            if e[0] not in pubs:
                self._gone(e, "after a storage failure")
        want = [e[0] for e in self.live]
        j = 0
        for p in pubs:  # the live messages appear in the store in publish order
            if j < len(want) and p == want[j]:
                j += 1
        if j != len(want):
            raise Finding("live message pid %d missing or out of order in the store %r (live %r)"
                          % (want[j], stp, [e[:2] for e in self.live]))
        cap = len(s._rflags)
        # (the ring holds what the store does: after a failure voided releases, more than max_pending)
        if cap > 2 * self.max_pending + 8 or s._n > cap or (st.count() > cap and not following(st)):
            raise Finding("ring or store over its bound: cap %d, n %d, store %d" % (cap, s._n, st.count()))
        if len(s.subs) > len(FILTERS) or len(s._gone) > len(FILTERS) or (s.in2 > s._in_cap and s.inids is s.store):
            raise Finding("a table grew: subs %d, gone %d, inbound QoS 2 %d" % (len(s.subs), len(s._gone), s.in2))
        if MICROPYTHON and self.now % 200 == 0:
            gc.collect()
            if gc.mem_alloc() > HEAP_BOUND:
                raise Finding("heap %d over %d" % (gc.mem_alloc(), HEAP_BOUND))

    def settle(self):
        """Faults off: connect, acknowledge, until nothing is pending on either side. A store that
        failed takes messages again by itself: no reboot here."""
        if self.rig.dead():
            self.reboot()
        b = self.b
        b.hold = False
        b.deny_close = False
        b.forget = False
        self.cut_after = 0
        self.rig.cut_in(0)
        self.rig.fault.heal()
        for h in b.held:
            if b.up:
                b.tx += h
        b.held = []
        if b.sess:
            for e in b.sess["out"].values():
                e[3] = True  # PUBREL after PUBREC from now on (resent at the next connection)
        self.draining = True
        for _ in range(400):
            if not self.live and not self.s.pending() and not b.held and not (b.sess and b.sess["out"]):
                break
            if self.s.state == 0:
                self.connect()
            self.net()
            if self.s.state == CONNECTED and not b.tx and not b.rx:
                # nothing moves: resends come only after a reconnect
                b.close()
                self.drive(self.c.loop, 0)
            self.check()
        self.draining = False
        if self.live or self.s.pending():
            raise Finding("outbox did not drain: live %r, pending %r (last error %r)" % (
                [e[:2] for e in self.live], self.s.pending(), self.c.last_error))

    def drain(self):
        """Settle; then a last power cut and reboot (the write-ahead check), settle again; then
        the end checks."""
        self.settle()
        if self.rig.cuts:
            if self.s.state != 0:
                self.call(self.c.close)
            self.b.close()
            self.rig.cut_now()
            self.reboot()
            self.settle()
        b = self.b
        # publish() refused: never delivered; accepted: delivered, first deliveries in publish
        # order, QoS 2 once
        first = []
        seen = {}
        per_seq = {}
        for key, q in b.delivered:
            if key in self.refused:
                raise Finding("message %r reached the broker after publish() raised (QoS %d)" % (key, q))
            if q == 2:
                per_seq[key[0]] = per_seq.get(key[0], 0) + 1
                if per_seq[key[0]] > 1 and key[0] not in self.dup_ok and key not in self.maybe:
                    raise Finding("QoS 2 message %r delivered twice" % (key,))
            if key in seen:
                continue
            seen[key] = q
            if key not in self.maybe:
                first.append(key)
        got = [x for x in first if x in self.acked]
        want = [x for x in self.order if x in self.acked]
        if sorted(got) != sorted(want):
            missing = [x for x in want if x not in seen]
            raise Finding("deliveries %r, accepted %r (missing %r)" % (first, want, missing))
        if got != want:
            raise Finding("delivered out of publish order: %r (published %r)" % (got, want))
        ins = {}
        for q, m in self.in_got:
            if q == 2 and m in ins:
                raise Finding("inbound QoS 2 message %d delivered twice" % m)
            ins[m] = q
        for q, m in b.sent_in:  # what the broker sent (all of it completed by now) reached the handler
            if m not in ins and m not in self.in_maybe and m not in b.dropped:
                raise Finding("inbound QoS %d message %d never delivered" % (q, m))


RIGS = {
    "memory": lambda: MemRig(),
    "flash": lambda: FlashRig(blocks=4, block_size=1024),
    "flash-acks": lambda: FlashRig(blocks=4, block_size=1024, append_acks=True),
    "flash-gc": lambda: FlashRig(blocks=4, block_size=1024, append_acks=True, group_commit=True),
    "flash-gc-inplace": lambda: FlashRig(blocks=4, block_size=1024, group_commit=True),
    "file": lambda: FileRig(max_bytes=4000, segment_bytes=500),
    "file-gc": lambda: FileRig(max_bytes=4000, segment_bytes=500, group_commit=True),
    "file-lfs": lambda: LfsRig(segment_bytes=2048, max_segments=3),
    "file-lfs-gc": lambda: LfsRig(segment_bytes=2048, max_segments=3, group_commit=True),
    # the same with every counter just before its wrap (packet id; record and
    # sector sequence; segment number): see kit.flash_near_wraps, kit.file_near_wraps
    "memory-wrap": lambda: MemRig(wraps=True),
    "flash-wrap": lambda: FlashRig(blocks=4, block_size=1024, wraps=True),
    "file-wrap": lambda: FileRig(max_bytes=4000, segment_bytes=500, wraps=True),
}


def params(seed):
    """An example's protocol version, max_pending and the broker's way of choosing packet ids."""
    return (4, 5)[seed % 2], 4 + seed % 5, seed % 3 != 0


def run(rig_name, seed, steps, v=4, max_pending=6, rig=None, cut_at=0, lowest=None):
    """Run one example; returns None, or the Finding's message."""
    rig = rig or RIGS[rig_name]()
    try:
        r = Run(rig, v, max_pending, lowest=params(seed)[2] if lowest is None else lowest, cut_at=cut_at)
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
    """Run every seed on every rig (the kit's sweep loop); returns (examples run, findings)."""
    points = [(seed, name) for seed in seeds for name in rigs]
    return len(points), sweep(points, lambda p: example(p[1], p[0], n_steps))
