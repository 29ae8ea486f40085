"""The chaos proxy's packet log: a record of every packet forwarded in full and of every event
(connections, cuts, stalls, framing errors), kept under one lock, filtered and written as JSON lines."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tern.codec import packet_name
from tern.wire import (
    MQTTError, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, get_varint,
    varint_size,
)

from .rules import check_direction, check_ptype

_PID_TYPES = (PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK)


@dataclass(frozen=True)
class PacketRecord:
    """One packet the proxy forwarded in full."""
    t: float            # time.monotonic() just before its last byte went to the kernel
    conn: int           # connection number, from 1
    direction: str      # "c2b" or "b2c"
    type: str           # "CONNECT", "PUBACK", ...
    length: int         # bytes on the wire, fixed header included
    pid: int | None     # packet identifier, for packet types that carry one

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Event:
    """Something the proxy did or saw besides forwarding: accept, cut, stall, close."""
    t: float
    conn: int
    kind: str
    detail: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"t": self.t, "conn": self.conn, "event": self.kind, **self.detail}


def packet_id(frame: bytes) -> int | None:
    """The packet identifier of a whole frame, or None if its type has none."""
    try:
        t = frame[0] >> 4
        rl = get_varint(frame, 1, len(frame))
        if rl < 0:
            return None
        pos = 1 + varint_size(rl)
        if t == PUBLISH:
            if not (frame[0] >> 1) & 3:
                return None
            pos += 2 + (frame[pos] << 8 | frame[pos + 1])
        elif t not in _PID_TYPES:
            return None
        if pos + 2 > len(frame):
            return None
        return frame[pos] << 8 | frame[pos + 1]
    except (IndexError, MQTTError):
        return None



class PacketLog:
    """The records of one proxy; its connections add to them (note, record, unrecord)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._log: list[PacketRecord] = []
        self._events: list[Event] = []

    def note(self, cid: int, kind: str, **detail) -> None:
        with self._lock:
            self._events.append(Event(time.monotonic(), cid, kind, detail))

    def record(self, cid: int, d: str, ptype: int, length: int, pid: int | None) -> PacketRecord:
        rec = PacketRecord(time.monotonic(), cid, d, packet_name(ptype), length, pid)
        with self._lock:
            self._log.append(rec)
        return rec

    def unrecord(self, rec: PacketRecord) -> None:
        with self._lock:
            try:
                self._log.remove(rec)
            except ValueError:
                pass

    @property
    def log(self) -> list[PacketRecord]:
        """Every packet forwarded so far, in forwarding order (a copy)."""
        with self._lock:
            return list(self._log)

    @property
    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def packets(self, direction: str | None = None, type=None, conn: int | None = None) -> list[PacketRecord]:
        """The log filtered by direction, packet type and connection number."""
        if direction is not None:
            check_direction(direction)
        t = packet_name(check_ptype(type)) if type is not None else None
        return [r for r in self.log
                if (direction is None or r.direction == direction)
                and (t is None or r.type == t) and (conn is None or r.conn == conn)]

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()
            self._events.clear()

    def write_log(self, path: str | os.PathLike, events: bool = False) -> Path:
        """The packet log as JSON lines (one object per packet; with events=True
        the events too, each with an "event" key), in time order."""
        items = [r.as_dict() for r in self.log]
        if events:
            items += [e.as_dict() for e in self.events]
            items.sort(key=lambda x: x["t"])
        path = Path(path)
        with open(path, "w") as f:
            for obj in items:
                f.write(json.dumps(obj) + "\n")
        return path
