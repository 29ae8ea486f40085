"""The fleet runner: N emulated boards running the telemetry firmware against one Mosquitto, the
scenario's faults injected on schedule, every board's console read into a ledger, and a check that
every QoS >= 1 message a board accepted reached the broker's subscribers.

Over 600 lines because `Fleet` is one schedule run by one thread (see below): the faults, boards,
collectors and ledger it drives share that thread's state, and what stands alone (the scenario,
schedule, collectors' processes, the view, the result's parts in parts.py and the verdict and output
in outcome.py) is a module of its own. Every board's relay runs on one event loop (boards/hub.py).

Why it is built like this:
- One thread (the caller's) runs the schedule, reads the consoles and calls the callbacks, so a
  caller that drives a terminal UI (rich progress bars) never sees two callbacks at once. The
  observer (an MQTT subscriber that records what the broker delivered) is a process of its own at
  idle CPU priority, subscribed after the collectors so that they are served first (see
  observer.py), read on the fleet's tick.
- Each board has its own flash image (a copy of one prepared once with the app and its config, so no
  board's serial port is opened) and workdir under ``out/boards/<name>`` and its own emulated
  Wi-Fi link (profile ``"network": "wifi"``, ``EmulatedBoard.set_link``). A network cut takes the
  board's link down and ends its connections; while the link is down the app keeps measuring and does
  not dial. The boards talk to the broker directly: the fleet holds a duplicate of each board's
  connections (custody.py), so a power cut leaves them open and silent at the broker, as a real
  board's, and a network cut ends them. Where the kernel does not allow that (or with ``relay=True``,
  to get each board's packet log) each board talks through its own ChaosProxy instead, at the cost of
  a relay hop per packet.
- A broker restart takes every board's link down until the collectors and then the observer have
  subscribed again (see _restart_broker).
- After ``duration`` no new fault starts: boards that are off get power back, cut networks come back,
  boards are told (their ``cmd/interval`` command) to stop measuring, and the run waits up to
  ``settle`` seconds for the outboxes to drain. Only then is the delivery judged: a QoS >= 1 row of
  the ledger that never reached the observer is a loss.
- With ``[collectors]``, that many ``tern collect`` processes (one shared subscription, persistent
  sessions, ids ``collector-1``...) are subscribed before any board boots and land everything under
  ``out/landing``; a ``collector_kill`` fault SIGKILLs one while it holds an unwritten batch and
  restarts it with the same id. Settling then also waits until every QoS >= 1 ledger row is in the
  landing set, and the collectors are stopped with SIGTERM (they write their last batch, exit 0)
  before the broker.

Output directory: ``faults.jsonl`` (every injected fault, with its time and target and what became of
it), ``ledger.jsonl`` (pipeline ledger rows: what the devices say they published), ``received.jsonl``
(what the observer got), ``summary.json``, and ``boards/<name>/console.log`` (+ ``packets.jsonl`` with
a relay), ``broker/mosquitto.log``; with collectors ``landing/`` and ``collectors/<id>.log``.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from ..pipeline.judge import message_key
from .observer import Observer
from .outcome import check_slots, judge
from .parts import Callbacks, ExternalBroker, FaultRecord, FleetResult, send_commands  # noqa: F401 (re-exported)
from .scenario import Scenario
from .schedule import Fault, check_seed, collector_id, make_schedule

# Firmware settings the fleet uses unless the scenario's [firmware] table says otherwise: a fleet run
# lasts seconds, so notice a dead link soon. The reconnect backoff is the firmware's own, the library's
# (tern.client.backoff_ms and its defaults BACKOFF_MIN_MS, BACKOFF_MAX_MS), as a device has it: the
# first try after a connection that served goes at once, failed ones back off with jitter.
FIRMWARE_DEFAULTS = {"version": 5, "keepalive": 10, "interval_ms": 500, "qos": 1, "wifi_ssid": "fleet"}
STOP_INTERVAL_MS = 86400000  # the firmware's largest interval: "stop measuring" for the settle phase
OBSERVER_TOPIC = "tern/+/telemetry"
KILL_WAIT = 3.0  # a collector_kill waits up to this long for the collector to hold an unwritten batch
CONNECTION_EVENTS = ("connected", "disconnected", "boot", "connect_failed")  # firmware console events
HOLD_EVERY = 50  # ticks (about a second) between custody's looks at a board whose console said nothing
BOOT_TIMEOUT = 60.0  # a board's boot, on a host whose cores 100 boards and other work share (10 s was short)
BOOT_BATCH = 25  # boards powered on at once at the start (each then waited for)


class _Slot:
    """One board of the fleet: the EmulatedBoard, its relay (if any), its parsed console, its fault state."""

    def __init__(self, index, name):
        self.index = index
        self.name = name
        self.board = None
        self.proxy = None
        self.tlog = None
        self.seen = 0
        self.off_until = None      # powered off by a fault until this fleet time
        self.net_until = None      # network cut until this fleet time
        self.armed = None          # FaultRecord of a flash-op cut waiting to fire
        self.boot_by = None        # a power-on under way: the board is up by this monotonic time
        self.expect_off = False
        self.power_cuts = 0
        self.network_cuts = 0
        self.unexpected = []

    @property
    def state(self):
        if self.board is None:
            return "starting"
        if not self.board.is_on:
            return "off"
        return "net-down" if self.net_until is not None else "on"


class _CollectorSlot:
    """One collector process and its fault state."""

    def __init__(self, proc):
        self.proc = proc
        self.down_until = None     # killed by a fault; restart at this fleet time
        self.kill_at = None        # (record-less) fault waiting for an unwritten batch, with its deadline
        self.starting = None       # the fault whose restart waits for the new process to subscribe
        self.unexpected = []

    @property
    def state(self):
        if self.starting is not None:
            return "starting"
        return "running" if self.proc.alive else ("killed" if self.down_until is not None else "stopped")


class Fleet:
    """N emulated boards, one broker, the scenario's faults: see the module docstring.

    Fleet(scenario, seed, out, replay=None, callbacks=None, first_board=0, relay=False). run() returns
    a FleetResult; stop() (also called by run() at its end) powers everything off. `replay` is the
    command printed with a failure (the CLI passes `tern fleet run ...`, the pytest plugin the test id).
    relay: every board talks through a ChaosProxy that logs its packets (``packets.jsonl``, read by
    tools/bench/demo_latency.py), one more hop per packet; also used where custody is not available.
    """

    def __init__(self, scenario: Scenario, seed: int, out, *, replay: str | None = None,
                 callbacks: Callbacks | None = None, first_board: int = 0, relay: bool = False,
                 broker: "ExternalBroker | None" = None, tls=None):
        self.scenario = scenario
        self.seed = check_seed(seed)
        self.out = Path(out)
        self.replay = replay
        self.cb = callbacks or Callbacks()
        self.schedule = self._own_faults(make_schedule(scenario, seed))
        self.board_names = [f"board-{first_board + i:03d}" for i in range(self._board_count())]
        self.slots = [_Slot(i, n) for i, n in enumerate(self.board_names)]
        self.records: list[FaultRecord] = []
        self.broker = None
        self.external = broker       # a broker the team runs: the fleet starts no Mosquitto
        self.tls = tls               # fleet.login.BrokerLogin for it (TLS, user, password), or None
        self.observer = None
        self.observer_trouble = None  # why the observer's copies may be incomplete (Observer.stop)
        self.collectors: list[_CollectorSlot] = []
        self.landing = None          # LandingIndex with collectors
        self._landing_at = 0.0
        self.t0 = None
        self._stopped = False
        self.firmware = dict(FIRMWARE_DEFAULTS, **scenario.firmware)
        self.relay = relay
        self.custody = None  # SocketCustody unless the boards talk through relays
        self._ticks = 0

    # ------------------------------------------------------------ what a part of a spread fleet overrides
    # (fleet/spread.py: the driver keeps the broker, the collectors and the observer; a slice its boards)
    def _own_faults(self, schedule: list[Fault]) -> list[Fault]:
        """The faults this process injects: all of them in a fleet of one process."""
        return schedule

    def _board_count(self) -> int:
        return self.scenario.boards

    def _clock_start(self) -> float:
        """The monotonic time the schedule counts from: now, once the boards are up."""
        return time.monotonic()

    def _fault_rows(self) -> list[dict]:
        return [r.as_dict() for r in self.records]

    def _summary_extra(self) -> dict:
        return {}

    def _board_results(self) -> tuple[list, dict, list]:
        """(ledger rows, name -> counters, failures) of the boards, checked: see _check_slots."""
        return self._check_slots()

    # ------------------------------------------------------------ for callers and the pytest plugin
    def now(self) -> float:
        return 0.0 if self.t0 is None else time.monotonic() - self.t0

    def progress(self) -> dict:
        """name -> {state, boot, published, acked, received, pending} right now."""
        out = {}
        for s in self.slots:
            t = s.tlog
            boots = t.boots if t else []
            out[s.name] = {"state": s.state, "boot": boots[-1] if boots else "-",
                           "published": t.counts["published"] if t else 0,
                           "acked": len(t.acked) if t else 0,
                           "received": self.observer.received(s.name) if self.observer else 0,
                           "pending": len(t.pending) if t else 0,
                           "landed": self.landing.by_device[s.name] if self.landing else None}
        return out

    def collector_progress(self) -> dict:
        """id -> {state, runs, landed} right now (empty without collectors); landed = rows it wrote."""
        return {c.proc.id: {"state": c.state, "runs": c.proc.starts,
                            "landed": self.landing.by_collector[c.proc.id] if self.landing else 0}
                for c in self.collectors}

    def landing_progress(self) -> tuple[int, int]:
        """(QoS >= 1 ledger rows in the landing set, QoS >= 1 ledger rows) right now."""
        if self.landing is None:
            return 0, 0
        want = [message_key(r) for s in self.slots if s.tlog
                for r in s.tlog.ledger if r["qos"]]
        return sum(1 for k in want if self.landing.has(k)), len(want)

    def fault_log_text(self) -> str:
        head = [f"seed={self.seed} scenario={self.scenario.name}" + (f" replay: {self.replay}" if self.replay else "")]
        return "\n".join(head + [r.line() for r in self.records])

    def broker_log_text(self) -> str:
        if self.broker is None or self.broker.log_path is None or not self.broker.log_path.exists():
            return ""
        return self.broker.log_path.read_text(errors="replace")

    def console_tails(self, lines: int = 30) -> str:
        parts = []
        for s in self.slots:
            if s.board is not None:
                parts.append(f"== {s.name} ==")
                parts += [ln.format().rstrip("\n") for ln in s.board.log.lines[-lines:]]
        return "\n".join(parts)

    # ------------------------------------------------------------ faults
    def _record(self, fault, status, target, detail=""):
        r = FaultRecord(fault, self.now(), status, target, detail)
        self.records.append(r)
        self.cb.on_fault(r)
        return r

    def _inject(self, f: Fault) -> None:
        if f.kind == "collector_kill":
            c = self.collectors[f.target]
            if not c.proc.alive or c.kill_at is not None or c.starting is not None:
                # (a kill while it starts again would be taken for a collector that failed by itself)
                self._record(f, "skipped", c.proc.id, "not running" if c.starting is None else
                             "still starting again after its last kill")
                return
            c.kill_at = (f, self.now() + KILL_WAIT)  # done in _collector_housekeep, mid-batch
            return
        if f.kind == "broker_restart":
            self._restart_broker(f)
            return
        s = self.slots[f.target]
        if f.kind == "network_cut":
            if s.net_until is not None:
                self._record(f, "skipped", s.name, "network already cut")
                return
            n = self._link_down(s)
            s.net_until = self.now() + f.params["length"]
            s.network_cuts += 1
            self._record(f, "injected", s.name, f"{n} connection(s) cut, down {f.params['length']:.2f} s")
            return
        # power cut
        if not s.board.is_on:
            self._record(f, "skipped", s.name, "already off")
            return
        if s.armed is not None:
            self._record(s.armed.fault, "unfired", s.name, "superseded by a later power cut")
            s.armed = None
        self._hold(s)  # a connection opened since the last tick stays open too
        if f.params["at"] == "time":
            s.expect_off = True
            s.boot_by = None  # a cut during a boot ends that boot: not a failure to boot
            s.board.cut_power(0)  # the boards' event loop kills it; power comes back once it is off
            s.power_cuts += 1
            s.off_until = self.now() + f.params["off"]
            self._record(f, "injected", s.name, f"SIGKILL, off {f.params['off']:.2f} s")
        else:
            n = f.params["flash_op"]
            # recorded first: its time is the power cycle's (a reboot of its own, fired or not: the report's)
            s.armed = self._record(f, "armed", s.name, f"power-cycled; power fails at flash operation {n} of this boot")
            s.board.power_cycle(cut_at=n, seed=self.seed * 1009 + f.index, wait=False)
            s.boot_by = time.monotonic() + BOOT_TIMEOUT

    def _housekeep(self, s: _Slot, restore_all: bool = False) -> None:
        now = self.now()
        b = s.board
        if s.boot_by is not None:  # a power-on this thread did not wait for (hundreds of boards)
            up = b.booted
            if up or (up is None and time.monotonic() < s.boot_by):
                s.boot_by = None if up else s.boot_by
            elif s.armed is None or up is None:  # (an armed cut may fire during the boot: not a failure)
                s.unexpected.append(f"t={now:.2f}s {s.name} did not boot " + (
                    f"within {BOOT_TIMEOUT:.0f} s" if up is None else "(see its console.log)"))
                s.boot_by = None
            else:
                s.boot_by = None
        if not b.is_on and s.off_until is None:
            if s.armed is not None:
                cut = b.last_cut() or {}
                s.power_cuts += 1
                s.off_until = now + s.armed.fault.params["off"]
                self._record(s.armed.fault, "fired", s.name,
                             f"at flash operation {cut.get('op', '?')}, torn {cut.get('torn', '?')}")
                s.armed = None
            elif not s.expect_off:
                s.unexpected.append(f"t={now:.2f}s {s.name} lost power without a fault")
                s.off_until = now
        if s.off_until is not None and (restore_all or now >= s.off_until) and not b.is_on:
            b.power_on(wait=False)
            s.boot_by = time.monotonic() + BOOT_TIMEOUT
            s.off_until = None
            s.expect_off = False
            self._record(self._last_power_fault(s), "restored", s.name, "power back")
        if s.net_until is not None and (restore_all or now >= s.net_until):
            s.board.set_link(True)
            s.net_until = None
            self._record(self._last_fault(s, "network_cut"), "restored", s.name, "network back")

    def _restart_broker(self, f: Fault) -> None:
        """Restart the broker. The boards' links stay down until every running collector, and then the
        observer, has subscribed again: Mosquitto 2.0 forgets persistent sessions' shared subscriptions
        across a restart, so a reading that reached it before then would be routed to no collector, or
        not to the observer (see docs/demo.md)."""
        mode = "hard" if f.params["hard"] else "soft"
        if self.external is not None and not self.external.hook:
            self._record(f, "skipped", "broker", f"a {mode} restart of {self.external.name}: the fleet did not start "
                         "that broker and was given no --broker-fault-hook")
            return
        running = [c for c in self.collectors if c.proc.alive and c.starting is None]
        marks = {id(c): len(c.proc.lines) for c in running}
        for s in self.slots:
            # the links' connections end with them: a board whose app had not looked at its link yet
            # talked on to the broker between the save below and the kill, and what the broker
            # acknowledged then was lost with it (2 QoS 2 messages at 1,000 boards)
            self._link_down(s)
        if self.external is not None:
            self._record(f, "injected", "broker", f"{mode} restart by the hook: {self.external.hook}")
            detail = self.external.restart(hard=f.params["hard"])
        else:
            if f.params["hard"] and self.broker.persistence:
                # what it acknowledged is on disk first, as a broker that syncs each message would have
                # it: the fleet tests the devices and collectors, not Mosquitto's save interval. Nothing
                # new is acknowledged after the save only because every board's link went down above.
                self.broker.save()
            self._record(f, "injected", "broker", "SIGKILL" if f.params["hard"] else "SIGTERM")
            self.broker.restart(hard=f.params["hard"])
            detail = f"back on port {self.broker.port}"
        t0 = time.monotonic()
        while time.monotonic() - t0 < 15 and not all(
                any("subscribed again" in ln for ln in c.proc.lines[marks[id(c)]:]) or not c.proc.alive
                for c in running):
            time.sleep(0.02)
        if not self.observer.subscribe_again():
            self.observer_trouble = "the observer did not subscribe again after a broker restart"
        for s in self.slots:
            if s.net_until is None:
                s.board.set_link(True)
        detail += (f"; boards let back {time.monotonic() - t0:.2f} s later, once the collectors and the observer "
                   "had subscribed again")
        self._record(f, "restored", "broker", detail)

    def _collector_housekeep(self, c: _CollectorSlot, restore_all: bool = False) -> None:
        now = self.now()
        if c.kill_at is not None:
            f, deadline = c.kill_at
            waiting = c.proc.waiting()
            if restore_all:
                c.kill_at = None
                self._record(f, "skipped", c.proc.id, "the run ended first")
            elif waiting or now >= deadline:
                c.kill_at = None
                waiting = c.proc.kill()
                c.down_until = now + f.params["down"]
                self._record(f, "injected", c.proc.id,
                             f"SIGKILL with {waiting if waiting is not None else '?'} message(s) received and not "
                             f"yet written; restart with the same id in {f.params['down']:.2f} s")
        if c.down_until is not None and c.starting is None and (restore_all or now >= c.down_until):
            c.proc.launch()
            c.starting = self._last_fault_of(c.proc.id, "collector_kill")
        if c.starting is not None:
            try:
                ready = c.proc.ready()
            except Exception as e:
                c.unexpected.append(f"t={now:.2f}s {e}")
                c.starting = None
                c.down_until = None
                return
            if ready:
                self._record(c.starting, "restored", c.proc.id, f"restarted with the same id (run {c.proc.starts})")
                c.starting = None
                c.down_until = None
        elif c.down_until is None and not c.proc.alive and c.proc.proc is not None and not self._stopped:
            code = c.proc._reap()
            c.unexpected.append(f"t={now:.2f}s collector {c.proc.id} exited on its own (status {code}): "
                                f"{c.proc.tail(3)}")
            c.down_until = float("inf")  # do not restart a collector that failed by itself

    def _last_fault_of(self, target, kind):
        for r in reversed(self.records):
            if r.target == target and r.fault.kind == kind:
                return r.fault
        return Fault(-1, 0.0, kind, None, {})

    def _last_fault(self, s, kind):
        for r in reversed(self.records):
            if r.target == s.name and r.fault.kind == kind:
                return r.fault
        return Fault(-1, 0.0, kind, s.index, {})

    def _last_power_fault(self, s):
        return self._last_fault(s, "power_cut")

    def _hold(self, s: _Slot) -> None:
        """Custody takes the board's new connections and lets go of those it dropped (no-op with relays)."""
        if self.custody is not None:
            self.custody.sync(s.name, s.board.pid)

    def _pump(self, s: _Slot) -> bool:
        """Feed the board's new console lines to its TelemetryLog; True when one says its connection
        changed (custody looks at the board's sockets then)."""
        lines = s.board.log.lines
        n = len(lines)
        changed = False
        for ln in lines[s.seen:n]:
            if ln.kind == "out":
                for e in s.tlog.feed(ln.text):
                    changed = changed or e["ev"] in CONNECTION_EVENTS
                    self.cb.on_event(s.name, e)
        s.seen = n
        return changed

    # ------------------------------------------------------------ the run
    def _link_down(self, s) -> int:
        """The board's Wi-Fi goes and its connections end with it (a network cut, a broker restart's
        hold); the connections cut."""
        s.board.set_link(False)  # first: the app must find the link down when it sees its connection end
        if s.proxy is not None:
            return s.proxy.cut_now()
        return self.custody.cut(s.name, s.board.pid) if self.custody is not None else 0

    def _start(self) -> None:
        from ..brokers.mosquitto import Broker

        self.out.mkdir(parents=True, exist_ok=True)
        for old in ("boards", "broker", "landing", "collectors", "observer", "image"):
            # an earlier run into the same directory: its flash images (outboxes, boot counters, the
            # stop command they were sent), broker state and landed rows would leak into this one
            shutil.rmtree(self.out / old, ignore_errors=True)
        self.cb.on_phase("starting")
        # no cap on a subscriber's queue (Mosquitto's default keeps 1,000 and drops the rest): on a busy
        # machine the idle-priority observer falls seconds behind a large fleet, which is the host's
        # lag, not a loss of the devices' (docs/fleet.md)
        # packets logged only when the scenario asks, and the database saved every 5 s rather than after
        # every change: at 100 boards both were most of Mosquitto's work, and it fell behind (docs/fleet.md)
        self.broker = self.external or Broker(self.out / "broker", persistence=self.scenario.persistence,
                                              max_queued_messages=0, log_packets=self.scenario.log_packets,
                                              autosave_seconds=5).start()
        self._start_services()
        self._start_boards()

    def _start_services(self) -> None:
        """The collectors, then the observer (Mosquitto serves them in that order: observer.py)."""
        topic = self.firmware.get("topic", "tern/{id}/telemetry").replace("{id}", "+")
        self.observer = Observer(f"fleet-observer-{self.seed}", self.broker.host, self.broker.port,
                                 self.out / "observer" / "copies.jsonl", self.out / "observer" / "observer.log",
                                 tls=self.tls)
        self._start_collectors(topic)
        self.observer.start(topic)

    def _start_boards(self) -> None:
        from ..boards import load_profile
        from ..boards.emulated import EmulatedBoard
        from ..brokers.chaos import ChaosProxy
        from ..app_events import TelemetryLog
        from ..devset import compile_mpy, install_app as install
        from .custody import SocketCustody, available as custody_available

        code = compile_mpy(self.out / "mpy")
        # A power cut ends the board's process, and the host kernel would tell the broker at once (FIN):
        # a real board vanishes, and the broker learns it from the keepalive or a takeover. Custody (or
        # a relay) keeps the dead board's connections open and silent.
        if not self.relay and custody_available():
            self.custody = SocketCustody(self.broker.address)
        profile = dict(load_profile(self.scenario.profile), network="wifi")  # a link the fleet can cut
        relays = self.custody is None and (self.relay or any(f.kind == "network_cut" for f in self.schedule))
        # every board the same files (its client id is its own board id): one flash image prepared once
        # and copied per board; with relays each board dials its own proxy, so each is installed apart
        image = None if relays else self._prepare_image(profile, code)
        for s in self.slots:
            workdir = self.out / "boards" / s.name
            if image is not None:
                workdir.mkdir(parents=True, exist_ok=True)
                for f in image:
                    shutil.copyfile(f, workdir / f.name)
            if relays:
                s.proxy = ChaosProxy(self.broker.address, seed=self.seed * 1009 + s.index).start()
                s.proxy.client_vanishes()
            s.board = EmulatedBoard(profile, workdir=workdir, board_id=s.name, host_paths=[code], power=False)
            s.tlog = TelemetryLog()
            if image is None:
                s.board.power_on(timeout=BOOT_TIMEOUT)  # a fresh flash: no main.py yet
                host, port = s.proxy.address
                install(s.board, dict(self.firmware, host=host, port=port, client_id=s.name,
                                      **(self.tls.firmware(s.board) if self.tls else {})))
                s.board.power_off()
                # the serial port (and pyserial's four pipes) closed: this process never opens it again
                s.board.disconnect()
        self.cb.on_start(self)
        for i in range(0, len(self.slots), BOOT_BATCH):  # booted together, a batch at a time
            batch = self.slots[i:i + BOOT_BATCH]
            for s in batch:
                s.board.power_on(timeout=BOOT_TIMEOUT, wait=False)  # main.py: the app runs
            for s in batch:
                s.board.wait_booted(BOOT_TIMEOUT)

    def _prepare_image(self, profile, code) -> list:
        """A board's flash with the app and its config on its filesystem (no client id: each board's
        is its own id, board-NNN), made once on a board of its own; returns the files to copy."""
        from ..boards.emulated import EmulatedBoard
        from ..devset import install_app

        b = EmulatedBoard(profile, workdir=self.out / "image", board_id="fleet-image", host_paths=[code], power=False)
        try:
            b.power_on(timeout=BOOT_TIMEOUT)  # a fresh flash: no main.py yet, the REPL
            install_app(b, dict(self.firmware, host=self.broker.host, port=self.broker.port,
                                **(self.tls.firmware(b) if self.tls else {})))
            b.power_off()
        finally:
            b.close()
        return [b.image, b.image.with_name(b.image.name + ".wear")]

    def _start_collectors(self, topic) -> None:
        """Every collector subscribed before any board boots: none of the fleet's messages predates them."""
        spec = self.scenario.collectors
        if not spec.count:
            return
        from ..pipeline.judge import LandingIndex
        from .collectors import CollectorProc

        self.landing = LandingIndex(self.out / "landing")
        for i in range(spec.count):
            cid = collector_id(i)
            self.collectors.append(_CollectorSlot(CollectorProc(
                cid, self.out / "landing", self.out / "collectors" / f"{cid}.log", host=self.broker.host,
                port=self.broker.port, topic=topic, group=spec.group, batch_time=spec.batch_time,
                # TLS and the user by flags, the password by the environment (fleet/login.py), never argv
                extra=self.tls.collect_args() if self.tls else (), env=self.tls.child_env() if self.tls else None)))
        for c in self.collectors:
            c.proc.launch()
        for c in self.collectors:
            c.proc.wait_ready()

    def _refresh_landing(self, force=False) -> None:
        if self.landing is not None and (force or time.monotonic() - self._landing_at >= 0.5):
            self.landing.refresh()
            self._landing_at = time.monotonic()

    def run(self) -> FleetResult:
        """Start, run the schedule for `duration`, settle, stop, write the output, judge."""
        t_start = time.monotonic()
        # With relays this process forwards every board's traffic (a ChaosProxy's threads per board)
        # beside the live view, the consoles and the fault schedule: a relay thread woken by a packet
        # waits for the interpreter lock up to the switch interval (5 ms by default), which the latency
        # figures then measure. A tenth of a millisecond bounds that wait.
        switch = sys.getswitchinterval()
        sys.setswitchinterval(0.0001)
        try:
            self._start()
            self.t0 = self._clock_start()
            self.cb.on_phase("running")
            pending = list(self.schedule)
            next_tick = 0.0
            while self.now() < self.scenario.duration:
                while pending and pending[0].t <= self.now():
                    self._inject(pending.pop(0))
                self._cycle()
                if self.now() >= next_tick:
                    self.cb.on_tick(self)
                    next_tick = self.now() + 0.1
                time.sleep(0.02)
            self._settle()
        finally:
            self.stop()
            sys.setswitchinterval(switch)
        result = self._judge(time.monotonic() - t_start)
        self.cb.on_phase("done")
        self.cb.on_end(result)
        return result

    def _cycle(self, restore_all=False):
        for s in self.slots:
            self._housekeep(s, restore_all)
            # custody reads a board's /proc fd table when its console says the connection changed, and
            # once a second in any case (every tick, it was most of this thread's work: docs/fleet.md)
            if self._pump(s) or (self._ticks + s.index) % HOLD_EVERY == 0:
                self._hold(s)
        self._ticks += 1
        for c in self.collectors:
            self._collector_housekeep(c, restore_all)
        self._refresh_landing()
        if self.observer is not None:
            self.observer.refresh()

    def _drained(self) -> bool:
        if any(c.starting is not None or c.kill_at is not None for c in self.collectors):
            return False
        self._refresh_landing(force=True)
        self.observer.refresh()
        for s in self.slots:
            for r in s.tlog.ledger:
                key = message_key(r)
                if r["qos"] and not (self.observer.has(key) and (self.landing is None or self.landing.has(key))):
                    return False
        return True

    def _settle(self) -> None:
        """No new faults: power and network back, readings stopped, outboxes drained (or settle runs out)."""
        self.cb.on_phase("settling")
        self._cycle(restore_all=True)
        base = self.firmware.get("cmd_topic", "tern/{id}/cmd")
        if self.slots:  # one commander per process of a spread fleet: a client id of its own
            send_commands(self.broker.address, [(base.replace("{id}", s.name) + "/interval", str(STOP_INTERVAL_MS))
                                                for s in self.slots],
                          login=self.tls, name=f"fleet-commander-{self.board_names[0]}")
        deadline = time.monotonic() + self.scenario.settle
        quiet_since, last = time.monotonic(), None
        while time.monotonic() < deadline:
            self._cycle(restore_all=True)
            total = sum(s.tlog.counts["published"] for s in self.slots)
            if total != last:
                quiet_since, last = time.monotonic(), total
            if time.monotonic() - quiet_since > 1.0 and self._drained():
                break
            self.cb.on_tick(self)
            time.sleep(0.05)
        self.cb.on_tick(self)
        for s in self.slots:
            if s.armed is not None:
                self._record(s.armed.fault, "unfired", s.name, "the run ended first")
                s.armed = None

    def stop(self) -> None:
        """Power every board off, stop proxies, observer and broker (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        self.cb.on_phase("stopping")
        for s in self.slots:
            if s.board is not None:
                try:
                    self._pump(s)
                except Exception:
                    pass
                s.board.close()
            if s.proxy is not None:
                s.proxy.stop()
        if self.custody is not None:
            try:
                self.custody.close()
            except OSError:
                pass  # closing the fleet's own duplicates: nothing of a board's is lost with them
        for c in self.collectors:  # before the broker: each writes and acknowledges its last batch
            if c.proc.proc is not None:
                if c.proc.alive:
                    code = c.proc.terminate()
                    if code != 0:
                        c.unexpected.append(f"collector {c.proc.id} exited with status {code} on SIGTERM: "
                                            f"{c.proc.tail(3)}")
                c.proc.close()
        if self.landing is not None:
            try:
                self.landing.refresh()
            except Exception as e:
                for c in self.collectors[:1]:
                    c.unexpected.append(f"the landing set cannot be read: {e}")
        try:
            if self.observer is not None:
                self.observer_trouble = self.observer.stop() or self.observer_trouble
        finally:
            if self.broker is not None and self.external is None:
                self.broker.stop()

    # ------------------------------------------------------------ output and verdict (fleet/outcome.py)
    def _check_slots(self) -> tuple[list, dict, list]:
        return check_slots(self)

    def _judge(self, elapsed: float) -> FleetResult:
        return judge(self, elapsed)
