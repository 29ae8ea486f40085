#!/usr/bin/env python3
"""How the boards of a fleet run came back after each broker restart: for every restart (its
`restored` record in faults.jsonl, written as the fleet let the links up again), the delay from
that moment to each board's first `connected` console line since the restart began, as
percentiles, and the most boards that connected within any 100 ms (the herd the broker met). A
board powered off or on meanwhile is left out (its next connection is a boot's, not the restart's).

    python tools/bench/reconnect_spread.py OUT        # OUT: a fleet run's --out folder
"""

import json
import sys
from datetime import datetime
from pathlib import Path


def _wall(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def connects(console: Path) -> list:
    """Wall-clock times of the board's `connected` events, and of its power events (a boot)."""
    out = []
    for line in console.read_text(errors="replace").splitlines():
        if '"ev":"connected"' in line:
            out.append((_wall(line.split()[0]), "connected"))
        elif "# power" in line:
            out.append((_wall(line.split()[0]), "power"))
    return out


def spread(run: Path) -> list:
    faults = [json.loads(x) for x in (run / "faults.jsonl").read_text().splitlines() if x.strip()]
    broker = [f for f in faults if f.get("target") == "broker" and f.get("status") in ("injected", "restored")]
    boards = {p.parent.name: connects(p) for p in sorted((run / "boards").glob("*/console.log"))}
    rows = []
    for i, f in enumerate(broker):
        if f["status"] != "restored" or not i or broker[i - 1]["status"] != "injected":
            continue
        t0 = f["ts"]  # written just after the links went up: a board may connect a moment before it
        delays = []
        for events in boards.values():
            nxt = next(((t, k) for t, k in events if t >= broker[i - 1]["ts"]), None)
            if nxt is not None and nxt[1] == "connected" and nxt[0] - t0 < 120:
                delays.append(nxt[0] - t0)
        delays.sort()
        if not delays:
            continue
        q = lambda p: round(delays[min(len(delays) - 1, int(p * len(delays)))], 3)  # noqa: E731
        j, herd = 0, 0
        for i, d in enumerate(delays):
            while delays[j] < d - 0.1:
                j += 1
            herd = max(herd, i - j + 1)
        rows.append({"t": round(f["t"], 1), "detail": f.get("detail", ""), "boards": len(delays),
                     "p10_s": q(0.1), "p50_s": q(0.5), "p90_s": q(0.9), "max_s": round(delays[-1], 3),
                     "most_in_100ms": herd})
    return rows


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not (Path(args[0]) / "faults.jsonl").is_file():
        print("usage: reconnect_spread.py OUT (a fleet run's output folder, with faults.jsonl)", file=sys.stderr)
        return 2
    for r in spread(Path(args[0])):
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
