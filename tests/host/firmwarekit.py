"""What the firmware tests share (test_firmware.py, test_firmware_config.py, test_firmware_sleep.py,
test_firmware_tls.py, test_qemu_firmware.py): the telemetry app on an emulated or qemu board with its
console parsed (Device), a subscriber that records every copy (Watcher), a QoS 2 command (send), the
delivery check, and the runs under faults and through an outage. Not a test module: pytest collects
nothing here, and no test module imports another."""

import random
import tempfile
import threading
import time

from ternlab.boards import load_profile
from ternlab.boards.emulated import EmulatedBoard
from ternlab.brokers.mosquitto import Broker
from ternlab.brokers.chaos import ChaosProxy
from ternlab.pipeline.schema import parse_payload
from ternlab.app_events import TelemetryLog
from ternlab.devset import compile_mpy, install_app as install
from tern.client import Client

_MPY = []


def compiled():
    """The app and tern as .mpy, as `tern deploy` and fleets put them on a board; compiled once per run.
    From source the board would compile 1,000-line modules itself, which needs large contiguous blocks
    and passes or fails in a board-size heap by fragmentation luck."""
    if not _MPY:
        _MPY.append(str(compile_mpy(tempfile.mkdtemp(prefix="tern-mpy-"))))
    return [_MPY[0]]


class Device:
    """An emulated board running the app, with its console parsed as it comes."""

    def __init__(self, tmp_path, config, profile="unix-emulated", board_id="dev-1", paths=None, name="board",
                 romfs=None):
        prof = profile if isinstance(profile, dict) else load_profile(profile)  # a name or a profile dict
        if prof.get("kind") == "qemu":  # its sockets dial the config's broker, as a board's do
            from ternlab.boards import firmware
            from ternlab.boards.qemu import QemuBoard

            self.board = QemuBoard(profile, workdir=tmp_path / name, board_id=board_id)
            if romfs is None and not firmware.frozen(prof):  # stock: tern and the app in its ROMFS partition
                romfs = compile_mpy(tmp_path / ("mpy-" + prof["arch"]), march=prof["arch"])
        else:
            self.board = EmulatedBoard(profile, workdir=tmp_path / name, board_id=board_id,
                                       host_paths=compiled() if paths is None else paths)
        install(self.board, config, romfs=romfs)
        self.tlog = TelemetryLog()
        self.tracebacks = 0
        self._seen = len(self.board.log.lines)  # what setting up the files printed is not the app's

    def pump(self):
        lines = self.board.log.lines
        n = len(lines)
        for line in lines[self._seen:n]:
            if line.kind == "out":
                self.tlog.feed(line.text)
                self.tracebacks += line.text.startswith("Traceback (most recent call last)")
        self._seen = n
        return self.tlog

    def until(self, pred, timeout, what):
        deadline = time.monotonic() + timeout
        while not pred(self.pump()):
            late = time.monotonic() > deadline
            if late or self.tracebacks:
                tail = "\n".join(x.text for x in self.board.log.lines[-25:])
                why = "timed out" if late else "the device raised"
                raise AssertionError(f"{why} waiting for {what}; console tail:\n{tail}")
            time.sleep(0.02)
        return self.tlog

    def close(self):
        self.board.close()


class Watcher:
    """A subscriber on the broker (Tern on CPython, persistent session, QoS 2 so each reading arrives at
    the QoS it was published with), recording every copy it receives."""

    def __init__(self, addr, flt="tern/+/telemetry", cid="watcher"):
        self.got = []
        self.c = Client(cid, server=addr[0], port=addr[1], version=5, clean=False, session_expiry=3600,
                        backoff_min=0.05, backoff_max=0.5)
        self.c.on_message = lambda m: self.got.append((m.topic, bytes(m.payload), m.qos))
        self.c.connect()
        self.c.subscribe(flt, 2)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                self.c.loop(20)
            except OSError:
                time.sleep(0.05)

    def keys(self):
        return [(p["device"], p["boot"], p["qos"], p["seq"]) for p in (parse_payload(b) for _, b, _ in list(self.got))]

    def close(self):
        self._stop.set()
        self._t.join(2)
        self.c.disconnect()


