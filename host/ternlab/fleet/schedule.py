"""The fault schedule: every fault a fleet run injects (when, which kind, which target, with what
parameters) drawn from the scenario and the seed before the run starts.

Why drawn up front: a failing run is replayed from its seed alone, so the schedule must be a pure
function of (scenario, seed, boards, duration) -- no clock, no hash randomisation, no dependence on how
fast the boards ran. Each ``[[faults]]`` entry gets its own `random.Random` (seeded by a string, which
CPython hashes with SHA-512, stable across processes), so adding an entry does not move the faults of
the others. What a fault does when it meets a running board (a flash-op cut fires only when the board
reaches that operation) is up to the runner; the schedule only says what was asked for.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .scenario import Scenario, ScenarioError


def collector_id(index: int) -> str:
    """The id of the collector a ``collector_kill`` targets by index: the one name the schedule, the
    fault records and the collectors' logs use."""
    return f"collector-{index + 1}"


@dataclass(frozen=True)
class Fault:
    """One scheduled fault. t: seconds after the fleet started; target: board index (None: the broker;
    for collector_kill: the collector's index).

    params: power_cut -> {"at": "flash_op"|"time", "flash_op": N (flash_op only), "off": seconds};
    network_cut -> {"length": seconds}; broker_restart -> {"hard": bool}; collector_kill -> {"down": seconds}.
    """
    index: int
    t: float
    kind: str
    target: int | None
    params: dict = field(default_factory=dict)

    def describe(self, board_names=None) -> str:
        who = "broker" if self.target is None else collector_id(self.target) if self.kind == "collector_kill" \
            else (board_names[self.target] if board_names else f"board {self.target}")
        p = self.params
        if self.kind == "power_cut":
            how = (f"at its flash operation +{p['flash_op']}" if p["at"] == "flash_op" else "now")
            what = f"power cut {who} {how}, off {p['off']:.2f} s"
        elif self.kind == "network_cut":
            what = f"network cut {who} for {p['length']:.2f} s"
        elif self.kind == "collector_kill":
            what = f"SIGKILL {who}, restarted after {p['down']:.2f} s"
        else:
            what = f"broker restart ({'hard, SIGKILL' if p['hard'] else 'soft, SIGTERM'})"
        return f"t={self.t:7.2f}s #{self.index} {what}"

    def as_dict(self) -> dict:
        return {"index": self.index, "t": self.t, "kind": self.kind, "target": self.target, **self.params}


def check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ScenarioError(f"seed must be a non-negative integer, not {seed!r}")
    return seed


def _uniform(rng, lo_hi):
    lo, hi = lo_hi
    return lo if lo == hi else rng.uniform(lo, hi)


def make_schedule(scenario: Scenario, seed: int) -> list[Fault]:
    """The faults of one run, in time order. Same scenario + same seed -> the same list."""
    check_seed(seed)
    drawn = []
    for i, spec in enumerate(scenario.faults):
        rng = random.Random(f"tern-fleet/{seed}/{i}/{spec.kind}")
        lo, hi = spec.window if spec.window is not None else (scenario.fault_start, scenario.duration)
        hi = min(hi, scenario.duration)
        # per_board: `count` faults for each board in turn; else `count` faults, each on a random target
        targets = [b for b in range(scenario.boards) for _ in range(spec.count)] if spec.per_board \
            else [None] * spec.count
        for fixed in targets:
            t = round(_uniform(rng, (lo, hi)), 3)
            if spec.kind == "power_cut":
                at = spec.at if spec.at != "either" else rng.choice(("flash_op", "time"))
                params = {"at": at}
                if at == "flash_op":
                    params["flash_op"] = rng.randint(*spec.flash_ops)
                params["off"] = round(_uniform(rng, spec.off), 3)
                target = rng.randrange(scenario.boards) if fixed is None else fixed
            elif spec.kind == "network_cut":
                params = {"length": round(_uniform(rng, spec.length), 3)}
                target = rng.randrange(scenario.boards) if fixed is None else fixed
            elif spec.kind == "collector_kill":
                params = {"down": round(_uniform(rng, spec.down), 3)}
                target = rng.randrange(scenario.collectors.count)
            else:
                mode = spec.mode if spec.mode != "either" else rng.choice(("hard", "soft"))
                params = {"hard": mode == "hard"}
                target = None
            drawn.append((t, i, target, spec.kind, params))
    drawn.sort(key=lambda d: (d[0], d[1]))
    return [Fault(n, t, kind, target, params) for n, (t, _, target, kind, params) in enumerate(drawn)]
