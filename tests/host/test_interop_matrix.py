"""The pure-Python parts of `make interop` (ternlab.interop): how a cell is judged from Tern's and the
peer's results, and that a rerun replaces only the generated matrix of docs/interop.md. The brokers
themselves run only under `make interop`."""

from ternlab import interop


def test_a_cell_tells_tern_failures_from_broker_limits():
    ok, bad = (True, "fine"), (False, "OSError: timed out waiting for 3 messages")
    assert interop.verdict(ok, ok) == "ok"
    assert interop.verdict(ok, bad).startswith("ok (peer: OSError")
    assert interop.verdict(bad, bad).startswith("broker limit: OSError")
    assert interop.verdict(bad, ok).startswith("**TERN FAILS**")
    violation = (False, "MQTTError: protocol violation: the broker answered QoS 2 message 1 with PUBACK")
    assert interop.verdict(violation, ok) == "broker: %s (peer: passes)" % violation[1]


def test_a_rerun_keeps_the_written_part_of_the_document(tmp_path):
    doc = tmp_path / "interop.md"
    doc.write_text("# Interop\n\nNotes written by hand.\n\n" + interop.MARK + " old) -->\nold matrix\n")
    text = interop.render([{"broker": "X", "version": "1", "cells": {}, "error": "not installed"}], 1.0)
    interop.write(doc, text)
    out = doc.read_text()
    assert out.startswith("# Interop\n\nNotes written by hand.\n\n" + interop.MARK) and "old matrix" not in out
    assert "### X 1" in out and "Could not run here: not installed" in out
