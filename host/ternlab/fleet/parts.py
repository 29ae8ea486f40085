"""What a fleet run hands its callers, apart from the runner that makes it (fleet/runner.py): the
callbacks it reports through, a fault's record, its result, the broker it did not start, and the
short-lived client that sends the boards commands."""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .schedule import Fault


class Callbacks:
    """What a fleet reports while it runs; subclass and override what you need. All calls come from
    the thread that called Fleet.run(), one at a time.

    on_start(fleet)            boards named (fleet.board_names), schedule drawn (fleet.schedule)
    on_phase(name)             "starting", "running", "settling", "stopping", "done"
    on_fault(record)           a FaultRecord each time a fault is injected, fires, ends or is skipped
                               (collector_kill targets are collector ids)
    on_event(board, event)     every console event of a board's firmware (dict with "ev")
    on_tick(fleet)             about 10 times a second: poll fleet.progress() for counters
    on_end(result)             the FleetResult
    """

    def on_start(self, fleet): pass
    def on_phase(self, name): pass
    def on_fault(self, record): pass
    def on_event(self, board, event): pass
    def on_tick(self, fleet): pass
    def on_end(self, result): pass


@dataclass
class FaultRecord:
    """What happened to one scheduled fault. status: injected (done now), armed (a flash-op cut
    waiting for its operation), fired (an armed cut happened), restored (power or network back),
    skipped (the target was already off), unfired (an armed cut whose operation never came)."""
    fault: Fault
    t: float                    # seconds since the fleet started, when this happened
    status: str
    target: str                 # board name, "broker" or a collector id
    detail: str = ""
    ts: float = field(default_factory=time.time)  # wall clock, to line faults up with landing times

    def line(self) -> str:
        return f"t={self.t:7.2f}s fault #{self.fault.index} {self.fault.kind} {self.target}: {self.status}" + (
            f" ({self.detail})" if self.detail else "")

    def as_dict(self) -> dict:
        return {"t": round(self.t, 3), "index": self.fault.index, "kind": self.fault.kind,
                "target": self.target, "status": self.status, "detail": self.detail,
                "ts": round(self.ts, 3), "scheduled_t": self.fault.t, **self.fault.params}


class ExternalBroker:
    """A broker the fleet did not start (``tern fleet run --broker HOST:PORT``): its address, and what
    stands for a restart. The fleet's broker faults run ``hook`` (a shell command, with
    ``TERN_BROKER_FAULT`` = ``soft`` or ``hard`` and ``TERN_BROKER`` = ``HOST:PORT`` in its
    environment; it returns once the broker is back); without a hook they are skipped, and the fault
    log and the summary say so. Nothing else of the broker's is touched: no log, no stop."""

    log_path = None

    def __init__(self, host: str, port: int, hook: str | None = None, timeout: float = 120.0):
        self.host, self.port, self.hook, self.timeout = host, port, hook, timeout

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"

    def restart(self, hard: bool) -> str:
        env = dict(os.environ, TERN_BROKER_FAULT="hard" if hard else "soft", TERN_BROKER=self.name)
        r = subprocess.run(self.hook, shell=True, env=env, capture_output=True, text=True, timeout=self.timeout)
        if r.returncode != 0:
            raise RuntimeError(f"the broker fault hook {self.hook!r} failed (status {r.returncode}): "
                               f"{(r.stderr or r.stdout).strip()[-300:]}")
        return "the hook returned (status 0)"

    def stop(self) -> None:
        pass


@dataclass
class FleetResult:
    ok: bool
    seed: int
    failures: list[str]
    replay: str | None
    out: Path
    boards: dict                # name -> counters
    ledger_rows: int
    lost: list[dict]            # QoS >= 1 ledger rows never received
    duplicates: Counter         # qos -> extra copies received
    faults: list[dict]
    elapsed: float
    summary: dict = field(default_factory=dict)
    landing: dict | None = None  # with collectors: rows, unique, lost, duplicates, per collector


def send_commands(addr, messages, timeout=10.0, login=None, name="fleet-commander"):
    """Publish [(topic, payload)] at QoS 2 from a short-lived client and wait for each to complete."""
    from tern.client import Client

    c = Client(name, server=addr[0], port=addr[1], version=5, **(login.client_kwargs() if login else {}))
    c.connect()
    try:
        for topic, payload in messages:
            c.wait_published(c.publish(topic, payload, qos=2), timeout=timeout)
    finally:
        c.disconnect()
