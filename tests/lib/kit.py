"""The test kit of the store and session sweeps, one of each: the media, the rigs, the broker model
and the sweep loop. Used by the model-based test (model.py), the session sweeps (walsweep.py), the
store-level power-cut engine (storecut.py), the write-ahead, power-cut and storage-fault tests, and
tools/store_sweep.py and tools/model_sweep.py; on CPython and the MicroPython unix port alike.

- Media that lose power: POSIX files cut at the k-th write, sync or remove (CutFs; CutLayer makes it
  a complete FileStore filesystem layer); the emulated NOR flash (norflash) and LittleFS on it
  (storekit.LfsVolume) cut at the k-th program or erase; each may also fail and return (faults.py).
- Rigs: a store on such a medium, booted, cut and booted again. MemRig (MemoryStore), FlashRig
  (FlashStore on a RAM image of the NOR flash: acks in place or appended, group commit), FileRig
  (FileStore on POSIX files), LfsRig (FileStore on LittleFS on the NOR flash); wraps=True starts a
  store with its counters just before their wraps. One interface:
    boot(cut_at=0)      a blank medium, powered on: the store (the power goes at operation cut_at)
    reboot()            power on again, the same medium (after a cut, or a restart of the session)
    cut_in(k) / cut_now(exact=False)   the power goes at the medium's k-th next operation / now
                        (what the store had not made durable is gone; on files, exact=False keeps a
                        random part of what was written and not synced, exact=True none of it)
    dead(), ops(), cleanup(); fault (a faults.Fault), kinds (what may fail), cuts (whether it can)
    fresh(), power_on(cut_at=0, seed=1), off()   the same steps one by one (the store-level sweep)
- The broker model (Broker, Limits): the server from the MQTT specs; a client packet that breaks a
  limit it announced is a Finding.
- The sweep loop (sweep) over cut or fault points, and a seeded sample of them (sample).
- Wire: a Session's output decoded as it leaves, for the tests that drive a Session without a socket.

A module of the package tests.lib: imported as `from tests.lib import kit` (pytest and the MicroPython
runs of tests/lib/conftest.py have the checkout's root on the path; tools run as `python -m
tools.store_sweep` from it), never by a top-level name, so that tools need no sys.path edit.
"""

import os

from cutfs import ShimFile, keep_synced
from norflash import NorFlash, PowerCut
from tern.codec import Packet, decode, encode, frame_size
from tern.filestore import FileStore, OsFs, _ObjFs
from tern.flashstore import FlashStore
from tern.store import MemoryStore

from .check import MICROPYTHON, Rng
from .faults import Fault, FaultFlash, FaultFs
from .storekit import _GRAVEYARD, LfsVolume, rmtree, tmppath


class Finding(Exception):
    """What a sweep or the model found: an invariant broken."""


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


# -- media: POSIX files that lose power ----------------------------------------------------
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


# -- rigs: a store on a medium that may lose power, fail and return, and boot again ----------
class MemRig:
    """MemoryStore: nothing survives a cut, and nothing is promised to (a reboot keeps the RAM: a
    restart of the session only)."""

    name = "memory"
    cuts = False
    kinds = ()

    def __init__(self, wraps=False):
        self.wraps = wraps
        self.last0 = PID0 if wraps else 0
        self.fault = Fault()
        self.st = None

    def boot(self, cut_at=0):
        self.st = MemoryStore()
        if self.wraps:
            self.st._last = PID0  # the session's packet ids wrap 35 messages in
        return self.st

    def reboot(self):
        return self.st

    def cut_in(self, k):
        pass

    def cut_now(self, exact=False):
        pass

    def dead(self):
        return False

    def ops(self):
        return 0

    def cleanup(self):
        pass


class FlashRig:
    """FlashStore on a RAM image of the emulated NOR flash, kept across boots, through
    faults.FaultFlash (programs and erases that fail): a cut tears the k-th program or erase; what
    the store had not programmed (a group buffer) is gone."""

    name = "flash"
    cuts = True
    kinds = ("any", "write", "erase")

    def __init__(self, blocks=4, block_size=1024, wraps=False, **opts):
        self.blocks, self.bs, self.opts = blocks, block_size, opts
        self.wraps = wraps
        self.last0 = PID0 if wraps else 0
        self.fault = Fault()
        self.dev = None

    def fresh(self):
        self.dev = None
        if self.wraps:
            self.dev = NorFlash(None, blocks=self.blocks, block_size=self.bs)
            flash_near_wraps(self.dev, self.opts)

    def power_on(self, cut_at=0, seed=1):
        old = self.dev
        self.dev = FaultFlash(None, blocks=self.blocks, block_size=self.bs, seed=seed, cut_at=cut_at,
                              fault=self.fault)
        if old is not None:
            self.dev.mem[:] = old.mem
        return FlashStore(self.dev, verbose=False, **self.opts).open()

    def boot(self, cut_at=0):
        self.fresh()
        return self.power_on(cut_at)

    def reboot(self):
        return self.power_on(0, self.dev.ops)

    def cut_in(self, k):  # (0: none)
        self.dev.cut_at = self.dev.ops + k if k else 0

    def cut_now(self, exact=False):
        self.dev.dead = True

    def dead(self):
        return self.dev.dead

    def ops(self):
        return self.dev.ops

    def off(self):
        pass  # (the image is RAM: the next power_on copies it)

    def cleanup(self):
        self.dev = None


