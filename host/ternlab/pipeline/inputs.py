"""What a folder given to a pipeline command is, said in one line before Spark starts.

``tern audit``, ``rollup`` and ``report`` take a landing (the folder the collectors wrote), an audit
output, a ledger, an observer's copies, a fault log. Given the wrong one -- a fleet run's output folder,
a fleet run without collectors (no landing at all), an empty folder, JSON lines, a ledger where the
landing should be -- Spark would start (a minute on a busy machine) and fail with a file-format error
that names neither what was given nor what to pass. :func:`check` looks first (local paths only: a
Hadoop path is Spark's to read) and raises :class:`PipelineError` with one line saying what the path
is and what to pass instead. Plain Python; pyarrow reads one Parquet footer where a folder holds
Parquet files.
"""

from __future__ import annotations

import json
import os

from .spark import PipelineError, is_local, local_part

JSONL = (".json", ".jsonl", ".ndjson")
WITH_COLLECTORS = "demo-short, demo, soak or spread"  # bundled scenarios with [collectors] (docs/fleet.md)
MAX_LOOK = 2000  # directory entries looked at before deciding (a landing's first file comes early)


def _summary(d: str, *keys: str) -> dict | None:
    """``d``'s summary.json when it holds ``keys`` (a fleet run's or an audit's), else None."""
    try:
        with open(os.path.join(d, "summary.json")) as f:
            s = json.load(f)
    except (OSError, ValueError):
        return None
    return s if isinstance(s, dict) and all(k in s for k in keys) else None


def _fleet_summary(d: str) -> dict | None:
    return _summary(d, "scenario", "ledger_rows")  # tern fleet run / tern demo


def _audit_summary(d: str) -> dict | None:
    return _summary(d, "verdict", "per_qos")  # tern audit


def _files(d: str):
    """Non-hidden files under ``d`` (at most MAX_LOOK entries looked at), folders named . or _ skipped."""
    seen = 0
    for root, dirs, files in os.walk(d):
        dirs[:] = sorted(x for x in dirs if not x.startswith((".", "_")))
        for name in sorted(files):
            seen += 1
            if seen > MAX_LOOK:
                return
            if not name.startswith((".", "_")):
                yield os.path.join(root, name)


def _parquet_columns(path: str) -> set | None:
    try:
        import pyarrow.parquet as pq

        return set(pq.read_schema(path).names)
    except Exception:  # not Parquet, or unreadable: Spark will say which
        return None


def fleet_without_landing(d: str, s: dict) -> str:
    return (f"{d} is a fleet run without collectors (scenario {s.get('scenario', '?')}): it has no landing "
            f"to audit; run a scenario with collectors, e.g. {WITH_COLLECTORS} (docs/fleet.md)")


def _jsonl_role(path: str) -> str:
    name = os.path.basename(path.rstrip("/"))
    return {"received.jsonl": " (the fleet observer's copies: give them with --order-ref)",
            "ledger.jsonl": " (a ledger: give it with --ledger)",
            "faults.jsonl": " (a fault log: give it to tern report --faults)"}.get(name, "")


