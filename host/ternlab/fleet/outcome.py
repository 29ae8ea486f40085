"""A fleet run's outcome: each board's console checked (crashes, tracebacks, boot counters,
sequence numbers), the delivery judged by the one rule (pipeline/judge.py) against the observer's
copies and the landing, and the output files written. Apart from the runner (fleet/runner.py), which
only drives the run."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict

from ..app_events import write_ledger
from ..pipeline.judge import KEY, tally, verdict
from .parts import FleetResult


def check_slots(fleet) -> tuple[list, dict, list]:
    """This process's boards: their ledger rows, counters, and what their consoles say went wrong
    (crashes, tracebacks, power lost without a fault, boot counters and sequence numbers)."""
    ledger, boards, failures = [], {}, []
    for s in fleet.slots:
        t = s.tlog
        if t is None:
            failures.append(f"{s.name}: never started")
            continue
        ledger += t.ledger
        failures += s.unexpected
        failures += [f"{s.name}: {e}" for e in t.errors]
        for e in t.of("crash"):
            failures.append(f"{s.name}: the app crashed: {e.get('err')}")
        if any("Traceback" in x for x in s.board.log.texts()):
            failures.append(f"{s.name}: a traceback on the console (see boards/{s.name}/console.log)")
        if not t.ledger:
            failures.append(f"{s.name}: published nothing" + ("" if t.boots else
                            " (its app never started: no boot line on boards/%s/console.log)" % s.name))
        boots = t.boots
        if boots != sorted(set(boots)):
            failures.append(f"{s.name}: boot counter not increasing: {boots}")
        streams = defaultdict(list)
        for r in t.ledger:
            streams[(r["boot"], r["qos"])].append(r["seq"])
        for (boot, q), seqs in sorted(streams.items()):
            if seqs != list(range(len(seqs))):
                failures.append(f"{s.name}: boot {boot} QoS {q}: sequence numbers are not 0..n-1: {seqs[:12]}")
        boards[s.name] = {"boots": len(boots), "published": len(t.ledger), "acked": len(t.acked),
                          "power_cuts": s.power_cuts, "network_cuts": s.network_cuts,
                          "recovered": t.recovered(), "torn_lines": t.torn}
    return ledger, boards, failures

def judge(fleet, elapsed: float) -> FleetResult:
    """The run's verdict and its output files (ledger, faults, received, summary)."""
    failures = [fleet.observer_trouble] if fleet.observer_trouble else []
    seen = Counter(k[:4] for k in (fleet.observer.copies() if fleet.observer else []))
    ledger, boards, more = fleet._board_results()
    failures += more
    # without an observer (a slice of a spread fleet) the driver's observer judges the losses
    # the observer's copies: what reached the broker's subscribers (its duplicates are the broker's
    # and the devices' doing, counted in the summary; the landing is where exactly once is judged)
    lost, per_qos = tally(ledger, seen) if fleet.observer is not None else ([], {})
    per_board = Counter(r["device"] for r in lost)
    for name, b in boards.items():
        b["received"] = fleet.observer.received(name) if fleet.observer else None
        b["lost"] = per_board[name]
        # what of it landed, from the fleet's one read of the landing (tern demo uses it, not a read of its own)
        b["landed"] = fleet.landing.by_device[name] if fleet.landing is not None else None

    def examples(rows):
        return f"e.g. {[(r['device'], r['boot'], r['qos'], r['seq']) for r in rows[:5]]}"

    for why in verdict({q: {"lost": c["lost"]} for q, c in per_qos.items()})["reasons"] if fleet.observer else ():
        failures.append(f"observer: {why} (accepted, never reached the broker's subscriber), {examples(lost)}")
    dups = Counter({q: c["duplicated"] for q, c in per_qos.items() if c["duplicated"]})
    landing = None
    if fleet.landing is not None:
        unlanded, landed = tally(ledger, fleet.landing.copies)
        ldups = {q: c["duplicated"] for q, c in landed.items() if c["duplicated"]}
        landing = {"rows": fleet.landing.rows, "unique": len(fleet.landing.copies), "files": fleet.landing.files(),
                   "lost": len(unlanded), "duplicates": {str(q): n for q, n in sorted(ldups.items())},
                   "collectors": {c.proc.id: dict(c.proc.stats(), landed=fleet.landing.by_collector[c.proc.id])
                                  for c in fleet.collectors}}
        for c in fleet.collectors:
            failures += c.unexpected
        for why in verdict(landed)["reasons"]:
            twice = [dict(zip(KEY, k))
                     for k, n in fleet.landing.copies.items() if n > 1 and k[2] == 2]
            failures.append(f"landing: {why}, {examples(unlanded if 'lost' in why else twice)}")
    fleet.out.mkdir(parents=True, exist_ok=True)
    write_ledger(ledger, fleet.out / "ledger.jsonl")
    with open(fleet.out / "faults.jsonl", "w") as f:
        for r in fleet._fault_rows():
            f.write(json.dumps(r) + "\n")
    with open(fleet.out / "received.jsonl", "w") as f:
        for d, b, q, sq, topic, ts in (fleet.observer.copies() if fleet.observer else []):
            f.write(json.dumps({"device": d, "boot": b, "seq": sq, "qos": q, "topic": topic, "recv_ts": ts}) + "\n")
    for s in fleet.slots:
        if s.proxy is not None:
            s.proxy.write_log(fleet.out / "boards" / s.name / "packets.jsonl", events=True)
    summary = {"scenario": fleet.scenario.name, "source": fleet.scenario.source, "seed": fleet.seed,
               "boards": boards, "ledger_rows": len(ledger), "lost": len(lost),
               "duplicates": {str(q): n for q, n in dups.items()}, "failures": failures,
               "replay": fleet.replay, "elapsed_s": round(elapsed, 2),
               "relays": any(s.proxy is not None for s in fleet.slots),
               # packets.jsonl times are time.monotonic(): this offset puts them on the wall clock
               "wall_minus_monotonic": time.time() - time.monotonic(),
               "schedule": [f.as_dict() for f in fleet.schedule], "landing": landing,
               "broker": (f"external {fleet.external.name}" + (f" ({fleet.tls.describe()})" if fleet.tls else "")
                          if fleet.external is not None
                          else f"own Mosquitto on {fleet.broker.host}:{fleet.broker.port}" if fleet.broker else None),
               "skipped_faults": [r for r in fleet._fault_rows() if r["status"] == "skipped"],
               **fleet._summary_extra()}
    (fleet.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return FleetResult(ok=not failures, seed=fleet.seed, failures=failures, replay=fleet.replay, out=fleet.out,
                       boards=boards, ledger_rows=len(ledger), lost=lost, duplicates=dups,
                       faults=fleet._fault_rows(), elapsed=elapsed, summary=summary,
                       landing=landing)
