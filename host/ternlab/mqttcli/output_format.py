"""`tern sub -F`: mosquitto_sub's output format language. `compile_format`
checks the string once (UsageError naming the first bad sequence), `render`
turns one message into bytes."""

import datetime as _dt
import json
import re
import time

from tern import props as P

from .flags import arg_bytes
from .errors import UsageError

# -F %j: a byte of the payload (or of binary properties) that is not UTF-8 becomes the JSON escape of a
# lone surrogate, \udc80..\udcff (Python's surrogateescape): valid JSON text that text never produces, so
# json.loads(line)["payload"].encode("utf-8", "surrogateescape") gives the payload's bytes back and the
# literal text "\xff" stays itself. mosquitto_sub 2.0.11 writes the raw byte (the line is not UTF-8).
_UNPAIRED = re.compile("[\udc80-\udcff]")


def _u_escape(m):
    return "\\u%04x" % ord(m.group())


_ESCAPES = {"\\": b"\\", "0": b"\0", "a": b"\a", "e": b"\x1b", "n": b"\n", "r": b"\r", "t": b"\t", "v": b"\v"}
_CONVERSIONS = "%tpqrlmxXIUjPCDEFRS"
_ZERO_PAD = "EFlmSxX"
_MAX_WIDTH = "CIRt"


def compile_format(fmt):
    """The -F string as a list of bytes literals and (conversion, left, zero,
    width, precision) tuples; UsageError naming the first bad sequence."""
    items = []
    lit = bytearray()

    def emit(item):  # the literal bytes so far, then item
        if lit:
            items.append(bytes(lit))
            del lit[:]
        items.append(item)

    i = 0
    n = len(fmt)
    while i < n:
        c = fmt[i]
        if c == "\\":
            e = fmt[i + 1 : i + 2]
            if e not in _ESCAPES:
                raise UsageError("-F: invalid escape '\\%s'" % e)
            lit += _ESCAPES[e]
            i += 2
        elif c == "@":
            e = fmt[i + 1 : i + 2]
            if not e:
                raise UsageError("-F: '@' at the end of the format")
            if e == "@":
                lit += b"@"
            else:
                emit(("@", e))
            i += 2
        elif c == "%":
            j = i + 1
            left = zero = False
            while j < n and fmt[j] in "-0":
                left |= fmt[j] == "-"
                zero |= fmt[j] == "0"
                j += 1
            k = j
            while j < n and fmt[j].isdigit():
                j += 1
            width = int(fmt[k:j]) if j > k else 0
            prec = None
            if j < n and fmt[j] == ".":
                j += 1
                k = j
                while j < n and fmt[j].isdigit():
                    j += 1
                prec = int(fmt[k:j]) if j > k else 0
            conv = fmt[j : j + 1]
            if not conv or conv not in _CONVERSIONS:
                raise UsageError("-F: unsupported format sequence '%s'" % fmt[i : j + 1])
            if conv == "%":
                lit += b"%"
            else:
                emit((conv, left, zero and not left, width, prec))
            i = j + 1
        else:
            lit += arg_bytes(c)
            i += 1
    if lit:
        items.append(bytes(lit))
    return items


def _iso(ns, micro=False):
    t = _dt.datetime.fromtimestamp(ns / 1e9).astimezone()
    if micro:  # %j's tst, as mosquitto_sub 2.0 writes it: a 'Z' and then the offset
        return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ%z")
    return t.strftime("%Y-%m-%dT%H:%M:%S%z")


_JSON_PROPS = ((P.PAYLOAD_FORMAT_INDICATOR, "payload-format-indicator"),
               (P.MESSAGE_EXPIRY_INTERVAL, "message-expiry-interval"), (P.CONTENT_TYPE, "content-type"),
               (P.RESPONSE_TOPIC, "response-topic"), (P.CORRELATION_DATA, "correlation-data"),
               (P.SUBSCRIPTION_IDENTIFIER, "subscription-identifier"), (P.USER_PROPERTY, "user-properties"))


def _value(conv, m, now):
    """Bytes of one conversion for the message snapshot m."""
    pr = m["props"] or {}
    if conv == "t":
        return m["topic"].encode()
    if conv == "p":
        return m["payload"]
    if conv == "q":
        return b"%d" % m["qos"]
    if conv == "r":
        return b"%d" % m["retain"]
    if conv == "l":
        return b"%d" % len(m["payload"])
    if conv == "m":
        return b"%d" % m["mid"]
    if conv == "x":
        return m["payload"].hex().encode()
    if conv == "X":
        return m["payload"].hex().upper().encode()
    if conv == "I":
        return _iso(now).encode()
    if conv == "U":
        return b"%d.%09d" % divmod(now, 1000000000)
    if conv == "j":
        d = {"tst": _iso(now, True), "topic": m["topic"], "qos": m["qos"], "retain": m["retain"],
             "payloadlen": len(m["payload"])}
        if m["qos"]:
            d["mid"] = m["mid"]
        if pr:
            jp = {}
            for pid, key in _JSON_PROPS:
                if pid in pr:
                    v = pr[pid]
                    if pid == P.USER_PROPERTY:
                        v = dict(v)
                    elif isinstance(v, (bytes, bytearray, memoryview)):
                        v = bytes(v).decode("utf-8", "surrogateescape")
                    jp[key] = v
            d["properties"] = jp
        d["payload"] = m["payload"].decode("utf-8", "surrogateescape")
        return _UNPAIRED.sub(_u_escape, json.dumps(d, separators=(",", ":"), ensure_ascii=False)).encode()
    if conv == "P":
        return " ".join("%s:%s" % kv for kv in pr.get(P.USER_PROPERTY, ())).encode()
    if conv == "S":
        sids = pr.get(P.SUBSCRIPTION_IDENTIFIER)
        if sids is None:
            return b""
        return ",".join(str(x) for x in (sids if isinstance(sids, list) else [sids])).encode()
    pid = {"C": P.CONTENT_TYPE, "D": P.CORRELATION_DATA, "E": P.MESSAGE_EXPIRY_INTERVAL,
           "F": P.PAYLOAD_FORMAT_INDICATOR, "R": P.RESPONSE_TOPIC}[conv]
    v = pr.get(pid)
    if v is None:
        return b""
    if isinstance(v, int):
        return b"%d" % v
    if isinstance(v, str):
        return v.encode()
    return bytes(v)


def render(items, m, now):
    out = bytearray()
    for it in items:
        if isinstance(it, bytes):
            out += it
            continue
        if it[0] == "@":
            e = it[1]
            if e == "N":
                out += b"%09d" % (now % 1000000000)
            else:
                out += time.strftime("%" + e, time.localtime(now // 1000000000)).encode()
            continue
        conv, left, zero, width, prec = it
        v = _value(conv, m, now)
        if prec is not None and conv in _MAX_WIDTH:
            v = v[:prec]
        if len(v) < width:
            pad = width - len(v)
            if left:
                v = v + b" " * pad
            elif zero and conv in _ZERO_PAD:
                v = b"0" * pad + v
            else:
                v = b" " * pad + v
        out += v
    return bytes(out)
