"""Where each lost message was lost, which fault was in its way, and what rebooted each board: the
report's rules, in plain Python (no Spark: the report collects a bounded list of lost runs and the
few fault records, and judges them here).

Where: a lost message (in the ledger, never landed) that the observer -- a subscriber of its own on
the broker -- never saw was lost **on the device or before the broker**; one the observer saw was
lost **between the broker and the landing** (a collector killed holding it unwritten, a broker that
dropped it for a collector). Without the observer's copies the place is not known.

Which fault: the one whose span **overlapped the message's flight** -- from its send to its expected
landing -- and that could lose it there (a device's own power and network cuts and broker restarts
before the broker; collector kills and broker restarts after it). Not the latest fault before it: a
network cut that ended seconds before the message was sent was not in its way. The expected landing
is when the broker had it (the observer's copy; for a message the observer never saw, the first
copy it saw of a later message of the device: the device's link to the broker worked again) plus the
landing delay (the longest a landed copy waited between its receipt and its file's write: the
collectors' batch time, measured). With no later copy the flight lasts to the end of the run. When
no fault overlapped, the report says so.

Faults: every fault of the fault log is listed, whatever became of it (``injected``, ``armed`` ->
``fired``, ``armed-not-fired``, ``skipped``), and each has the spans in which it acted: from its
injection (or, armed at a flash operation, its firing) to its restoration, and for an arm the power
cycle that armed it (a reboot of its own, whether or not the cut then fired).

Reboots: each rise of a board's boot counter (between the last send of one boot and the first of the
next, in the ledger) is explained by the power-cut events that boot a board -- the power cycle of an
arm, and power back after a cut -- in that interval, or counted unexplained.
"""

from __future__ import annotations

DEVICE, PIPELINE, UNKNOWN = "device", "pipeline", "unknown"
WHERE_TEXT = {DEVICE: "on the device or before the broker (the observer never saw it)",
              PIPELINE: "between broker and landing (the observer saw it, the landing did not)",
              UNKNOWN: "not known (no observer copies)"}
NO_FAULT = "no fault overlapped its flight"
SHARED = ("broker_restart", "collector_kill")
# the faults that can lose a message at each place, most specific first (the one named when several overlap)
CAUSES = {DEVICE: ("power_cut", "network_cut", "broker_restart"),
          PIPELINE: ("collector_kill", "broker_restart"),
          UNKNOWN: ("power_cut", "collector_kill", "network_cut", "broker_restart")}
BOOT_TOLERANCE_S = 0.5  # a boot event this close outside a reboot's interval still explains it (clocks)


class FaultLogError(ValueError):
    """A line of a fault log that is not a fault record (``n``: its line number)."""

    def __init__(self, n: int):
        super().__init__(f"line {n}: not a fault record")
        self.n = n


def fault_log(records) -> list[dict]:
    """Every fault of a run's fault records (``faults.jsonl`` rows, in order), one dict each:
    ``index, kind, target, outcome, detail, start, end, spans, boots, boot_causes``. ``spans``: (start,
    end) in which it acted (end None: to the end of the run); ``boots``: the times it booted its board
    (an arm's power cycle, power back), ``boot_causes`` what each was. ``start``/``end``: from its first
    span (or first record) to the end of its last. Records without a wall time (``ts``) are left out."""
    faults: dict = {}
    for n, r in enumerate(records, 1):
        try:
            idx, status, ts = r["index"], r["status"], r.get("ts")
        except (KeyError, TypeError, AttributeError):
            raise FaultLogError(n) from None
        if ts is None:
            continue
        ts = float(ts)
        f = faults.setdefault(idx, {"index": idx, "kind": r.get("kind", "?"), "target": r.get("target", "?"),
                                    "statuses": [], "details": [], "spans": [], "boots": [], "boot_causes": {},
                                    "first": ts})
        f["statuses"].append(status)
        if r.get("detail"):
            f["details"].append(f"{status}: {r['detail']}")
        if status == "armed":
            f["spans"].append([ts, ts])  # the power cycle that arms the cut
            f["boots"].append(ts)
            f["boot_causes"][ts] = "the power cycle that armed it"
        elif status in ("injected", "fired"):
            f["spans"].append([ts, None])
        elif status == "restored":
            open_ = [s for s in f["spans"] if s[1] is None]
            if open_:
                open_[-1][1] = ts
            if f["kind"] == "power_cut":
                f["boots"].append(ts)
                f["boot_causes"][ts] = "power back"
    out = []
    for f in faults.values():
        st = f.pop("statuses")
        if "skipped" in st:
            outcome = "skipped"
        elif "armed" in st and "fired" not in st:
            outcome = "armed-not-fired"
        else:
            outcome = " -> ".join(dict.fromkeys(st))
        spans = [tuple(s) for s in f["spans"]]
        start = spans[0][0] if spans else f["first"]  # from its first span to the end of its last
        end = None if any(b is None for _, b in spans) else max((b for _, b in spans), default=start)
        out.append(dict(f, outcome=outcome, spans=spans, start=start, end=end,
                        detail="; ".join(f.pop("details"))))
    return sorted(out, key=lambda f: (f["start"], f["index"]))


