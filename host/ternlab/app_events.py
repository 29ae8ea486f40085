"""The telemetry app's console, read on the host: events, the ledger, counts.

The telemetry app (firmware/app/telemetry.py, firmware/app/hal.py) prints one line per event: ``PREFIX`` and a
JSON object with an ``ev`` key. This module is the host's only knowledge of that format, so the
harness, the fleet runner and the tests import it rather than the app's internals.

The ledger -- what a device says it published, one row per message, in the pipeline's ledger
columns (``device, boot, seq, qos, topic, sent_ts``, see pipeline/schema.py) -- comes from the
``published`` events. The app prints one only after ``publish()`` returned, i.e. once a QoS 1/2
message is durable in the outbox, so every ledger row at QoS >= 1 is a promise the delivery audit can
hold it to. A power cut can cost the line of a message that was already stored (it is then delivered
but not in the ledger); it never puts a row in the ledger for a message that was not stored.

A power cut can also tear a line: the board's next output then continues on the same line. The
parser splits a line at every prefix and keeps each part that is a whole JSON object; the rest is
counted in ``torn``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from .pipeline.schema import LEDGER_FIELDS, parse_payload

PREFIX = "TERN "  # firmware/app/hal.py PREFIX


def parse_line(line: str) -> tuple[list[dict], int]:
    """The events in one console line, and how many prefixed fragments were not whole JSON objects."""
    events, torn = [], 0
    parts = line.split(PREFIX)
    for part in parts[1:]:
        part = part.strip()
        try:
            obj = json.loads(part)
        except ValueError:
            torn += 1
            continue
        if isinstance(obj, dict) and isinstance(obj.get("ev"), str):
            events.append(obj)
        else:
            torn += 1
    return events, torn


def ledger_row(event: dict) -> dict:
    """The ledger row of one ``published`` event; ValueError if its payload breaks the schema."""
    m = parse_payload(json.dumps(event["m"]).encode())
    row = dict(m, topic=event["topic"])
    return {k: row[k] for k in LEDGER_FIELDS}


class TelemetryLog:
    """Events of one board's console, in order, with what the harness asks of them.

    feed() takes lines as they come (text, without the host's timestamp). ``ledger`` holds a row per
    published message; ``counts`` counts events by kind; ``pending`` maps the packet ids of QoS >= 1
    messages published and not yet acknowledged to their ledger rows (packet ids are unique among
    pending messages, across reboots too, since the outbox keeps them).
    """

    def __init__(self):
        self.events: list[dict] = []
        self.ledger: list[dict] = []
        self.counts: Counter = Counter()
        self.pending: dict[int, dict] = {}
        self.acked: list[dict] = []
        self.torn = 0
        self.errors: list[str] = []

    def feed(self, line: str) -> list[dict]:
        evs, torn = parse_line(line)
        self.torn += torn
        for e in evs:
            self._event(e)
        return evs

    def feed_text(self, text: str) -> "TelemetryLog":
        for line in text.splitlines():
            self.feed(line)
        return self

    def _event(self, e: dict) -> None:
        kind = e["ev"]
        self.events.append(e)
        self.counts[kind] += 1
        if kind == "published":
            try:
                row = ledger_row(e)
            except (KeyError, ValueError) as err:
                self.errors.append(f"bad published line {e!r}: {err}")
                return
            self.ledger.append(row)
            if row["qos"] and e.get("p"):
                self.pending[e["p"]] = row
        elif kind == "acked":
            row = self.pending.pop(e.get("p"), None)
            if row is not None:
                self.acked.append(row)

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["ev"] == kind]

    @property
    def boots(self) -> list[int]:
        return [e["b"] for e in self.of("boot")]

    def recovered(self) -> int:
        """Messages the outbox gave back at boot, over all boots."""
        return sum(e.get("recovered", 0) for e in self.of("boot"))


def write_ledger(rows, path: str | Path) -> Path:
    """The ledger as JSON lines (one object per message), the format `tern audit --ledger` reads."""
    path = Path(path)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps({k: r[k] for k in LEDGER_FIELDS}) + "\n")
    return path
