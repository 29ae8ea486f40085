"""The chaos proxy's faults: the directions, the rules a test arms (Rule), a rule's state within one
connection (Armed), and the checks that turn a bad argument into one clear ValueError."""

from __future__ import annotations

from dataclasses import dataclass

from tern.codec import packet_name

C2B = "c2b"
B2C = "b2c"
DIRECTIONS = (C2B, B2C)
BOTH = "both"
_TYPE_NAMES = {packet_name(t): t for t in range(1, 16)}


class ChaosError(RuntimeError):
    """The proxy could not start or was used wrongly."""


def check_direction(d: str, allow_both: bool = False) -> str:
    if d in DIRECTIONS or (allow_both and d == BOTH):
        return d
    allowed = ", ".join(repr(x) for x in DIRECTIONS + ((BOTH,) if allow_both else ()))
    raise ValueError(f"direction must be one of {allowed}, not {d!r}")


def directions(d: str) -> tuple[str, ...]:
    return DIRECTIONS if check_direction(d, True) == BOTH else (d,)


def check_ptype(t) -> int | None:
    if t is None:
        return None
    if isinstance(t, str) and t.upper() in _TYPE_NAMES:
        return _TYPE_NAMES[t.upper()]
    if isinstance(t, int) and not isinstance(t, bool) and 1 <= t <= 15:
        return t
    raise ValueError(f"packet type must be 1..15, a name such as 'PUBACK', or None for any, not {t!r}")


def check_positive_int(name: str, n, minimum: int = 1) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, not {n!r}")
    return n


def check_seconds(name: str, s) -> float:
    if not isinstance(s, (int, float)) or isinstance(s, bool) or not s >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {s!r}")
    return float(s)


def check_connections(n) -> int | None:
    return None if n is None else check_positive_int("connections", n)



@dataclass
class Rule:
    """A fault armed for later connections. Made by the ChaosProxy methods."""
    kind: str                      # "cut", "stall" or "refuse"
    direction: str | None = None   # direction whose traffic triggers it
    ptype: int | None = None       # packet trigger: type (None = any type)
    nth: int | None = None         # packet trigger: the n-th matching packet
    nbytes: int | None = None      # byte trigger: after this many bytes
    forward: bool = False          # packet trigger: forward the packet first?
    seconds: float = 0.0           # stall duration
    stall_direction: str = BOTH   # what a stall holds
    reset: bool = False            # cut with RST instead of FIN
    connections: int | None = None  # next k connections; None = all
    seed: int | None = None        # for rules chosen at random

    def describe(self) -> str:
        if self.kind == "refuse":
            return "refuse the connection"
        if self.nbytes is not None:
            trig = f"after {self.nbytes} bytes {self.direction}"
        else:
            what = packet_name(self.ptype) if self.ptype else "packet"
            trig = f"at {self.direction} {what} #{self.nth} ({'after' if self.forward else 'before'} forwarding it)"
        act = "cut" if self.kind == "cut" else f"stall {self.stall_direction} {self.seconds:g}s"
        return f"{act} {trig}"


class Armed:
    """A rule's state within one connection."""
    __slots__ = ("rule", "count", "fired")

    def __init__(self, rule: Rule):
        self.rule = rule
        self.count = 0
        self.fired = False
