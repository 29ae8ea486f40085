"""The device of the end-to-end crash sweep (tools/crash_sweep.py): one boot of
an emulated board on the MicroPython unix port.

    micropython crash_device.py STORE IMAGE CLIENT_ID PORT TOPIC START CUT SEED [WSEED [MAX_PENDING]]

STORE is flash (FlashStore on emulated NOR flash), lfs (FileStore on LittleFS
over emulated NOR flash), posix (FileStore on the unix port's own files) or
memory (MemoryStore: the negative control, it must fail the sweep). The boot
opens the store on IMAGE (a flash image or a directory), registers the
handler of TOPIC/in (the broker already holds the subscription: the host made
the session), connects with clean session off, runs the workload from step
START and then waits for the host's `stop` (a QoS 0 message on TOPIC/in).

Power cut: CUT > 0 makes the CUT-th flash (or file) operation of this boot a
torn one. The device then prints `CUT ...` and blocks until the host kills
it, so no line of code runs after the cut: no exception unwinds through the
library, nothing more reaches the broker. Flash: the emulated NOR flash tears
the operation (firmware/emulated/norflash.py). POSIX: the operation is a file
write, a sync or a remove made by FileStore; at the cut every file keeps what
was synced plus a seeded prefix of what was written after, and a file created
since the last directory sync may vanish (a power cut, not only a crash).

PORT 0 keeps the device offline: what it accepts waits in the store.
MAX_PENDING (default 256) sizes the outbox: a small one (the sweep's -edge
stores use 4) is full whenever the broker is slower than the device, so a cut
mostly leaves a full outbox, and the next boot reconnects with its
subscription waiting for room.

What it prints, one line each (stdout is unbuffered, a line printed before
the cut is never lost): BOOT, STEP i (step i starts), ACC i (its call
returned: accepted), RX payload (the application got an inbound message),
IDLE (workload done, nothing pending), CUT, END pending= ops=.
"""

import sys
import time

from tern.client import Client
from tern.store import MemoryStore

MICROPYTHON = sys.implementation.name == "micropython"
FLASH_BLOCKS = 4  # 4 x 4 KiB: the workload wraps the partition several times
LFS_BLOCKS = 32
LFS_OPTS = {"readsize": 32, "progsize": 32, "lookahead": 32}
N_PUB = 100
N_IN = 20


