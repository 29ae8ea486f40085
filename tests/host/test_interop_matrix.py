"""The pure-Python parts of `make interop` (tools/interop/matrix.py): how a cell is judged from Tern's and the
peer's results, and that a rerun replaces only the generated matrix of docs/interop.md. The brokers
themselves run only under `make interop`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "interop"))
import brokers as interop_brokers  # noqa: E402  (tools/interop/brokers.py)
import matrix as interop  # noqa: E402  (tools/interop/matrix.py, as `make interop` runs it)


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


def test_a_violation_logged_by_the_strict_broker_fails_the_cell_whatever_the_peer_did():
    ok = (True, "fine")
    strict = (False, interop.STRICT + "Puback received for msgid 9, but no message found")
    assert interop.verdict(strict, ok).startswith("**TERN FAILS**: " + interop.STRICT)
    assert interop.verdict(strict, (False, "x")).startswith("**TERN FAILS**: ")
    fault = (False, "broker fault: the broker raised IndexError: list index out of range; OSError: timed out")
    assert interop.verdict(fault, ok).startswith("broker: broker fault")


def test_without_the_strict_brokers_sources_its_cells_are_skipped_saying_so(tmp_path, monkeypatch):
    monkeypatch.setattr(interop_brokers, "THIRD_PARTY", tmp_path / "shared" / "third_party")
    said = []
    res = interop.run_broker(interop_brokers.PahoTest, tmp_path, say=said.append)
    assert res["cells"] == {} and res["error"].startswith("not run: no paho.mqtt.testing-") and said, res
    out = interop.render([res], 1.0)
    assert "### Paho test broker" in out and "Could not run here: not run: no paho.mqtt.testing-" in out


def test_the_strict_broker_reports_a_clients_violation_and_not_a_clean_session(tmp_path):
    # the real broker from ../shared/third_party (as `make interop` runs it): a raw client acknowledges a
    # message it never received (MQTT 3.1.1 section 4.3.2: PUBACK answers a PUBLISH of the server's)
    import pytest
    from rawmqtt import Raw
    from tern.client import Client
    from tern.codec import Packet
    from tern.wire import CONNECT, DISCONNECT, PUBACK

    PahoTest = interop_brokers.PahoTest
    if PahoTest.absent():
        pytest.skip(PahoTest.absent())
    b = PahoTest(tmp_path).start()
    try:
        mark = b.mark()
        c = Client("clean", "127.0.0.1", b.port, version=5)
        c.connect()
        c.subscribe("t/#", 2, timeout=5)
        for q in (0, 1, 2):
            pid = c.publish("t/%d" % q, b"x", qos=q)
            if q:
                c.wait_published(pid, 5)
        c.disconnect()
        assert b.violations(mark) == ([], []), b.violations(mark)
        mark = b.mark()
        r = Raw(("127.0.0.1", b.port))
        r.send(Packet(CONNECT, client_id="raw", clean=True))
        r.recv()
        r.send(Packet(PUBACK, pid=9), Packet(DISCONNECT))
        bad, faults = b.violations(mark)
        assert any("Puback received for msgid 9" in x for x in bad) and not faults, (bad, faults)
        said = b.statements()  # the statements it checked: of both versions (the raw client spoke 3.1.1)
        assert "MQTT-3.1.3-3" in said and any(x.startswith("MQTT5-") for x in said), said
    finally:
        b.stop()