def send(addr, topic, payload, qos=2):
    c = Client("cmd-sender", server=addr[0], port=addr[1], version=5)
    c.connect()
    c.wait_published(c.publish(topic, payload, qos=qos)) if qos else c.publish(topic, payload, qos=0)
    c.disconnect()


def check_delivery(ledger, keys):
    """Every QoS >= 1 reading of the ledger arrived (at least once), every QoS 2 reading exactly once,
    and the ledger's sequence numbers are 0..n-1 per (device, boot, qos). Returns the number of QoS >= 1
    readings. (A QoS 2 reading once arrived twice here: publish() raised EPIPE for a message it had
    stored, and the app reused its sequence number; tests/host/test_qos2_restart.py.)"""
    got = set(keys)
    counts = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    twice = sorted((k, n) for k, n in counts.items() if k[2] == 2 and n > 1)
    assert not twice, f"QoS 2 readings delivered more than once (key, copies): {twice[:10]}"
    streams = {}
    for r in ledger:
        streams.setdefault((r["device"], r["boot"], r["qos"]), []).append(r["seq"])
    for k, seqs in streams.items():
        assert seqs == list(range(len(seqs))), f"{k}: sequence numbers {seqs[:10]}... are not 0..n-1 in order"
    lost = [(r["device"], r["boot"], r["qos"], r["seq"]) for r in ledger if r["qos"]
            and (r["device"], r["boot"], r["qos"], r["seq"]) not in got]
    assert not lost, f"{len(lost)} accepted QoS >= 1 readings never arrived: {lost[:10]}"
    return sum(1 for r in ledger if r["qos"])


