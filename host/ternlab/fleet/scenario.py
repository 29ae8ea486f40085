"""Fleet scenarios: a small TOML file that says how many boards run, for how long, with what firmware
settings and which faults, validated into a `Scenario` before anything starts.

Why a strict reader: a scenario is run unattended (CI, a demo, a 1,000-board spread), so a typo such as
``lenght = 2`` must stop the run at once with one line naming the key, not silently fall back to a
default and "pass". Every key is known here; an unknown key, a wrong type or a value out of range raises
`ScenarioError` whose message names the file and the key (``faults[2].length``).

Format (all keys but ``duration`` optional)::

    name = "smoke"                 # default: the file's stem
    description = "one line"
    boards = 2                     # how many emulated boards
    profile = "unix-emulated"      # board profile (boards/<name>/profile.json)
    duration = 20.0                # seconds of telemetry under faults
    warmup = 2.0                   # no fault before this many seconds (default: 2 s or duration/5)
    settle = 20.0                  # at most this long after `duration` for pending messages to drain

    [broker]
    persistence = true             # Mosquitto keeps sessions across restarts
    log_packets = false            # its log: connections and subscriptions (true: every packet too)

    [firmware]                     # merged into every board's config.json (see firmware/app/)
    interval_ms = 200
    qos = 1

    [[faults]]
    kind = "power_cut"             # power_cut | network_cut | broker_restart
    count = 2
    at = "either"                  # power_cut: "flash_op" | "time" | "either"
    flash_ops = [1, 200]           # power_cut: the N-th flash operation after arming, N drawn in range
    off = [0.2, 1.0]               # power_cut: seconds without power
    window = [2.0, 18.0]           # when faults of this entry may happen (default [warmup, duration])

    [[faults]]
    kind = "network_cut"
    count = 1
    length = [1.0, 3.0]            # seconds the board's network stays down

    [[faults]]
    kind = "broker_restart"
    count = 1
    mode = "either"                # "hard" (SIGKILL) | "soft" (SIGTERM) | "either"

    [collectors]                   # `tern collect` processes on one shared subscription (default: none)
    count = 2
    group = "tern"                 # the shared subscription's group
    batch_time = 1.0               # their --batch-time (seconds)

    [[faults]]
    kind = "collector_kill"        # SIGKILL a collector (mid-batch), restart it with the same id
    count = 1
    down = [1.0, 3.0]              # seconds before it is restarted

``per_board = true`` (power_cut, network_cut) makes ``count`` faults for *each* board instead of
``count`` faults on boards drawn at random.

Ranges are ``[low, high]`` (or one number for a fixed value); the schedule draws from them with the
run's seed (see `ternlab.fleet.schedule`).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

FAULT_KINDS = ("power_cut", "network_cut", "broker_restart", "collector_kill")
CUT_AT = ("flash_op", "time", "either")
RESTART_MODES = ("hard", "soft", "either")
MAX_BOARDS = 4096
MAX_COLLECTORS = 16


class ScenarioError(ValueError):
    """A scenario file or value is wrong; the message names the file and the key."""


@dataclass(frozen=True)
class FaultSpec:
    """One ``[[faults]]`` entry: `count` faults of `kind`, parameters as (low, high) ranges."""
    kind: str
    count: int = 1
    window: tuple[float, float] | None = None
    at: str = "either"
    flash_ops: tuple[int, int] = (1, 200)
    off: tuple[float, float] = (0.2, 1.0)
    length: tuple[float, float] = (1.0, 3.0)
    mode: str = "either"
    down: tuple[float, float] = (1.0, 3.0)
    per_board: bool = False


@dataclass(frozen=True)
class Collectors:
    """The ``[collectors]`` table: how many ``tern collect`` processes land the telemetry."""
    count: int = 0
    group: str = "tern"
    batch_time: float = 1.0


@dataclass(frozen=True)
class Scenario:
    name: str
    duration: float
    description: str = ""
    boards: int = 2
    profile: str = "unix-emulated"
    warmup: float | None = None  # None: min(2 s, duration / 5)
    settle: float = 20.0
    persistence: bool = True
    log_packets: bool = False
    firmware: dict = field(default_factory=dict)
    faults: tuple[FaultSpec, ...] = ()
    source: str | None = None   # the file it came from, for messages and the replay command
    collectors: Collectors = Collectors()

    @property
    def fault_start(self) -> float:
        """No fault before this time: the boards boot and connect first."""
        return self.warmup if self.warmup is not None else min(2.0, self.duration / 5)

    def with_overrides(self, boards: int | None = None, duration: float | None = None,
                       stretch: bool = False) -> "Scenario":
        """The same scenario with the command line's --boards / --duration applied (validated).

        stretch: a new duration scales every fault window, the warmup and the settle time with it
        (the demo's --duration: the faults keep their place in the run), instead of leaving windows
        where they were (``tern fleet run --duration``: a replay keeps the faults' absolute times)."""
        import dataclasses

        where = self.source or self.name
        changes = {}
        if boards is not None:
            changes["boards"] = _int(where, "--boards", boards, 1, MAX_BOARDS)
        if duration is not None:
            changes["duration"] = _num(where, "--duration", duration, 0.0, None, strict_low=True)
            k = changes["duration"] / self.duration
            if stretch and k != 1:
                changes["faults"] = tuple(
                    f if f.window is None else dataclasses.replace(f, window=(f.window[0] * k, f.window[1] * k))
                    for f in self.faults)
                if self.warmup is not None:
                    changes["warmup"] = self.warmup * min(k, 1.0)
        s = dataclasses.replace(self, **changes)
        _check_windows(s, where)
        return s


# ------------------------------------------------------------------ value checks

def _err(where, key, msg):
    return ScenarioError(f"{where}: {key} {msg}")


def _int(where, key, v, lo, hi):
    if isinstance(v, bool) or not isinstance(v, int):
        raise _err(where, key, f"must be an integer, not {v!r}")
    if v < lo or (hi is not None and v > hi):
        raise _err(where, key, f"must be in {lo}..{hi if hi is not None else 'inf'}, not {v}")
    return v


def _num(where, key, v, lo, hi, strict_low=False):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _err(where, key, f"must be a number, not {v!r}")
    v = float(v)
    if (v <= lo if strict_low else v < lo) or (hi is not None and v > hi):
        bound = f"> {lo:g}" if strict_low else f">= {lo:g}"
        raise _err(where, key, f"must be {bound}{'' if hi is None else f' and <= {hi:g}'}, not {v:g}")
    return v


def _str(where, key, v, choices=None):
    if not isinstance(v, str):
        raise _err(where, key, f"must be a string, not {v!r}")
    if choices is not None and v not in choices:
        raise _err(where, key, f"must be one of {', '.join(choices)}, not {v!r}")
    return v


def _range(where, key, v, number, lo):
    """[low, high] or a single value -> (low, high) with lo <= low <= high."""
    if isinstance(v, list):
        if len(v) != 2:
            raise _err(where, key, f"must be [low, high] or one number, not {v!r}")
        a = number(where, f"{key}[0]", v[0], lo, None)
        b = number(where, f"{key}[1]", v[1], lo, None)
        if b < a:
            raise _err(where, key, f"must be [low, high] with low <= high, not {v!r}")
        return (a, b)
    x = number(where, key, v, lo, None)
    return (x, x)


def _known(where, prefix, table, keys):
    for k in table:
        if k not in keys:
            name = f"{prefix}{k}"
            raise _err(where, f"unknown key {name!r}", f"(known here: {', '.join(sorted(keys))})")


# ------------------------------------------------------------------ parsing

_TOP = ("name", "description", "boards", "profile", "duration", "warmup", "settle", "broker",
        "firmware", "faults", "collectors")
_FAULT_KEYS = {
    "power_cut": ("kind", "count", "window", "at", "flash_ops", "off", "per_board"),
    "network_cut": ("kind", "count", "window", "length", "per_board"),
    "broker_restart": ("kind", "count", "window", "mode"),
    "collector_kill": ("kind", "count", "window", "down"),
}


def _fault(where, i, t) -> FaultSpec:
    p = f"faults[{i}]"
    if not isinstance(t, dict):
        raise _err(where, p, "must be a table ([[faults]])")
    if "kind" not in t:
        raise _err(where, f"{p}.kind", f"is missing (one of {', '.join(FAULT_KINDS)})")
    kind = _str(where, f"{p}.kind", t["kind"], FAULT_KINDS)
    _known(where, f"{p}.", t, _FAULT_KEYS[kind])
    kw = {"kind": kind, "count": _int(where, f"{p}.count", t.get("count", 1), 0, 100000)}
    if "window" in t:
        kw["window"] = _range(where, f"{p}.window", t["window"], _num, 0.0)
    if "at" in t:
        kw["at"] = _str(where, f"{p}.at", t["at"], CUT_AT)
    if "flash_ops" in t:
        kw["flash_ops"] = _range(where, f"{p}.flash_ops", t["flash_ops"],
                                 lambda w, k, v, lo, hi: _int(w, k, v, 1, hi), 1)
    if "off" in t:
        kw["off"] = _range(where, f"{p}.off", t["off"], _num, 0.0)
    if "length" in t:
        kw["length"] = _range(where, f"{p}.length", t["length"], _num, 0.0)
    if "mode" in t:
        kw["mode"] = _str(where, f"{p}.mode", t["mode"], RESTART_MODES)
    if "down" in t:
        kw["down"] = _range(where, f"{p}.down", t["down"], _num, 0.0)
    if "per_board" in t:
        if not isinstance(t["per_board"], bool):
            raise _err(where, f"{p}.per_board", f"must be true or false, not {t['per_board']!r}")
        kw["per_board"] = t["per_board"]
    return FaultSpec(**kw)


def _collectors(where, t) -> Collectors:
    if not isinstance(t, dict):
        raise _err(where, "collectors", "must be a table ([collectors])")
    _known(where, "collectors.", t, ("count", "group", "batch_time"))
    group = _str(where, "collectors.group", t.get("group", "tern"))
    if not group or any(c in group for c in "/+#\0"):
        raise _err(where, "collectors.group", f"must be non-empty without '/', '+', '#': {group!r}")
    return Collectors(count=_int(where, "collectors.count", t.get("count", 0), 0, MAX_COLLECTORS), group=group,
                      batch_time=_num(where, "collectors.batch_time", t.get("batch_time", 1.0), 0.0, None,
                                      strict_low=True))


def _check_windows(s: Scenario, where) -> None:
    if s.warmup is not None and s.warmup > s.duration:
        raise _err(where, "warmup", f"({s.warmup:g} s) must not exceed duration ({s.duration:g} s)")
    for i, f in enumerate(s.faults):
        if f.window is not None and f.window[0] > s.duration:
            raise _err(where, f"faults[{i}].window", f"starts after the scenario's duration ({s.duration:g} s)")


def parse_scenario(data: dict, *, name: str = "scenario", source: str | None = None) -> Scenario:
    """Validate a scenario given as a dict (what tomllib returns)."""
    where = source or name
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: a scenario must be a TOML table")
    _known(where, "", data, _TOP)
    if "duration" not in data:
        raise _err(where, "duration", "is missing (seconds of telemetry under faults)")
    broker = data.get("broker", {})
    if not isinstance(broker, dict):
        raise _err(where, "broker", "must be a table ([broker])")
    _known(where, "broker.", broker, ("persistence", "log_packets"))
    persistence, log_packets = broker.get("persistence", True), broker.get("log_packets", False)
    for key, value in (("persistence", persistence), ("log_packets", log_packets)):
        if not isinstance(value, bool):
            raise _err(where, f"broker.{key}", f"must be true or false, not {value!r}")
    firmware = data.get("firmware", {})
    if not isinstance(firmware, dict):
        raise _err(where, "firmware", "must be a table ([firmware])")
    from ..mqttcli.redact import add_config_secrets

    add_config_secrets(firmware)  # a password for the boards' config.json is never printed
    faults = data.get("faults", [])
    if not isinstance(faults, list):
        raise _err(where, "faults", "must be an array of tables ([[faults]])")
    s = Scenario(
        name=_str(where, "name", data.get("name", name)),
        description=_str(where, "description", data.get("description", "")),
        boards=_int(where, "boards", data.get("boards", 2), 1, MAX_BOARDS),
        profile=_str(where, "profile", data.get("profile", "unix-emulated")),
        duration=_num(where, "duration", data["duration"], 0.0, None, strict_low=True),
        warmup=_num(where, "warmup", data["warmup"], 0.0, None) if "warmup" in data else None,
        settle=_num(where, "settle", data.get("settle", 20.0), 0.0, None),
        persistence=persistence,
        log_packets=log_packets,
        firmware=dict(firmware),
        faults=tuple(_fault(where, i, t) for i, t in enumerate(faults)),
        source=source,
        collectors=_collectors(where, data.get("collectors", {})),
    )
    for i, f in enumerate(s.faults):
        if f.kind == "collector_kill" and f.count and not s.collectors.count:
            raise _err(where, f"faults[{i}].kind", "collector_kill needs collectors ([collectors] count >= 1)")
    if any(f.kind == "broker_restart" and f.count for f in s.faults) and not s.persistence:
        raise _err(where, "broker.persistence", "must be true when the scenario restarts the broker "
                   "(without it the broker forgets every session)")
    _check_windows(s, where)
    return s


def load_scenario(path) -> Scenario:
    """Read and validate a scenario file (TOML); a bare name (`smoke`, `demo.toml`) that is not a
    file here names one of the scenarios shipped with the harness."""
    p = Path(path)
    if not p.exists() and p.parent == Path("."):
        from ..paths import project_dir

        bundled = project_dir("scenarios") / (p.name if p.suffix == ".toml" else p.name + ".toml")
        p = bundled if bundled.is_file() else p
    try:
        text = p.read_bytes()
    except OSError as e:
        raise ScenarioError(f"{p}: cannot read the scenario: {e.strerror or e}") from None
    try:
        data = tomllib.loads(text.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{p}: not UTF-8 text: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{p}: not valid TOML: {e}") from None
    return parse_scenario(data, name=p.stem, source=str(p))
