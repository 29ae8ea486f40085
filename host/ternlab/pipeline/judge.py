"""The one judge of delivery: what a message is (its key), how the landing set is read back without
Spark, and the rule that says whether a run kept Tern's promise. The Spark audit, ``tern fleet run``
(its observer's copies and its landing) and ``tern demo`` all judge with it; plain Python, no Spark.

A *message* is one ``(device, boot, qos, seq)``: a device's stream is ``(device, boot, qos)``, its
messages numbered by ``seq``. A *copy* is one landing row (or one copy a subscriber received).

The rule (:func:`verdict`) fails when any QoS >= 1 message is lost (accepted by ``publish()``, never
delivered) or any QoS 2 message is duplicated (delivered, or landed, more than once). QoS 0 may be
lost, QoS 1 duplicated (at least once). Reorderings are counted and listed (per subscriber stream, see
:func:`.audit.messages`) but do not fail it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

KEY = ("device", "boot", "qos", "seq")  # a message; the audit's Spark columns in the same order
STREAM = KEY[:3]                        # one device's numbered messages of one boot and QoS


def message_key(row: dict) -> tuple:
    """The key of a ledger or landing row (a dict with the KEY fields)."""
    return tuple(row[k] for k in KEY)


def verdict(per_qos: dict) -> dict:
    """``{"ok": bool, "reasons": [...]}`` from per-QoS counts ``{qos: {"lost": n, "duplicated": n}}``
    (QoS as int or string; a missing count is 0)."""
    reasons = []
    for q, row in sorted(per_qos.items(), key=lambda kv: int(kv[0])):
        lost, dup = int(row.get("lost") or 0), int(row.get("duplicated") or 0)
        if int(q) >= 1 and lost > 0:
            reasons.append(f"QoS {q}: {lost} message(s) lost")
        if int(q) == 2 and dup > 0:
            reasons.append(f"QoS {q}: {dup} message(s) duplicated")
    return {"ok": not reasons, "reasons": reasons}


def tally(ledger: list, copies: Counter) -> tuple[list, dict]:
    """The QoS >= 1 ledger messages with no copy in ``copies`` (message key -> copies), and the
    per-QoS counts :func:`verdict` takes: ``{qos: {"lost": n, "duplicated": n}}``.

    The one definition, the Spark audit's too (audit.audit_frame; tests/host/test_judge_spark.py
    holds them to the same counts): *lost* = messages of the ledger (one per key, however many rows
    name it) with no copy; *duplicated* = copies past the first, of every message in ``copies``
    (the ledger's or not)."""
    seen = set()
    lost = []
    for r in ledger:
        if r["qos"]:
            key = message_key(r)
            if key not in copies and key not in seen:
                lost.append(r)
            seen.add(key)
    per_qos: dict = {}
    for r in lost:
        per_qos.setdefault(r["qos"], {"lost": 0, "duplicated": 0})["lost"] += 1
    for key, n in copies.items():
        if n > 1:
            per_qos.setdefault(key[2], {"lost": 0, "duplicated": 0})["duplicated"] += n - 1
    return lost, per_qos


class LandingIndex:
    """What the collectors have landed so far: the copies of each message and of each collector.

    ``refresh()`` reads only files it has not read before: a landing file appears atomically (a
    temporary name, then a rename, see :mod:`.landing`), so a visible ``part-*.parquet`` is complete
    and is read once. Needs pyarrow (the pipeline extra)."""

    COLUMNS = [*KEY, "collector"]

    def __init__(self, root: Path):
        self.root = Path(root)
        self.copies: Counter = Counter()       # message key -> copies landed
        self.by_collector: Counter = Counter()
        self.by_device: Counter = Counter()    # distinct messages per device
        self.rows = 0
        self._read: set[str] = set()

    def refresh(self) -> int:
        """Read new landing files; returns how many rows they held."""
        import pyarrow.parquet as pq

        new = 0
        for path in sorted(self.root.glob("date=*/hour=*/part-*.parquet")):
            name = str(path)
            if name in self._read:
                continue
            t = pq.read_table(path, columns=self.COLUMNS).to_pydict()
            self._read.add(name)
            for *key, c in zip(*(t[k] for k in self.COLUMNS)):
                key = tuple(key)
                if key not in self.copies:
                    self.by_device[key[0]] += 1
                self.copies[key] += 1
                self.by_collector[c] += 1
            new += len(t["device"])
        self.rows += new
        return new

    def has(self, key) -> bool:
        return key in self.copies

    def files(self) -> int:
        return len(self._read)
