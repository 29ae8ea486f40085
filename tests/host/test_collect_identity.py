"""One identity rule for QoS 2 in `tern collect`, live and after a restart, against a real Mosquitto: a
well-formed message is its (device, boot, payload q, seq) -- the audit's key -- and only payloads that
say q 2 are folded when they come again; a malformed one is its topic and bytes, recognised only as a
broker resend (DUP, same packet id), so the same bytes sent again on purpose are kept each time. The
landing set is read back with pyarrow."""

import time
from collections import Counter

from devices.collecting import publish_all, read_rows, start_collector
from ternlab.pipeline import schema

TOPIC = "tern/dev-i/telemetry"
Q1_SEQ5 = schema.make_payload("dev-i", 1, 5, 1, 1700000000.0, {"v": 1.0})  # seq 5 of the q=1 stream
Q2_SEQ5 = schema.make_payload("dev-i", 1, 5, 2, 1700000000.0, {"v": 2.0})  # seq 5 of the q=2 stream
STATUS = b"status: rebooting"                                               # malformed, sent again on purpose


def _counts(land):
    return (Counter((r["qos"], r["seq"]) for r in read_rows(land)),
            Counter(r["payload_raw"] for r in read_rows(land, quarantine=True)))


def _settle(c, timeout=20):
    """Until what arrived is written (the progress line says nothing waits; a copy answered as
    already landed never waits)."""
    time.sleep(0.3)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (c.progress() or (0, 0, 1))[2]:
        time.sleep(0.05)


def _run(broker, land, *phases):
    """One collector run per phase, each publishing its messages (delivered at the QoS given, fresh:
    new packet ids, no DUP) and stopping cleanly; returns each run's qos2_already_landed."""
    out = []
    for msgs in phases:
        c = start_collector(broker, land, "col-i", "--batch-time", "0.2")
        c.wait_for("subscribed to")
        for m in msgs:  # one at a time: each is taken before the next comes
            publish_all(broker, [(TOPIC, *m)], "pub-i")
            _settle(c)
        assert c.terminate() == 0
        out.append(c.summary()["qos2_already_landed"])
    return out


def test_the_same_seq_in_the_q1_and_the_q2_stream_are_two_messages(broker, tmp_path):
    # was: the second taken for a resend of the first (the key left out the payload's q), dropped
    land = tmp_path / "landing"
    assert _run(broker, land, [(Q1_SEQ5, 2), (Q2_SEQ5, 2), (Q2_SEQ5, 2)]) == [1]
    assert _counts(land)[0] == Counter({(1, 5): 1, (2, 5): 1})


def test_a_payload_that_says_q1_is_judged_alike_live_and_after_a_restart(broker, tmp_path):
    # was: delivered at QoS 2, suppressed as a resend while the collector ran (keyed on the delivery
    # QoS) and landed again after a restart (the rebuilt window keyed on the payload's q). Now the
    # payload's q decides both times: a q=1 message is at least once, each copy lands
    land = tmp_path / "landing"
    assert _run(broker, land, [(Q1_SEQ5, 2), (Q1_SEQ5, 2)], [(Q1_SEQ5, 2)]) == [0, 0]
    assert _counts(land)[0] == Counter({(1, 5): 3})
    # and a q=2 one lands once, live and after the restart, whatever QoS it was delivered with
    land = tmp_path / "landing2"
    assert _run(broker, land, [(Q2_SEQ5, 2), (Q2_SEQ5, 1)], [(Q2_SEQ5, 2), (Q2_SEQ5, 1)]) == [1, 2]
    assert _counts(land)[0] == Counter({(2, 5): 1})


def test_malformed_bytes_at_qos1_then_at_qos2_after_a_restart_are_kept(broker, tmp_path):
    # was: acknowledged and dropped, in neither landing nor quarantine (the rebuilt window took every
    # quarantine row's checksum, whatever its QoS)
    land = tmp_path / "landing"
    assert _run(broker, land, [(STATUS, 1)], [(STATUS, 2)]) == [0, 0]
    assert _counts(land)[1] == Counter({STATUS: 2})


def test_identical_malformed_payloads_at_qos2_are_kept_each_time(broker, tmp_path):
    # the suspicion (a device's repeated status string stored once) was right: the second copy was
    # folded into the first. A malformed payload is only recognised as a broker resend (DUP set,
    # the same packet id), which test_collect_qos2 covers
    land = tmp_path / "landing"
    assert _run(broker, land, [(STATUS, 2), (STATUS, 2), (STATUS, 2)]) == [0]
    assert _counts(land)[1] == Counter({STATUS: 3})
