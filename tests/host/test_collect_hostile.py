"""Nothing that arrives can stop `tern collect`: a corpus of hostile payloads at QoS 0, 1 and 2 against a
real Mosquitto (numbers past a double and past int64, NaN and Infinity, lone surrogates, deep nesting,
huge arrays, every field of the wrong type, payloads at the broker's maximum size), each one landed or
quarantined with its reason, and every good message behind them landed. An exception nothing foresaw
(injected by the test-only fault hook) quarantines its message and the collector goes on. Read back with
pyarrow, not with the collector's code."""

import json
import os
import time
from collections import Counter

from devices.collecting import publish_all, read_rows, start_collector
from ternlab.brokers.mosquitto import Broker
from ternlab.pipeline import schema

MAX = 1 << 20  # the broker's message_size_limit in this test


def _payload(qos, seq, **fields):
    """A telemetry payload of device 'hostile' at payload q = ``qos``, with fields replaced or added
    (a value of ``...`` removes the field); JSON text given as bytes is spliced in as it is."""
    obj = {"d": "hostile", "b": 1, "s": seq, "q": qos, "t": 1700000000.0, "r": {"v": 1.0}}
    obj.update(fields)
    raw = {}
    for k, v in list(obj.items()):
        if v is ...:
            del obj[k]
        elif isinstance(v, bytes):
            raw[k] = v
            obj[k] = f"@{k}@"
    text = json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode()
    for k, v in raw.items():
        text = text.replace(f'"@{k}@"'.encode(), v)
    return text


def corpus(qos):
    """(malformed payloads, well-formed payloads) for one QoS: each well-formed one carries a seq of
    its own (a QoS 2 payload is not folded with another)."""
    big = b"9" * 400
    bad = [
        _payload(qos, 0, t=big), _payload(qos, 0, r=b'{"v":' + big + b"}"),   # past a double
        _payload(qos, 0, s=2**63), _payload(qos, 0, s=2**64 + 1), _payload(qos, 0, s=2**63 - 1),  # past int64 / JSON-safe
        _payload(qos, 0, s=b"1" * 5000),                                      # more digits than Python parses
        _payload(qos, 0, b=2**31), _payload(qos, 0, s=-1),
        _payload(qos, 0, t=b"NaN"), _payload(qos, 0, t=b"Infinity"), _payload(qos, 0, r=b'{"v":-Infinity}'),
        _payload(qos, 0, t=b"1e400"), _payload(qos, 0, t=1e13),              # not a time Spark holds
        _payload(qos, 0, d="\ud800"), _payload(qos, 0, r={"\udc00": 1.0}),   # lone surrogates (JSON escapes)
        b'{"d":"x","r":' + b"[" * 100000 + b"]" * 100000 + b"}", b"[" * 200000,  # deep nesting
        _payload(qos, 0, r=b"[" + b"1," * 100000 + b"1]"), _payload(qos, 0, r={"v": list(range(50000))}),
        _payload(qos, 0, d=5), _payload(qos, 0, d=""), _payload(qos, 0, d=None), _payload(qos, 0, d=...),
        _payload(qos, 0, b="1"), _payload(qos, 0, b=1.5), _payload(qos, 0, b=True), _payload(qos, 0, b=...),
        _payload(qos, 0, s="5"), _payload(qos, 0, s=None), _payload(qos, 0, q=3), _payload(qos, 0, q="2"),
        _payload(qos, 0, t="now"), _payload(qos, 0, t=[1]), _payload(qos, 0, r="x"), _payload(qos, 0, r=[1]),
        _payload(qos, 0, r={"v": "1"}), _payload(qos, 0, r={"v": True}), _payload(qos, 0, r={"v": None}),
        _payload(qos, 0, r={"v": {"w": 1}}),
        b"", b"null", b"[]", b"{}", b"\xff\xfe\x00", b"\xed\xa0\x80",        # not UTF-8 (an encoded surrogate)
        b"x" * (MAX - 1) + b"}",                                              # malformed, at the size limit
    ]
    good = [
        _payload(qos, 1, t=None), _payload(qos, 2, t=...), _payload(qos, 3, r={}), _payload(qos, 4, r=...),
        _payload(qos, 5, d="\u00e9\U0001f426 \x00 ok", r={"": 0.0, "\u2603": -1.5e308}),  # odd but valid text
        _payload(qos, 6, s=2**53 - 1, t=253402300799, r={"v": 2**70}),        # the largest accepted values
    ]
    good.append(_payload(qos, 7, d="y" * (MAX - len(_payload(qos, 7, d="")))))  # well-formed, at the size limit
    assert all(len(p) <= MAX for p in bad + good) and len(good[-1]) == MAX
    return bad, good


