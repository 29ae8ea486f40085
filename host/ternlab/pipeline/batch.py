"""The messages a collector holds and has not yet made durable, as the column lists the landing writer
takes (:meth:`.landing.LandingWriter.commit`): one batch per connection, and the orphans of earlier
connections (see :mod:`.collect`)."""

from __future__ import annotations

import time

from . import schema


class Batch:
    """Messages received and not yet durable, in arrival order, as column lists (``_idx``: arrival
    number, which names the files; ``_raw``: each landing row's payload, to recognise a resend;
    ``_q2``: ``(packet id, identity)`` of a message delivered at QoS 2, None otherwise, for the landing
    record; ``_win``: a landing row's window identity, or None)."""

    def __init__(self):
        self.rows = {n: [] for n in (*schema.LANDING_FIELDS, "_raw", "_q2", "_win")}
        self.rows["_idx"] = self.rows["recv_idx"]
        self.quarantine = {n: [] for n in (*schema.QUARANTINE_FIELDS, "_idx", "_q2")}
        self.acks = []         # ack_id per QoS 1/2 message, arrival order
        self.count = 0         # messages (landing + quarantine)
        self.nbytes = 0        # payload bytes
        self.first_at = None   # monotonic time of the oldest message's first arrival
        self.orphaned_at = None  # when the oldest of them was first orphaned (a reconnect), or None

    def add(self, row: dict, quarantined: bool, ack_id=None) -> None:
        """Append one message (``row``: a value for every column of its table)."""
        cols = self.quarantine if quarantined else self.rows
        for k, v in cols.items():
            if cols is not self.rows or k != "_idx":
                v.append(row[k])
        if ack_id is not None:
            self.acks.append(ack_id)
        self.count += 1
        raw = row["payload_raw"] if quarantined else row["_raw"]
        self.nbytes += len(raw)
        if self.first_at is None:
            self.first_at = time.monotonic()

    def keys(self) -> dict:
        """``{(topic, payload): copies}`` of what the batch holds."""
        out: dict = {}
        for k in zip(self.rows["topic"], self.rows["_raw"]):
            out[k] = out.get(k, 0) + 1
        for k in zip(self.quarantine["topic"], self.quarantine["payload_raw"]):
            out[k] = out.get(k, 0) + 1
        return out

    def _delete(self, cols: dict, i: int) -> None:
        for k, v in cols.items():
            if cols is not self.rows or k != "_idx":
                del v[i]

    def remove(self, topic: str, raw: bytes) -> None:
        """Drop the first message with this topic and payload."""
        for cols, rawcol in ((self.rows, "_raw"), (self.quarantine, "payload_raw")):
            for i, (t, r) in enumerate(zip(cols["topic"], cols[rawcol])):
                if t == topic and r == raw:
                    self._delete(cols, i)
                    self.count -= 1
                    self.nbytes -= len(raw)
                    return

    def to_quarantine(self, i: int, reason: str) -> dict:
        """Move landing row ``i`` to the quarantine columns (with ``reason``); returns the row."""
        row = {k: v[i] for k, v in self.rows.items()}
        self._delete(self.rows, i)
        q = self.quarantine
        at = next((j for j, x in enumerate(q["_idx"]) if x > row["recv_idx"]), len(q["_idx"]))
        new = {"payload_raw": row["_raw"], "reason": reason, "recv_ts": row["recv_ts"],
               "topic": row["topic"], "collector": row["collector"], "_idx": row["recv_idx"],
               "_q2": row["_q2"]}
        for k, v in q.items():
            v.insert(at, new[k])
        return row

    def merged(self, later: "Batch") -> tuple[dict, dict]:
        """Columns of this batch followed by ``later``'s (arrival order is kept)."""
        return ({k: v + later.rows[k] for k, v in self.rows.items()},
                {k: v + later.quarantine[k] for k, v in self.quarantine.items()})


def clean(text: str, limit: int = 500) -> str:
    """A reason as a quarantine row and a log line can hold it: valid UTF-8 (a lone surrogate as
    its escape), one line, at most ``limit`` characters."""
    text = " ".join(text.encode("utf-8", "backslashreplace").decode("utf-8").split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