def run_under_faults(tmp_path, n_readings, n_cuts, n_net_cuts, seed, profile="unix-emulated", cut_ops=(30, 250)):
    """The app publishes readings at QoS 0/1/2 through a chaos proxy while the power fails at seeded
    random flash operations (torn writes included), the network is cut, and the broker restarts once.
    cut_ops: the range of the flash operation (from power-on) each cut is drawn from.
    Returns the ledger, what the watcher received, the device log and the faults injected."""
    rng = random.Random(seed)
    broker = Broker(tmp_path / "broker", persistence=True).start()
    proxy = ChaosProxy(broker.address, seed=seed).start()
    watch = Watcher(broker.address)
    cfg = {"host": proxy.address[0], "port": proxy.address[1], "client_id": "dev-1", "interval_ms": 15,
           "qos": [0, 1, 2], "backoff_min_ms": 20, "backoff_max_ms": 200, "keepalive": 5}
    dev = Device(tmp_path, cfg, profile=profile)
    net_points = sorted(rng.sample(range(10, n_readings - 10), n_net_cuts))
    restart_at = rng.randrange(n_readings // 3, 2 * n_readings // 3)
    faults = []

    def boot():
        # each boot but the last dies at a random flash operation (counted from power-on)
        cut = rng.randint(*cut_ops) if len(faults_of("power cut")) < n_cuts else 0
        if cut:
            faults.append(("power cut", len(dev.tlog.ledger), cut))
        b = dev.board
        (b.power_cycle if b.is_on else b.power_on)(cut_at=cut, seed=rng.randrange(1, 1 << 30))

    def faults_of(kind):
        return [f for f in faults if f[0] == kind]

    try:
        boot()
        log = dev.tlog
        while len(log.ledger) < n_readings:
            before = len(log.ledger)
            dev.until(lambda t: len(t.ledger) > before or not dev.board.is_on, 30, "progress")
            k = len(log.ledger)
            if not dev.board.is_on:
                boot()
                continue
            if net_points and k >= net_points[0]:
                net_points.pop(0)
                if rng.random() < 0.5:
                    proxy.cut_now()
                    faults.append(("network cut", k))
                else:  # the next connection dies at a random packet, in either direction
                    proxy.cut_at_random_packet(rng.randrange(1 << 30), max_nth=6, connections=1)
                    proxy.cut_now()
                    faults.append(("network cut, then a cut at a random packet", k))
            if restart_at is not None and k >= restart_at:
                restart_at = None
                broker.restart()
                faults.append(("broker restart", k))
        # stop measuring (a QoS 2 command: delivered once); the outbox drains
        send(broker.address, "tern/dev-1/cmd/interval", b"86400000")
        dev.until(lambda t: any(e.get("ms") == 86400000 for e in t.of("cmd")) or not dev.board.is_on, 20,
                  "the stop command")
        ledger = list(dev.pump().ledger)
        want = {(r["device"], r["boot"], r["qos"], r["seq"]) for r in ledger if r["qos"]}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not want <= set(watch.keys()):
            time.sleep(0.05)
        time.sleep(0.3)
        return ledger, watch.keys(), dev.pump(), faults
    finally:
        watch.close()
        dev.close()
        proxy.stop()
        broker.stop()


def run_long_with_outage(tmp_path, profile, n=1000, outage=(200, 320), romfs=False):
    """n QoS 1 readings; between the outage's ledger sizes the broker is unreachable (the proxy refuses
    connections), so the outbox fills up to about their difference, plus what was in flight at the cut
    and what is published before the reconnection: well under max_pending (160), which a slow
    reconnection once reached (the app then drops readings: not what this test is about). Returns
    the device log and what the watcher received. A qemu board runs its frozen modules (a stock one
    gets them in ROMFS), or with romfs=True the modules in place from its ROMFS partition on a stock
    firmware; a unix-port profile with a ROMFS partition always runs them from there."""
    broker = Broker(tmp_path / "broker").start()
    proxy = ChaosProxy(broker.address, seed=3).start()
    watch = Watcher(broker.address)
    cfg = {"host": proxy.address[0], "port": proxy.address[1], "client_id": "dev-1", "interval_ms": 10,
           "qos": 1, "count": n, "max_pending": 160, "backoff_min_ms": 20, "backoff_max_ms": 100}
    prof = load_profile(profile)
    mpy = compile_mpy(tmp_path / "mpy", march=prof.get("arch"))
    if prof.get("kind") == "qemu" and not romfs:  # frozen in its firmware, or in ROMFS on a stock one
        dev = Device(tmp_path, cfg, profile=prof)
    elif prof.get("kind") == "qemu":  # the same board with a stock firmware: the ROMFS image's modules run
        dev = Device(tmp_path, cfg, profile=dict(prof, firmware="stock"), romfs=mpy)
    elif prof.get("romfs"):  # the modules run in place from the board's ROMFS partition
        dev = Device(tmp_path, cfg, profile=profile, paths=[], romfs=mpy)
    else:
        dev = Device(tmp_path, cfg, profile=profile, paths=[str(mpy)])
    try:
        dev.board.power_cycle()
        dev.until(lambda t: len(t.ledger) >= outage[0], 60, "readings before the outage")
        proxy.refuse_connections(1000)
        proxy.cut_now()
        dev.until(lambda t: len(t.ledger) >= outage[1], 60, "readings during the outage")
        proxy.clear_rules()
        log = dev.until(lambda t: t.counts["done"] or t.counts["crash"], 120, "all readings")
        want = {(r["device"], r["boot"], r["qos"], r["seq"]) for r in log.ledger}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not want <= set(watch.keys()):
            time.sleep(0.05)
        return dev.pump(), watch.keys(), [x.text for x in dev.board.log.lines]
    finally:
        watch.close()
        dev.close()
        proxy.stop()
        broker.stop()


def check_1000_readings_with_100_pending(tmp_path, profile, romfs=False):
    """The full app (FlashStore) runs 1,000 QoS 1 readings, more than 100 of them pending at once, with
    no MemoryError, no reboot and nothing lost (tests/host/test_qemu_firmware.py runs it frozen)."""
    log, keys, console = run_long_with_outage(tmp_path, profile, romfs=romfs)
    assert not [x for x in console if "MemoryError" in x], [x for x in console if "Error" in x][:5]
    assert log.counts["done"] == 1 and log.boots == [0], (log.boots, dict(log.counts))
    assert not log.of("dropped"), log.of("dropped")[:5]
    assert max(e["pending"] for e in log.of("connected")) >= 100, log.of("connected")
    assert check_delivery(log.ledger, keys) == 1000