class FileRig:
    """FileStore on POSIX files (CutFs: a cut at the k-th write, sync or remove; each file keeps what
    was synced and a random part of what was written after) through faults.FaultFs: writes, syncs,
    creates and removes that fail, and a disk that may be full (ENOSPC)."""

    name = "file-posix"
    cuts = True
    kinds = ("any", "write", "sync", "create", "remove")

    def __init__(self, wraps=False, **opts):
        self.path = tmppath("cutposix")
        self.opts = opts
        self.wraps = wraps
        self.last0 = PID0 if wraps else 0
        self.fault = Fault()
        self.cfs = None

    def fresh(self):
        rmtree(self.path)
        if self.wraps:
            file_near_wraps(self.path, CutFs(0, 1), self.opts)

    def power_on(self, cut_at=0, seed=1):
        self.cfs = CutFs(cut_at, seed)
        return FileStore(self.path, fs=FaultFs(CutLayer(self.cfs), self.fault), verbose=False, **self.opts).open()

    def boot(self, cut_at=0):
        self.fresh()
        return self.power_on(cut_at)

    def reboot(self):
        return self.power_on(0, self.cfs.n + 1)

    def cut_in(self, k):
        c = self.cfs
        c.cut_at = c.n + k if k else 0

    def cut_now(self, exact=False):
        c = self.cfs
        if c.dead:
            return
        if exact:  # every byte written and not synced is lost: the worst a cut may leave
            keep_synced(c.synced, lambda n: 0)
            c.dead = True  # (the old store's files write nothing more)
            return
        c.cut_at = c.n + 1
        try:
            c.op()  # each file keeps what was synced and a random part of the rest
        except PowerCut:
            pass

    def dead(self):
        return self.cfs.dead

    def ops(self):
        return self.cfs.n

    def off(self):
        pass

    def cleanup(self):
        rmtree(self.path)


class LfsRig:
    """FileStore on LittleFS on the emulated NOR flash (storekit.LfsVolume: MicroPython's VfsLfs2,
    littlefs-python on CPython), through faults.FaultFs (the filesystem's writes, syncs, creates and
    removes fail): a cut tears the k-th program or erase; what LittleFS had not written is gone. A
    small volume: ENOSPC comes from LittleFS itself when it is full."""

    name = "file-lfs"
    cuts = True
    kinds = ("any", "write", "sync", "create", "remove")
    last0 = 0  # (no counters near their wraps here)

    def __init__(self, blocks=16, **opts):
        self.path = tmppath("cutlfs")
        self.blocks = blocks
        self.opts = opts
        self.vol = None
        self.fault = Fault()
        self.made = []

    def fresh(self):
        if self.vol is not None:
            self.vol.cleanup()
        self.vol = LfsVolume(self.path, blocks=self.blocks)

    def power_on(self, cut_at=0, seed=1):
        d, fs = self.vol.mount(cut_at, seed)
        st = FileStore(d, fs=FaultFs(_ObjFs(fs) if fs is not None else OsFs(), self.fault), verbose=False,
                       **self.opts)
        if fs is not None:
            # kept for good, as the volume keeps its filesystems: a dead store's open file, closed
            # by the collector after its filesystem went, is what littlefs-python asserts on
            # (closed by cleanup() while the filesystem is there)
            _GRAVEYARD.append(st)
            self.made.append(st)
        return st.open()

    def boot(self, cut_at=0):
        self.fresh()
        return self.power_on(cut_at)

    def reboot(self):
        seed = self.vol.dev.ops + 1
        self.vol.unmount()
        return self.power_on(0, seed)

    def cut_in(self, k):
        self.vol.dev.cut_at = self.vol.dev.ops + k if k else 0

    def cut_now(self, exact=False):
        self.vol.dev.dead = True

    def dead(self):
        # (LittleFS reports the dead flash as an I/O error, OSError 5, not as PowerCut)
        return self.vol.dev is not None and self.vol.dev.dead

    def ops(self):
        return self.vol.dev.ops

    def off(self):
        if self.vol is not None:
            self.vol.unmount()

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


