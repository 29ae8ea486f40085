"""A fleet spread over a Spark cluster (``tern fleet run SCENARIO --master spark://HOST:PORT``): the
boards run in slices, one Spark barrier task each, so that every slice runs at once; the driver keeps
the broker (or the address of the team's), the collectors, the observer and their faults.

Why Spark and not a coordinator of our own: the project's audit already runs there, a cluster is
something a team has, and barrier execution gives exactly "all slices at once or none" (a barrier
stage is scheduled only when every task has a slot, and fails as a whole).

How the parts agree without talking:
- Every slice draws the whole schedule from the one seed (schedule.py) and keeps the power and
  network cuts of its own boards (board numbers ``lo..hi-1`` of the fleet, names unchanged); the driver
  keeps the broker restarts and collector kills.
- All parts count the schedule from one wall-clock instant: once every slice has booted its boards
  (a barrier: ``allGather`` of their clocks), a second after the latest; slice 0 retains it on the
  run's control topic, where the driver waits for it. The driver counts from a moment later
  (``DRIVER_LAG``), so a slice is early rather than late for a broker restart.
- A broker restart: at its scheduled time every slice takes its boards' links down and holds them
  until the driver's retained message on the run's control topic says that restart is over (the
  collectors and the observer have subscribed again: runner._restart_broker). A slice that hears
  nothing for HOLD_MAX seconds lets its boards back and reports it as a failure.
- Each slice returns its ledger rows, board counters, fault records and failures as one JSON row;
  the driver makes them a DataFrame (Spark's own result) and writes the same output files as a fleet
  of one process (``ledger.jsonl`` ...), judged by the same rules, read by the same audit.

A worker's environment is the driver's, at the same path: ``spark.pyspark.python`` is this
interpreter (the project's .venv, which holds ``ternlab`` and ``tern``), and the MicroPython unix port
binary and mpy-cross are found where ``make setup`` put them on every worker. docs/fleet.md says why
(rather than a venv archive in ``spark.archives``).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from ..pipeline.judge import message_key
from .runner import ExternalBroker, Fleet
from .schedule import Fault, make_schedule

DRIVER_LAG = 0.5      # seconds the driver's clock starts after the slices'
PENDING_QUIET = 15.0  # seconds a slice's pending set may stay as it is before it stops waiting
HOLD_MAX = 90.0       # longest a slice holds its boards' links for one broker restart
BOARD_FAULTS = ("power_cut", "network_cut")


def slice_range(boards: int, slices: int, k: int) -> tuple[int, int]:
    """Board numbers lo..hi-1 of slice k: the fleet cut into `slices` nearly equal runs."""
    return boards * k // slices, boards * (k + 1) // slices


def broker_round(schedule: list[Fault], f: Fault) -> int:
    """Which broker restart of the run f is (1, 2, ...): the number the driver announces."""
    return sum(1 for g in schedule if g.kind == "broker_restart" and g.index <= f.index)


def _wall_to_monotonic(wall: float) -> float:
    return time.monotonic() + (wall - time.time())


class SliceFleet(Fleet):
    """The boards lo..hi-1 of a spread fleet, in a Spark task: no broker of its own, no collectors,
    no observer (the driver's judges the losses)."""

    def __init__(self, scenario, seed, out, *, lo, hi, broker, control, broker_faults, gather, tls=None,
                 relay=False):
        self.lo, self.hi = lo, hi
        self.broker_faults = broker_faults
        super().__init__(scenario, seed, out, first_board=lo, relay=relay, broker=broker, tls=tls)
        self.gather = gather         # BarrierTaskContext.allGather (all slices' clocks, once all are up)
        self.start_at = None
        self.control = control
        self.holding = None          # (round, record, since) while a broker restart holds the links
        self._asked = 0.0
        self._pending_seen, self._pending_since = None, 0.0

    def _own_faults(self, schedule):
        mine = []
        for f in schedule:
            if f.kind in BOARD_FAULTS and self.lo <= f.target < self.hi:
                mine.append(replace(f, target=f.target - self.lo))
            elif f.kind == "broker_restart" and self.broker_faults:
                mine.append(f)
        return mine

    def _board_count(self):
        return self.hi - self.lo

    def _start_services(self):
        pass

    def _clock_start(self):
        self.start_at = max(float(t) for t in self.gather(repr(time.time()))) + 1.0
        if self.lo == 0:
            announce(self.broker.address, self.control + "/start", repr(self.start_at).encode(), self.tls)
        return _wall_to_monotonic(self.start_at)

    def _restart_broker(self, f):
        """The driver restarts the broker: hold the links until it says the restart is over."""
        if self.holding is not None:  # a second restart before the first was announced: wait for both
            self.holding = (broker_round(make_schedule(self.scenario, self.seed), f), self.holding[1], self.holding[2])
            return
        for s in self.slots:
            s.board.set_link(False)
        rec = self._record(f, "injected", "broker", "links held until the driver says the broker is back")
        self.holding = (broker_round(make_schedule(self.scenario, self.seed), f), rec, time.monotonic())

    def _cycle(self, restore_all=False):
        super()._cycle(restore_all)
        if self.holding is None or time.monotonic() - self._asked < 0.5:
            return
        self._asked = time.monotonic()
        want, rec, since = self.holding
        got = read_retained(self.broker.address, self.control, self.tls, f"fleet-slice-{self.lo}")
        done = int(got) if got and got.isdigit() else 0
        waited = time.monotonic() - since
        if done >= want or waited > HOLD_MAX:
            self.holding = None
            for s in self.slots:
                if s.net_until is None:
                    s.board.set_link(True)
            if done >= want:
                self._record(rec.fault, "restored", "broker", f"the driver said restart {want} is over; "
                             f"links back after {waited:.2f} s")
            else:
                self.slots[0].unexpected.append(f"the driver never said broker restart {want} was over "
                                                f"({HOLD_MAX:g} s): links let back")

    def _drained(self):
        """Every board's accepted QoS >= 1 readings acknowledged by the broker, or what is still
        pending unchanged for PENDING_QUIET seconds (the console's bookkeeping can keep an id a reboot
        completed under another: a slice waited out its whole settle for one). The driver then checks
        that every reading reached the subscribers, and waits for them itself."""
        if self.holding is not None:
            return False
        pending = tuple(sorted((s.name, p) for s in self.slots if s.tlog for p in s.tlog.pending))
        if not pending:
            return True
        if pending != self._pending_seen:
            self._pending_seen, self._pending_since = pending, time.monotonic()
        return time.monotonic() - self._pending_since >= PENDING_QUIET

    def report(self, elapsed: float) -> dict:
        ledger, boards, failures = self._check_slots()
        return {"lo": self.lo, "hi": self.hi, "ledger": ledger, "boards": boards, "failures": failures,
                "faults": self._fault_rows(), "elapsed": round(elapsed, 2), "start_at": self.start_at}

    def run_slice(self) -> dict:
        """Boot the boards, agree on the start with the other slices, run the schedule, settle. A
        failure before the start fails the Spark stage (every slice with it); one after it is this
        slice's report."""
        t = time.monotonic()
        try:
            self._start()
            self.t0 = self._clock_start()
        except BaseException:
            self.stop()
            raise
        try:
            pending = list(self.schedule)
            while self.now() < self.scenario.duration:
                while pending and pending[0].t <= self.now():
                    self._inject(pending.pop(0))
                self._cycle()
                time.sleep(0.02)
            self._settle()
        except Exception as e:
            self.slots[0].unexpected.append(f"slice of boards {self.lo}..{self.hi - 1} broke down: "
                                            f"{e.__class__.__name__}: {e}")
        finally:
            self.stop()
        return self.report(time.monotonic() - t)


def read_retained(addr, topic, login, name, wait=1.0) -> bytes | None:
    """The retained message of a control topic, None if none or the broker cannot be reached now."""
    from tern.client import Client

    got = []
    try:
        c = Client(name, server=addr[0], port=addr[1], version=5, reconnect=False, connect_timeout=2,
                   **(login.client_kwargs() if login else {}))
        c.on_message = lambda m: got.append(bytes(m.payload))
        c.connect()
        try:
            c.subscribe(topic, 1)
            end = time.monotonic() + wait
            while not got and time.monotonic() < end:
                c.loop(50)
        finally:
            c.disconnect()
    except OSError:
        return None
    return got[0] if got and got[0] else None


def announce(addr, topic, payload: bytes, login) -> None:
    """Retain payload on a control topic (empty: clear it)."""
    from tern.client import Client

    c = Client("fleet-driver-control", server=addr[0], port=addr[1], version=5,
               **(login.client_kwargs() if login else {}))
    c.connect()
    try:
        c.wait_published(c.publish(topic, payload, qos=1, retain=True), timeout=10)
    finally:
        c.disconnect()


def _slice_task(spec: dict, _rows):
    """One barrier task: run slice k of the fleet, yield its report as one JSON string."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    k = ctx.partitionId()
    lo, hi = slice_range(spec["scenario"].boards, spec["slices"], k)
    fleet = SliceFleet(spec["scenario"], spec["seed"], Path(spec["out"]) / "slices" / f"slice-{k}", lo=lo, hi=hi,
                       broker=ExternalBroker(*spec["broker"]), gather=ctx.allGather,
                       control=spec["control"], broker_faults=spec["broker_faults"], tls=spec["tls"],
                       relay=spec["relay"])
    report = fleet.run_slice()
    report["slice"] = k
    report["host"] = os.uname().nodename
    report["workdir"] = os.getcwd()  # a standalone worker runs its executor in a work dir of its own
    yield json.dumps(report)


class DriverFleet(Fleet):
    """The driver's part of a spread fleet: broker, collectors, observer, their faults; the boards run
    in `slices` Spark barrier tasks (see the module docstring)."""

    def __init__(self, scenario, seed, out, *, spark, slices, boot_timeout=None, **kw):
        super().__init__(scenario, seed, out, **kw)
        self.spark = spark
        self.slices = slices
        # longest wait for every slice to boot its boards (Spark's executors start their Pythons too)
        self.boot_timeout = boot_timeout or 120.0 + 1.0 * -(-scenario.boards // slices)
        self.control = f"tern-fleet/{seed}/{secrets.token_hex(4)}/broker-restarts"
        self.rounds = 0
        self.reports = None          # the slices' reports once the job is done
        self.job_error = None
        self._job = None
        self.start_at = None

    def _own_faults(self, schedule):
        return [f for f in schedule if f.kind not in BOARD_FAULTS]

    def _board_count(self):
        return 0

    def _start_boards(self):
        """Launch the barrier job; the slices boot their boards and start counting at start_at."""
        import shutil

        shutil.rmtree(self.out / "slices", ignore_errors=True)
        hook = self.external is None or bool(self.external.hook)
        spec = {"scenario": self.scenario, "seed": self.seed, "out": str(self.out.resolve()),
                "slices": self.slices, "broker": self.broker.address,
                "control": self.control, "broker_faults": hook, "tls": self.tls, "relay": self.relay}
        from functools import partial

        sc = self.spark.sparkContext
        sc.setJobDescription(f"tern fleet {self.scenario.name} seed {self.seed}: {self.slices} slices")
        rdd = sc.parallelize(range(self.slices), self.slices).barrier().mapPartitions(partial(_slice_task, spec))

        def job():
            try:
                from pyspark.sql.types import StringType, StructField, StructType

                frame = self.spark.createDataFrame(rdd.map(lambda r: (r,)),
                                                   StructType([StructField("report", StringType())]))
                self.reports = sorted((json.loads(r.report) for r in frame.collect()), key=lambda r: r["slice"])
            except Exception as e:
                from ..pipeline.spark import spark_error_line

                self.job_error = f"the Spark job of the slices failed: {spark_error_line(e)}"

        self._job = threading.Thread(target=job, name="fleet-slices", daemon=True)
        self._job.start()
        deadline = time.monotonic() + self.boot_timeout
        while self.start_at is None:  # the slices boot their boards, then slice 0 says when all start
            got = read_retained(self.broker.address, self.control + "/start", self.tls, "fleet-driver-start", 0.5)
            if got:
                self.start_at = float(got)
            elif not self._job.is_alive():
                raise RuntimeError(self.job_error or "the slices ended before they started")
            elif time.monotonic() > deadline:
                raise RuntimeError(f"the slices did not boot their boards within {self.boot_timeout:g} s "
                                   "(does the cluster have a free core for every slice? --slices)")
            self._cycle()
        self.cb.on_start(self)

    def _clock_start(self):
        return _wall_to_monotonic(self.start_at + DRIVER_LAG)

    def _restart_broker(self, f):
        super()._restart_broker(f)
        if self.external is None or self.external.hook:
            self.rounds += 1
            announce(self.broker.address, self.control, str(self.rounds).encode(), self.tls)

    def _settle(self):
        while self._job.is_alive():  # the slices settle their boards; the driver keeps its own parts
            self._cycle(restore_all=True)
            self.cb.on_tick(self)
            self._job.join(0.1)
        super()._settle()

    def _ledger(self):
        return [r for rep in self.reports or () for r in rep["ledger"]]

    def _drained(self):
        if any(c.starting is not None or c.kill_at is not None for c in self.collectors):
            return False
        self._refresh_landing(force=True)
        self.observer.refresh()
        for r in self._ledger():
            key = message_key(r)
            if r["qos"] and not (self.observer.has(key) and (self.landing is None or self.landing.has(key))):
                return False
        return True

    def landing_progress(self):
        if self.landing is None:
            return 0, 0
        want = [message_key(r) for r in self._ledger() if r["qos"]]
        return sum(1 for k in want if self.landing.has(k)), len(want)

    def stop(self):
        if not self._stopped and self.broker is not None and self.external is not None:
            for topic in (self.control, self.control + "/start"):  # no retained leftovers on their broker
                try:
                    announce(self.broker.address, topic, b"", self.tls)
                except OSError:
                    pass
        super().stop()

    def _board_results(self):
        if self.job_error:
            return [], {}, [self.job_error]
        ledger, boards, failures = [], {}, []
        for rep in self.reports or ():
            ledger += rep["ledger"]
            boards.update(rep["boards"])
            failures += rep["failures"]
        missing = self.slices - len(self.reports or ())
        if missing:
            failures.append(f"{missing} slice(s) returned nothing")
        return ledger, boards, failures

    def _fault_rows(self):
        rows = [r.as_dict() for r in self.records]
        for rep in self.reports or ():
            for r in rep["faults"]:
                if r["kind"] in BOARD_FAULTS and isinstance(r["target"], str):
                    rows.append(dict(r, slice=rep["slice"]))
                elif r["kind"] == "broker_restart":  # the slice's hold, beside the driver's restart
                    rows.append(dict(r, slice=rep["slice"], target=f"broker (held by slice {rep['slice']})"))
        return sorted(rows, key=lambda r: r["ts"])

    def _summary_extra(self):
        return {"spread": {"master": self.spark.sparkContext.master, "slices": [
            {"slice": rep["slice"], "host": rep["host"], "boards": [rep["lo"], rep["hi"] - 1],
             "workdir": rep["workdir"], "elapsed_s": rep["elapsed"]} for rep in self.reports or ()]}}


def spark_session(master: str, confs: dict | None = None, jvm_log: str | None = None):
    """The driver's session: the workers run this interpreter, at the same path (see the module
    docstring)."""
    from ..pipeline.spark import build_session

    # PySpark names the executors' Python from PYSPARK_PYTHON when the context starts (the conf alone
    # is read by spark-submit only)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    return build_session("tern-fleet", master, {"spark.pyspark.python": sys.executable, **(confs or {})},
                         jvm_log=jvm_log)


def default_slices(spark) -> int:
    return max(1, spark.sparkContext.defaultParallelism)