def overlaps(flight: tuple, span: tuple) -> bool:
    """Whether a fault's span ``(start, end)`` and a flight ``(start, end)`` share a moment (an end
    None lasts to the end of the run, a start None from its beginning)."""
    inf = float("inf")
    return span[0] <= (flight[1] if flight[1] is not None else inf) and \
        (span[1] if span[1] is not None else inf) >= (flight[0] if flight[0] is not None else -inf)


def can_lose(fault: dict, device: str, where: str) -> bool:
    """Whether ``fault`` could lose a message of ``device`` at ``where``."""
    if fault["kind"] not in CAUSES[where]:
        return False
    return fault["kind"] in SHARED or fault["target"] == device


def blame(device: str, where: str, flight: tuple, faults: list[dict]) -> dict | None:
    """The fault named for a loss: among those that could lose it there and acted during its flight,
    the most specific kind (CAUSES order), then the one that started latest. None: no fault overlapped."""
    best, key = None, None
    for f in faults:
        if not can_lose(f, device, where):
            continue
        for span in f["spans"]:
            if overlaps(flight, span):
                k = (CAUSES[where].index(f["kind"]), -span[0])
                if key is None or k < key:
                    best, key = f, k
    return best


def flight(sent: float, reached_broker: float | None, delay: float) -> tuple:
    """A lost message's flight: from its send to its expected landing, ``reached_broker`` (when the
    broker had it, or had the device's next message) plus the landing ``delay``; open (None) when
    nothing shows the broker had it or anything after it."""
    if reached_broker is None:
        return (sent, None)
    return (sent, (reached_broker if sent is None else max(reached_broker, sent)) + delay)


def explain_reboots(windows: dict, faults: list[dict]) -> list[dict]:
    """Each rise of each device's boot counter, explained. ``windows``: device -> [(boot, first send,
    last send)] in boot order. Rows: ``device, from_boot, to_boot, after, before, reboots,
    explained_by`` (the faults whose boot events fall in ``[after, before]``, each used once),
    ``events`` (what each was, as text) and
    ``unexplained`` (reboots no fault accounts for)."""
    rows = []
    for device in sorted(windows):
        events = sorted((t, f["index"]) for f in faults if f["kind"] == "power_cut" and f["target"] == device
                        for t in f["boots"])
        used = set()
        seq = sorted(windows[device])
        for (b0, _, last), (b1, first, _) in zip(seq, seq[1:]):
            n = b1 - b0
            hits = [(t, i) for t, i in events if (t, i) not in used
                    and last - BOOT_TOLERANCE_S <= t <= first + BOOT_TOLERANCE_S][:n]
            used.update(hits)
            by = {f["index"]: f for f in faults}
            rows.append({"device": device, "from_boot": b0, "to_boot": b1, "after": last, "before": first,
                         "reboots": n, "explained_by": [by[i] for _, i in hits],
                         "events": [f"#{i} {by[i]['kind']}: {by[i]['boot_causes'].get(t, 'boot')}" for t, i in hits],
                         "unexplained": n - len(hits)})
    return rows
