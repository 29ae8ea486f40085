"""The pipeline's data model: what collectors land, what devices publish, what emulated devices log.

Everything here is the contract between three parties -- the device firmware (payload format), the
collector (landing and quarantine rows) and the Spark jobs (which read both). PySpark is imported lazily
so that a collector can use :func:`parse_payload` without Spark installed.

Landing set (``<root>/date=YYYY-MM-DD/hour=HH/*.parquet``, partition values from ``recv_ts`` in UTC)
-----------------------------------------------------------------------------------------------------
One row per received copy of a message (a duplicate delivery is a second row):

=========== ================= ==========================================================================
column      type              meaning
=========== ================= ==========================================================================
device      string            device id (payload ``d``)
boot        int               the device's boot counter (payload ``b``), 0..2**31-1
seq         long              message sequence number (payload ``s``): starts at 0 at each boot and counts
                              the messages of one QoS level, i.e. one counter per (device, boot, qos);
                              0..2**53-1 (``MAX_SEQ``)
qos         int               QoS the device published with (payload ``q``), 0, 1 or 2
topic       string            MQTT topic the message arrived on
sent_ts     double, nullable  device clock when first published, seconds since the epoch (payload ``t``);
                              a resend keeps the original value; within years 1..9999
recv_ts     double            collector clock when the message was received, seconds since the epoch
recv_idx    long, nullable    per-collector arrival counter, strictly increasing in arrival order; breaks
                              ties between equal ``recv_ts`` values
collector   string            which collector received it (several share one subscription)
readings    map<string,double> sensor readings (payload ``r``)
payload_raw binary, nullable  the raw payload bytes, if the collector keeps them
=========== ================= ==========================================================================

Why one counter per QoS level: the audit reports per device and QoS, and without a ledger a gap in a
counter shared by all levels could not be attributed to a level (a lost QoS 0 message is allowed, a
lost QoS 1 message is not). A device that publishes at one QoS only sees no difference.

Quarantine (``<root>/quarantine/`` any Parquet files below it): payloads :func:`parse_payload` rejected
(or that a collector could not land for another reason, said in ``reason``), one row each with
``payload_raw``, ``reason``, ``recv_ts``, ``topic``, ``collector``. The audit does not read them as
messages; it only counts them in its summary.

Ledger (optional; Parquet, or JSON lines with one object per line): what each emulated device says it
published, one row per message (not per send attempt): ``device, boot, seq, qos, topic, sent_ts``.

Device payload (JSON, UTF-8)
----------------------------
``{"d": device, "b": boot, "s": seq, "q": qos, "t": sent_ts, "r": {name: value, ...}}`` where ``t`` may be
``null`` or absent (no clock yet) and ``r`` may be empty. Strict JSON (RFC 8259: no ``NaN`` or
``Infinity``); every value must fit the column it lands in (see :func:`parse_payload`).
"""

from __future__ import annotations

import json
import math
import time

# Each table's columns once: (name, Spark type, nullable). Landing columns are
# in the order collectors write them; a ledger row is a landing row's first six.
LANDING_COLUMNS = (
    ("device", "string", False),
    ("boot", "int", False),
    ("seq", "long", False),
    ("qos", "int", False),
    ("topic", "string", True),
    ("sent_ts", "double", True),
    ("recv_ts", "double", False),
    ("recv_idx", "long", True),
    ("collector", "string", True),
    ("readings", "map<string,double>", True),
    ("payload_raw", "binary", True),
)
LEDGER_COLUMNS = LANDING_COLUMNS[:6]
QUARANTINE_COLUMNS = (
    ("payload_raw", "binary", True),
    ("reason", "string", False),
    ("recv_ts", "double", False),
    ("topic", "string", True),
    ("collector", "string", True),
)
LANDING_FIELDS = tuple(c[0] for c in LANDING_COLUMNS)
LEDGER_FIELDS = tuple(c[0] for c in LEDGER_COLUMNS)
QUARANTINE_FIELDS = tuple(c[0] for c in QUARANTINE_COLUMNS)
PARTITION_FIELDS = ("date", "hour")
QUARANTINE_DIR = "quarantine"
QOS_LEVELS = (0, 1, 2)


def _struct(columns):
    from pyspark.sql import types as T

    types = {"string": T.StringType(), "int": T.IntegerType(), "long": T.LongType(),
             "double": T.DoubleType(), "binary": T.BinaryType(),
             "map<string,double>": T.MapType(T.StringType(), T.DoubleType(), True)}
    return T.StructType([T.StructField(n, types[t], nullable) for n, t, nullable in columns])


def landing_schema():
    """Spark schema of a landing row (the partition columns ``date``/``hour`` come from the paths)."""
    return _struct(LANDING_COLUMNS)


def quarantine_schema():
    """Spark schema of a quarantined (unparseable) payload."""
    return _struct(QUARANTINE_COLUMNS)


def ledger_schema():
    """Spark schema of a ledger row (one per message a device published)."""
    return _struct(LEDGER_COLUMNS)