# -- the workload (the host imports this too) -----------------------------------
def workload(seed=1):
    """Steps: ("pub", i, qos) x 100 (50 at QoS 1, 50 at QoS 2, shuffled),
    with SUBSCRIBE / UNSUBSCRIBE steps among them."""
    s = (seed * 2654435761) & 0xFFFFFFFF or 1
    qos = [1] * (N_PUB // 2) + [2] * (N_PUB - N_PUB // 2)
    for i in range(N_PUB - 1, 0, -1):
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        j = s % (i + 1)
        qos[i], qos[j] = qos[j], qos[i]
    steps = []
    for i in range(N_PUB):
        if i in (15, 40, 65):
            steps.append(("sub", "aux/%d" % i, 1))
        if i in (55, 90):
            steps.append(("unsub", "aux/%d" % (i - 40), 0))
        steps.append(("pub", i, qos[i]))
    return steps


def payload(i):
    """Message i: its number, then 10..200 filler bytes (records of many sizes)."""
    return b"%d:" % i + b"abcdefghij" * (1 + (i * 7) % 20)


def inbound_due(step):
    """How many inbound messages the host has sent once step `step` started."""
    return min(N_IN, 1 + step // 5)


# -- power cuts -------------------------------------------------------------------
CALL = ["boot", 0]  # the store call in progress (reported at the cut)


def out(line):
    sys.stdout.write(line + "\n")
    if not MICROPYTHON:
        sys.stdout.flush()


def blackout(op, detail):
    """The power is gone: say where, then wait for the host to kill us."""
    out("CUT op=%d call=%s pid=%d %s" % (op, CALL[0], CALL[1], detail))
    while True:
        time.sleep(1)


class Tap:
    """The real store, with the name of the call in progress kept for the
    CUT line (the host needs to know whether an inbound id was being
    recorded). Memory store: the cut is at the CUT-th changing call."""

    def __init__(self, st, cut=0):
        self.st = st
        self.cut = cut
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self.st, name)

    def _enter(self, name, pid):
        CALL[0] = name
        CALL[1] = pid
        if self.cut:
            self.calls += 1
            if self.calls >= self.cut:
                blackout(self.calls, "memory")

    def append(self, kind, pid, head, body=b""):
        self._enter("append", pid)
        self.st.append(kind, pid, head, body)
        CALL[0] = "-"

    def mark(self, pid):
        self._enter("mark", pid)
        self.st.mark(pid)
        CALL[0] = "-"

    def unmark(self, pid):
        self._enter("unmark", pid)
        self.st.unmark(pid)
        CALL[0] = "-"

    def release(self, pid):
        self._enter("release", pid)
        self.st.release(pid)
        CALL[0] = "-"

    def in_add(self, pid):
        self._enter("in_add", pid)
        self.st.in_add(pid)
        CALL[0] = "-"

    def in_release(self, pid):
        self._enter("in_release", pid)
        self.st.in_release(pid)
        CALL[0] = "-"

    def in_clear(self):
        self._enter("in_clear", 0)
        self.st.in_clear()
        CALL[0] = "-"

    def commit(self):
        self._enter("commit", 0)
        self.st.commit()
        CALL[0] = "-"


def cut_nor(path, blocks, cut, seed):
    """The emulated NOR flash, with a blackout instead of an exception at the cut."""
    from norflash import NorFlash

    class CutNor(NorFlash):
        def _die(self):
            self.dead = True
            blackout(self.ops, "torn=%s" % (self.torn[0],))

    return CutNor(path, blocks=blocks, block_size=4096, cut_at=cut, seed=seed)


def cut_posix(cut, seed):
    """FileStore's own file layer (tern.filestore.OsFs), counting its writes,
    syncs and removes; at the cut, unsynced bytes survive only in part."""
    import os
    from tern.filestore import OsFs

    from cutfs import ShimFile, keep_synced

    class CutFile(ShimFile):
        def __init__(self, fs, path, mode):
            ShimFile.__init__(self, path, mode)
            self.fs = fs
            if "w" in mode or "a" in mode:
                fs.synced[path] = 0

        def write(self, b):
            self.fs.op(self, b)
            return self.f.write(b)

        def flush(self):
            self.f.flush()

    class CutPosix(OsFs):
        def __init__(self):
            self.n = 0
            self.synced = {}  # path -> bytes known durable
            self.fresh = []  # files created since the last directory sync
            self.rng = (seed * 7919 + 1) & 0xFFFFFFFF or 1

        def rand(self, n):
            s = self.rng
            s ^= (s << 13) & 0xFFFFFFFF
            s ^= s >> 17
            s ^= (s << 5) & 0xFFFFFFFF
            self.rng = s
            return s % n

        def op(self, f=None, data=None):
            self.n += 1
            if not cut or self.n < cut:
                return
            if f is not None and data is not None and len(data):
                f.f.write(data[: self.rand(len(data))])  # a torn write: a prefix of it
                f.f.flush()
            keep_synced(self.synced, self.rand)
            for path in self.fresh:
                if self.rand(2):
                    try:
                        os.remove(path)
                    except OSError:
                        pass
            blackout(self.n, "file")

        def open(self, path, mode):
            if "w" in mode:
                self.fresh.append(path)
            return CutFile(self, path, mode)

        def remove(self, path):
            self.op()
            os.remove(path)
            self.synced.pop(path, None)

        def sync_file(self, f):
            self.op()
            OsFs.sync_file(self, f.f)  # flush: an fsync on the unix port
            self.synced[f.path] = f.f.tell()

        def sync_dir(self, path):
            self.op()
            OsFs.sync_dir(self, path)
            self.fresh = []

    return CutPosix()


def open_store(kind, image, cut, seed):
    """(store, the medium that counts its operations) for this boot."""
    if kind == "flash":
        from tern.flashstore import FlashStore

        dev = cut_nor(image, FLASH_BLOCKS, cut, seed)
        return FlashStore(dev), dev
    if kind == "lfs":
        import vfs
        from tern.filestore import FileStore

        dev = cut_nor(image, LFS_BLOCKS, cut, seed)
        vfs.mount(vfs.VfsLfs2(dev, **LFS_OPTS), "/vol")
        return FileStore("/vol/outbox", segment_bytes=4096, max_segments=3), dev
    if kind == "posix":
        from tern.filestore import FileStore

        fs = cut_posix(cut, seed)
        return FileStore(image, fs=fs, segment_bytes=4096, max_segments=3), fs
    if kind == "memory":
        return MemoryStore(), None
    raise ValueError("store must be flash, lfs, posix or memory, not %r" % kind)


def format_lfs(image):
    """A fresh LittleFS volume on an erased flash image (the sweep copies it)."""
    import vfs
    from norflash import NorFlash

    dev = NorFlash(image, blocks=LFS_BLOCKS, block_size=4096, fresh=True)
    vfs.VfsLfs2.mkfs(dev, **LFS_OPTS)
    dev.close()


# -- one boot ------------------------------------------------------------------------
def publish(c, topic, data, qos):
    """publish(), waiting while the store is full (OSError ENOSPC: nothing was
    stored; acknowledgements free the room)."""
    t0 = time.time()
    while True:
        try:
            return c.publish(topic, data, qos=qos)
        except OSError as e:
            if e.args[0] != 28 or time.time() - t0 > 60:
                raise
        c.loop(50)



def boot(kind, image, cid, port, topic, start, cut, seed, wseed, max_pending=256):
    st, medium = open_store(kind, image, cut if kind != "memory" else 0, seed)
    tap = Tap(st, cut if kind == "memory" else 0)
    c = Client(cid, server="127.0.0.1", port=port, version=4, clean=False, keepalive=30, store=tap,
               window=1, backoff_min=0.02, backoff_max=0.2, max_pending=max_pending)
    CALL[0] = "-"
    out("BOOT pending=%d" % c.session.stats_recovered)
    stop = [False]

    def on_in(m):
        p = bytes(m.payload)
        if p == b"stop":
            stop[0] = True
        else:
            out("RX %s" % p.decode())

    c.subscribe(topic + "/in", 2, handler=on_in)  # offline: the handler only
    for attempt in range(50 if port else 0):  # port 0: stay offline, everything waits in the store
        try:
            c.connect()
            break
        except OSError:
            if attempt == 49:
                raise
            time.sleep(0.1)
    steps = workload(wseed)
    for i in range(start, len(steps)):
        out("STEP %d" % i)
        s = steps[i]
        if s[0] == "pub":
            publish(c, topic + "/out", payload(s[1]), s[2])
        elif s[0] == "sub":
            c.subscribe(topic + "/" + s[1], s[2], timeout=30)
        else:
            c.unsubscribe(topic + "/" + s[1], timeout=30)
        out("ACC %d" % i)
        c.loop(0)
    if not port:
        out("END pending=%d ops=%d" % (len(c.session.pending()), _ops(kind, medium)[0]))
        st.close()
        return
    c.wait_all(60)
    out("IDLE")
    t0 = time.time()
    while not stop[0]:
        if time.time() - t0 > 120:
            out("TIMEOUT waiting for stop")
            break
        c.loop(50)
    c.wait_all(30)
    ops, erases = _ops(kind, medium)
    out("END pending=%d ops=%d erases=%d" % (len(c.session.pending()), ops, erases))
    c.disconnect()
    st.close()


def _ops(kind, medium):
    """Operations and erases the medium has seen (what a cut point counts)."""
    if medium is None:
        return 0, 0
    if kind == "posix":
        return medium.n, 0
    return medium.ops, sum(medium.erase_counts)


def main(argv):
    if argv and argv[0] == "format-lfs":
        format_lfs(argv[1])
        return
    kind, image, cid, port, topic, start, cut, seed = argv[:8]
    wseed = int(argv[8]) if len(argv) > 8 else 1
    mp = int(argv[9]) if len(argv) > 9 else 256
    boot(kind, image, cid, int(port), topic, int(start), int(cut), int(seed), wseed, mp)


if __name__ == "__main__":
    main(sys.argv[1:])
