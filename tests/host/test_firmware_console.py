"""The host's reader of the app's console (ternlab.app_events): events, torn lines, the ledger."""

import json

from ternlab.pipeline.schema import LEDGER_FIELDS, make_payload
from ternlab.app_events import PREFIX, TelemetryLog, parse_line, write_ledger


def _pub(pid, seq, qos=1, boot=3):
    m = json.loads(make_payload("dev-1", boot, seq, qos, 1700000000.5, {"temp": 21.5}))
    return PREFIX + json.dumps({"ev": "published", "p": pid, "topic": "tern/dev-1/telemetry", "m": m})


def test_a_line_torn_by_a_power_cut_keeps_the_next_boot_event():
    torn = _pub(7, 0)[:-15]
    boot = PREFIX + json.dumps({"ev": "boot", "d": "dev-1", "b": 4, "recovered": 1})
    evs, bad = parse_line(torn + boot)
    assert bad == 1
    assert [e["ev"] for e in evs] == ["boot"] and evs[0]["b"] == 4
    assert parse_line("tern.flashstore: a warning") == ([], 0)


def test_ledger_rows_acks_and_counts(tmp_path):
    log = TelemetryLog().feed_text("\n".join([
        PREFIX + '{"ev":"boot","d":"dev-1","b":3,"recovered":2}',
        _pub(5, 0), _pub(0, 0, qos=0), _pub(6, 1),
        PREFIX + '{"ev":"acked","p":5,"rc":0}',
        PREFIX + '{"ev":"acked","p":99,"rc":0}',  # a status message: not in the ledger
        "noise without the prefix",
    ]))
    assert [(r["seq"], r["qos"]) for r in log.ledger] == [(0, 1), (0, 0), (1, 1)]
    assert set(log.ledger[0]) == set(LEDGER_FIELDS)
    assert log.ledger[0]["device"] == "dev-1" and log.ledger[0]["boot"] == 3
    assert log.ledger[0]["sent_ts"] == 1700000000.5 and log.ledger[0]["topic"] == "tern/dev-1/telemetry"
    assert list(log.pending) == [6] and log.acked == [log.ledger[0]]
    assert log.counts["published"] == 3 and log.counts["acked"] == 2 and log.recovered() == 2
    assert log.boots == [3]
    path = write_ledger(log.ledger, tmp_path / "ledger.jsonl")
    assert [json.loads(x) for x in path.read_text().splitlines()] == log.ledger


def test_a_published_line_with_a_bad_payload_is_an_error_not_a_row():
    bad = PREFIX + json.dumps({"ev": "published", "p": 1, "topic": "t", "m": {"d": "x", "b": -1, "s": 0, "q": 1}})
    log = TelemetryLog()
    log.feed(bad)
    assert log.ledger == [] and len(log.errors) == 1 and "boot" in log.errors[0]