# -- the broker model --------------------------------------------------------------------
def pid_of(p):
    return p[2] << 8 | p[3]


def reading(payload):
    """(seq, attempt) of a client message's payload b"seq.attempt:..." """
    head = bytes(payload).split(b":")[0].split(b".")
    return int(head[0]), int(head[1])


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

    Its session outlives connections and the client's power cuts (unless it forgets it, or the
    client starts clean): the subscriptions, the QoS 2 ids received and not yet released (a
    PUBLISH under such an id is answered PUBREC and not delivered again; after PUBREL the id is
    free, and a PUBLISH under it is a new message: 4.3.3) and its own messages to the client not
    yet completed, resent after a resumed CONNECT (4.4). Its own packet ids are any not in use
    (2.2.1): the lowest free one (reused as soon as it is released), or the next after the last,
    per example.

    Under MQTT 5 it announces limits in each CONNACK (`limits` changes them from the next
    connection on). A packet of the client that breaks one is a finding: the server would close
    the connection, and a client that sends it again after every reconnect never gets further
    ([MQTT-3.1.2-24] Maximum Packet Size, [MQTT-3.3.2-9] Topic Alias Maximum, [MQTT-3.3.2-7] an
    alias set on another connection, [MQTT-3.3.4-7] Receive Maximum, 3.2.2.3.4 Maximum QoS,
    3.2.2.3.5 Retain Available)."""

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
        self.delivered = []  # ((seq, attempt), qos) of the client's messages, in the order the broker took them
        self.completed = []  # (qos, msg) of its own messages the client acknowledged (PUBACK, PUBCOMP)
        self.sent_in = []  # (qos, msg) of every QoS 1/2 message it sent the client, first sending
        self.dropped = set()  # those a session it lost took with it
        self.acked_out = set()  # our packet ids it acknowledged (PUBACK, PUBCOMP, a refusing PUBREC) at some time
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
                    for e in (self.sess or {"out": {}})["out"].values():
                        self.dropped.add(e[2])  # its messages in flight go with the old session
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
                    self.delivered.append((reading(p.payload), p.qos))
                if p.qos == 1:
                    self.inflight.discard(p.pid)
                    self.acked_out.add(p.pid)
                    self.send(encode(Packet(4, pid=p.pid), v))
                elif p.qos == 2:
                    s["q2"].add(p.pid)
                    self.send(encode(Packet(5, pid=p.pid), v))
            elif t == 6:
                s["q2"].discard(pid_of(b))
                self.inflight.discard(pid_of(b))
                self.acked_out.add(pid_of(b))
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
        if not self.up or not self.sess or q and len(self.sess["out"]) >= cap + self.extra:
            return None
        self.next_msg += 1
        pid = 0
        if q:
            pid = self._pid()
            self.sess["out"][pid] = [q, False, self.next_msg, rel]
            self.sent_in.append((q, self.next_msg))
        self.tx += encode(Packet(3, topic="i", payload=b"%d" % self.next_msg, qos=q, pid=pid), self.v)
        return pid, self.next_msg


# -- a session's output -----------------------------------------------------------------
class Wire:
    """A Session's output, decoded as it leaves: one write may carry several packets (what one read
    releases leaves together) and a packet may span writes. `out`: the packets not taken yet."""

    def __init__(self, s):
        self.v = s.version
        self.out = []
        self.rest = b""
        s.send = self.send

    def send(self, buf, off, n):
        data = self.rest + bytes(buf[off : off + n])
        k = 0
        while k < len(data):
            m = frame_size(data, k, len(data), 1 << 20)
            if m < 0 or k + m > len(data):
                break
            self.out.append(decode(data[k : k + m], self.v))
            k += m
        self.rest = data[k:]

    def types(self):
        return [(p.type, p.pid) for p in self.out]

    def take(self):
        """The packets sent since the last take."""
        got = self.out
        self.out = []
        return got

    def take_types(self):
        return [(p.type, p.pid) for p in self.take()]


# -- the sweep loop ----------------------------------------------------------------------
def sweep(points, one, report=None):
    """one(point) at each point (a cut point, a fault point, an example): None, or what it found.
    Returns the findings, each also handed to report ("FAIL " + finding) as it comes."""
    found = []
    for p in points:
        err = one(p)
        if err:
            found.append(err)
            if report:
                report("FAIL " + err)
    return found


def sample(total, count, seed):
    """A seeded sample of count points of 1..total, the first two and the last among them."""
    r = Rng(seed)
    ks = set([1, 2, total])
    while len(ks) < min(count, total):
        ks.add(1 + r.below(total))
    return sorted(ks)