def what_is(path: str) -> str | None:
    """Why a local ``path`` is not a landing, in one line (None: it looks like one, or is not local)."""
    if not is_local(path):
        return None
    p = local_part(path)
    if not os.path.exists(p):
        parent = os.path.dirname(p.rstrip("/")) or "."
        s = _fleet_summary(parent)
        if s is not None and os.path.basename(p.rstrip("/")) == "landing":
            return f"{path} not found: " + fleet_without_landing(parent, s)
        return f"landing path not found: {path}"
    if os.path.isfile(p):
        if p.endswith(JSONL):
            kind = "is a JSON file" if p.endswith(".json") else "holds JSON lines"
            return (f"{path} {kind}, not a landing{_jsonl_role(p)}: pass the folder the "
                    "collectors wrote (OUT/landing)")
        cols = _parquet_columns(p)
        if cols is not None and "recv_ts" in cols:
            return None  # one landing file: Spark reads it as it is
        return f"{path} is a file, not a landing: pass the folder the collectors wrote (OUT/landing)"
    s = _fleet_summary(p)
    if s is not None:
        if os.path.isdir(os.path.join(p, "landing")):
            return (f"{path} is a fleet run's output folder, not its landing: pass {os.path.join(path, 'landing')} "
                    f"(and --ledger {os.path.join(path, 'ledger.jsonl')})")
        return fleet_without_landing(path, s)
    if _audit_summary(p) is not None:
        return f"{path} is a tern audit output, not a landing: pass the landing it audited"
    if os.path.isdir(os.path.join(p, ".tern")) or os.path.isdir(os.path.join(p, "quarantine")):
        return None  # a collector's landing (perhaps with nothing landed yet: the audit says so)
    files = list(_files(p))
    if not files:
        return (f"{path} is empty: pass the folder the collectors wrote (tern collect LANDING: "
                "date=*/hour=*/part-*.parquet)")
    parquet = [f for f in files if f.endswith(".parquet")]
    if parquet:
        cols = _parquet_columns(parquet[0])
        if cols is None or "recv_ts" in cols:
            return None
        if {"device", "seq", "sent_ts"} <= cols:
            return (f"{path} is a ledger (what the devices published: no recv_ts), not a landing: give it "
                    "with --ledger, and the folder the collectors wrote as the landing")
        return (f"{path} holds Parquet without the landing's columns (no recv_ts: {parquet[0]}): pass the "
                "folder the collectors wrote (OUT/landing)")
    if any(f.endswith(JSONL) for f in files):
        return f"{path} holds JSON lines, not a landing: pass the folder the collectors wrote (OUT/landing)"
    return (f"{path} holds no landing files (date=*/hour=*/part-*.parquet): pass the folder the "
            "collectors wrote (OUT/landing)")


def audit_dir_problem(path: str) -> str | None:
    """Why a local ``path`` is not an audit output (``tern audit --out``), in one line, or None."""
    if not is_local(path):
        return None
    p = local_part(path)
    if not os.path.exists(p):
        return f"audit directory not found: {path}"
    if _audit_summary(p) is not None:
        return None
    s = _fleet_summary(p)
    if s is not None:
        if not os.path.isdir(os.path.join(p, "landing")):
            return fleet_without_landing(path, s)
        return (f"{path} is a fleet run's output folder, not an audit: audit it first, tern audit "
                f"{os.path.join(path, 'landing')} --out {os.path.join(path, 'audit')} --ledger "
                f"{os.path.join(path, 'ledger.jsonl')} --order-ref {os.path.join(path, 'received.jsonl')}")
    if what_is(path) is None:
        return f"{path} is a landing, not an audit output: run tern audit {path} --out DIR first, then --audit DIR"
    return f"{path} is not an audit output (no summary.json of tern audit): pass the folder tern audit --out wrote"


def ledger_problem(path: str) -> str | None:
    """Why a local ``path`` is not a ledger, in one line, or None (Spark judges the rows)."""
    if not is_local(path):
        return None
    p = local_part(path)
    if not os.path.exists(p):
        return f"ledger path not found: {path}"
    if os.path.isdir(p) and _fleet_summary(p) is not None:
        return f"{path} is a fleet run's output folder: its ledger is {os.path.join(path, 'ledger.jsonl')}"
    if os.path.isdir(p) and not list(_files(p)):
        return f"ledger {path} is an empty folder"
    return None


def check(kind: str, path: str) -> None:
    """Raise PipelineError with one line when ``path`` is not the ``kind`` of input a command takes:
    ``landing``, ``audit``, ``ledger``, or any other kind (which must only exist)."""
    why = {"landing": what_is, "audit": audit_dir_problem, "ledger": ledger_problem}.get(kind)
    if why is not None:
        line = why(path)
    else:
        line = f"{kind} not found: {path}" if is_local(path) and not os.path.exists(local_part(path)) else None
    if line:
        raise PipelineError(line)