def partition_values(recv_ts: float) -> tuple[str, str]:
    """The ``(date, hour)`` landing partition for a receive time: ``("2024-05-01", "07")``, in UTC."""
    t = time.gmtime(recv_ts)
    return time.strftime("%Y-%m-%d", t), time.strftime("%H", t)


# What a payload's fields may hold: the schema's rules, checked where the payload is parsed, so that
# every value a collector lands is one the Parquet writer, Spark and Python's datetime all take.
MAX_SEQ = 2**53 - 1     # RFC 8259 section 6: the largest integer every JSON reader holds exactly
MAX_BOOT = 2**31 - 1    # the landing's ``boot`` column is a 32-bit int
# sent_ts: seconds since the epoch within what datetime and Spark timestamps hold (years 1..9999)
MIN_TS, MAX_TS = -62135596800.0, 253402300799.0


def _show(v) -> str:
    """A value as a reason may quote it: its repr, cut to 60 characters (a payload may hold a
    megabyte-long array or a string of a thousand nested lists)."""
    try:
        text = repr(v)
    except (RecursionError, ValueError):
        text = f"<{type(v).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _text(v, what: str) -> str:
    """A string field, which the Parquet writer takes only as UTF-8: JSON's ``\\ud800`` escapes give
    lone surrogates, which have none."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"payload {what} holds a lone surrogate ({_show(v[e.start:e.end])}): not "
                         "UTF-8") from None
    return v


def _int_field(obj: dict, key: str, name: str, lo: int, hi: int) -> int:
    if key not in obj:
        raise ValueError(f"payload has no {name} ({key!r})")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"payload {name} ({key!r}) is not an integer: {_show(v)}")
    if not lo <= v <= hi:
        raise ValueError(f"payload {name} ({key!r}) out of range {lo}..{hi}: {_show(v)}")
    return v


def _number(v, what: str, lo: float | None = None, hi: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"payload {what} is not a number: {_show(v)}")
    try:
        f = float(v)
    except OverflowError:  # an integer past the largest double
        raise ValueError(f"payload {what} is too large for a double: {_show(v)}") from None
    if not math.isfinite(f):
        raise ValueError(f"payload {what} is not finite: {_show(v)}")
    if lo is not None and not lo <= f <= hi:
        raise ValueError(f"payload {what} out of range {lo:.0f}..{hi:.0f}: {_show(v)}")
    return f


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number (RFC 8259)")


def parse_payload(raw) -> dict:
    """Decode a device payload into landing fields.

    Returns ``{"device", "boot", "seq", "qos", "sent_ts", "readings"}`` (``sent_ts`` may be ``None``).
    Raises ``ValueError`` with a one-line reason for anything else; collectors store that reason in the
    quarantine row. Every value returned is one the landing's Parquet file and the Spark jobs take:
    strings are UTF-8 (no lone surrogates), ``boot`` fits the 32-bit column, ``seq`` is at most
    ``MAX_SEQ`` (so the audit's arithmetic on it cannot overflow), ``sent_ts`` is a time of years
    1..9999, readings are finite doubles.
    """
    if isinstance(raw, str):
        raise ValueError("payload must be bytes, not str")
    try:
        text = bytes(raw).decode("utf-8")
    except (TypeError, UnicodeDecodeError) as e:
        raise ValueError(f"payload is not UTF-8: {e}") from None
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("payload is not JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, NaN/Infinity, an integer of more than 4300 digits
        raise ValueError(f"payload is not JSON: {str(e)[:200]}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"payload is not a JSON object: {type(obj).__name__}")
    device = obj.get("d")
    if not isinstance(device, str) or not device:
        raise ValueError(f"payload device ('d') must be a non-empty string: {_show(device)}")
    _text(device, "device ('d')")
    boot = _int_field(obj, "b", "boot", 0, MAX_BOOT)
    seq = _int_field(obj, "s", "seq", 0, MAX_SEQ)
    qos = _int_field(obj, "q", "qos", 0, 2)
    sent = obj.get("t")
    sent_ts = None if sent is None else _number(sent, "sent time ('t')", MIN_TS, MAX_TS)
    r = obj.get("r", {})
    if not isinstance(r, dict):
        raise ValueError(f"payload readings ('r') must be an object: {type(r).__name__}")
    readings = {}
    for k, v in r.items():
        readings[_text(k, f"reading name {_show(k)}")] = _number(v, f"reading {_show(k)}")
    return {"device": device, "boot": boot, "seq": seq, "qos": qos, "sent_ts": sent_ts,
            "readings": readings}


def make_payload(device: str, boot: int, seq: int, qos: int, sent_ts, readings: dict) -> bytes:
    """The inverse of :func:`parse_payload` (for emulated devices and tests)."""
    return json.dumps({"d": device, "b": boot, "s": seq, "q": qos, "t": sent_ts, "r": readings},
                      separators=(",", ":")).encode()