def test_hostile_payloads_never_stop_the_collector_and_what_follows_them_lands(tmp_path):
    topic = "tern/hostile/telemetry"
    with Broker(tmp_path / "broker", message_size_limit=MAX) as broker:
        land = tmp_path / "landing"
        c = start_collector(broker, land, "col-h", "--batch-time", "0.3", "--keep-raw")
        c.wait_for("subscribed to")
        sent, want_landed, want_quarantined = [], Counter(), Counter()
        for qos in (0, 1, 2):
            bad, good = corpus(qos)
            behind = [schema.make_payload("after", 1, s, qos, 1.0, {"v": s}) for s in range(20)]
            sent += [(topic, p, qos) for p in bad + good + behind]
            want_landed.update(good + behind)
            want_quarantined.update(bad)
        publish_all(broker, sent, "pub-h")
        n = len(sent)
        deadline = time.monotonic() + 60
        while sum(c.progress() or (0,)) < n and c.alive and time.monotonic() < deadline:
            time.sleep(0.1)
        assert c.alive, c.lines[-20:]
        assert c.terminate() == 0
    s = c.summary()
    assert not any("Traceback" in ln for ln in c.lines), c.lines
    rows, quarantined = read_rows(land), read_rows(land, quarantine=True)
    assert Counter(r["payload_raw"] for r in rows) == want_landed
    assert Counter(r["payload_raw"] for r in quarantined) == want_quarantined
    assert all(r["reason"] and len(r["reason"]) <= 500 for r in quarantined)
    assert (s["landed"], s["quarantined"], s["errors"]) == (len(rows), len(quarantined), 0)
    assert sorted((r["qos"], r["seq"]) for r in rows if r["device"] == "after") == \
        [(q, seq) for q in (0, 1, 2) for seq in range(20)]
    reasons = {r["payload_raw"]: r["reason"] for r in quarantined}
    bad, _ = corpus(1)
    assert "too large for a double" in reasons[bad[0]] and "lone surrogate" in reasons[bad[13]]
    assert "out of range 0..9007199254740991" in reasons[bad[4]] and "not a JSON number" in reasons[bad[8]]
    assert "nested too deeply" in reasons[bad[15]]


def test_an_unforeseen_error_quarantines_that_message_and_the_collector_goes_on(broker, tmp_path):
    """The fault hook raises while one message is taken (``fail-on-payload``), and gives another a row
    the Parquet writer refuses (``unwritable``): each goes to quarantine with the error as its reason,
    is counted and reported, is acknowledged (a restart gets nothing back), and the rest lands."""
    topic = "tern/u/telemetry"
    msgs = [(topic, schema.make_payload("u", 1, s, q, 1.0, {"v": s}), q) for q in (1, 2) for s in range(10)]
    boom = [(topic, schema.make_payload("BOOM", 1, 0, q, 1.0, {}), q) for q in (1, 2)]
    zap = [(topic, schema.make_payload("ZAP", 1, 0, q, 1.0, {}), q) for q in (1, 2)]
    for fault, odd in (("fail-on-payload:BOOM", boom), ("unwritable:ZAP", zap)):
        land = tmp_path / fault.split(":")[0]
        env = dict(os.environ, TERN_COLLECT_FAULT=fault)
        c = start_collector(broker, land, "col-u", "--batch-time", "0.3", env=env)
        c.wait_for("subscribed to")
        publish_all(broker, msgs[:10] + odd + msgs[10:], "pub-u")
        c.wait_for(r"landed 20 .*quarantined 2", timeout=30)
        assert c.terminate() == 0
        s = c.summary()
        assert (s["landed"], s["quarantined"], s["errors"], s["acked"]) == (20, 2, 2, 22), c.lines
        q = read_rows(land, quarantine=True)
        assert sorted(r["payload_raw"] for r in q) == sorted(p for _, p, _ in odd)
        word = "RuntimeError: injected" if odd is boom else "cannot be written as Parquet"
        assert all(word in r["reason"] for r in q), [r["reason"] for r in q]
        assert sum("error:" in ln for ln in c.lines) >= 1
        assert sorted(r["seq"] for r in read_rows(land)) == sorted(list(range(10)) * 2)
        again = start_collector(broker, land, "col-u", "--batch-time", "0.2")
        again.wait_for("session present: 1")
        time.sleep(0.4)
        assert again.terminate() == 0 and again.summary()["redelivered"] == 0
