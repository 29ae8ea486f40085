"""QoS 2 lands exactly once across a collector crash: `tern collect` SIGKILLed (by its test-only fault
hook, TERN_COLLECT_FAULT) right after a batch's files were renamed and before any PUBREC left -- the
window where the broker still holds those messages and sends them again, DUP set, to the restarted
collector. The landing files carry the record of the QoS 2 packet ids they hold; the restarted collector
answers those resends without landing them a second time. A real Mosquitto; the landing set is read back
with pyarrow, not with the collector's code."""

import os
import time
from collections import Counter

import pyarrow.parquet as pq
import pytest

from devices.collecting import parquet_files, publish_all, read_rows, start_collector
from ternlab.pipeline import schema

N = 50
BAD = {5: b"not json", 12: b'{"d": "x", "b": 1, "s": -4, "q": 2}'}  # quarantined, QoS 2 too


def messages():
    """N QoS 2 messages on the firmware's topic; two of them malformed (they go to quarantine)."""
    out = []
    for s in range(N):
        payload = BAD.get(s) or schema.make_payload("dev-q", 1, s, 2, 1700000000.0 + s, {"temp": 20.0 + s})
        out.append(("tern/dev-q/telemetry", payload, 2))
    return out


def publish(broker, msgs):
    publish_all(broker, msgs, "pub-q2")


def wait_landed(land, n, timeout=20):
    """Until n messages are landed or quarantined (or timeout: the assertions that follow say what)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows, quarantined = landed(land)
        if sum(rows.values()) + sum(quarantined.values()) >= n:
            return
        time.sleep(0.1)


def landed(land):
    """(Counter of landed (device, seq), Counter of quarantined payloads)."""
    return (Counter((r["device"], r["seq"]) for r in read_rows(land)),
            Counter(r["payload_raw"] for r in read_rows(land, quarantine=True)))


@pytest.mark.parametrize("fault", ["kill-after-commit:1", "kill-after-ack:1"])
def test_qos2_lands_exactly_once_across_a_kill_between_rename_and_pubrec(broker, tmp_path, fault):
    land = tmp_path / "landing"
    env = dict(os.environ, TERN_COLLECT_FAULT=fault)
    # a batch is written at 20 messages; the broker may send up to 40 unacknowledged (Receive Maximum)
    c = start_collector(broker, land, "col-q2", "--batch-size", "20", "--batch-time", "30", env=env)
    c.wait_for(r"subscribed to \$share/tern/tern/\+/telemetry at QoS 2")
    publish(broker, messages())
    assert c.proc.wait(20) == -9, c.lines[-10:]  # SIGKILLed itself in the window
    c.kill()
    rows, quarantined = landed(land)
    first = sum(rows.values()) + sum(quarantined.values())
    assert first >= 20 and max(rows.values()) == 1  # one batch landed (more may have been received)
    files = parquet_files(land)
    meta = pq.read_metadata(files[0]).metadata
    assert meta[b"tern.collector"] == b"col-q2"

    # restarted with the same id: the broker sends every message without PUBREC again (DUP set)
    again = start_collector(broker, land, "col-q2", "--batch-size", "20", "--batch-time", "0.3")
    again.wait_for(r"session present: 1")
    wait_landed(land, N)
    time.sleep(0.5)  # a duplicate would land within a batch time
    assert again.terminate() == 0
    s = again.summary()

    rows, quarantined = landed(land)
    want = Counter(("dev-q", seq) for seq in range(N) if seq not in BAD)
    assert rows == want, f"duplicates {+(rows - want)} missing {+(want - rows)}"
    assert quarantined == Counter(BAD.values())
    if fault == "kill-after-commit:1":
        # every landed message came back unacknowledged: each answered, none landed again
        assert s["qos2_already_landed"] == first, again.lines
    else:
        # the broker had the PUBRECs: it sent PUBRELs (completed), no PUBLISH came back
        assert s["qos2_already_landed"] == 0, again.lines
    assert s["landed"] + s["quarantined"] == N - first

    # the broker holds nothing more for this id: no PUBLISH, no PUBREL left half done
    third = start_collector(broker, land, "col-q2", "--batch-time", "0.2")
    third.wait_for(r"session present: 1")
    time.sleep(0.4)
    assert third.terminate() == 0
    s3 = third.summary()
    assert s3["landed"] == s3["redelivered"] == s3["qos2_already_landed"] == 0


def test_qos2_pubrec_lost_with_the_connection_is_answered_not_landed_again(broker, chaos, tmp_path):
    """No crash: the connection breaks at the collector's 5th PUBREC (after its batch was written),
    so the broker has not released the messages from that one on and sends them again (DUP set) on
    the new connection. The live process still knows it sent those PUBRECs (the session's inbound
    QoS 2 ids): each resend is answered, none lands twice, and nothing stays at the broker."""
    from ternlab.brokers.chaos import B2C, C2B

    land = tmp_path / "landing"
    chaos.cut_at_packet("PUBREC", 5, C2B, connections=1)
    c = start_collector(broker, land, "col-cut", "--batch-size", "20", "--batch-time", "0.3",
                      port=chaos.address[1])
    c.wait_for("subscribed to")
    publish(broker, messages())
    c.wait_for(r"connection lost")
    wait_landed(land, N)
    time.sleep(0.5)
    assert c.terminate() == 0
    rows, quarantined = landed(land)
    assert rows == Counter(("dev-q", seq) for seq in range(N) if seq not in BAD)
    assert quarantined == Counter(BAD.values())
    again = [p.pid for p in chaos.packets(B2C, "PUBLISH") if p.conn > 1]
    assert 5 in again  # the broker did send the un-released ones again
    third = start_collector(broker, land, "col-cut", "--batch-time", "0.2")
    third.wait_for(r"session present: 1")
    time.sleep(0.4)
    assert third.terminate() == 0 and third.summary()["landed"] == 0


def _rows(n, first_idx, ts, q2):
    """Landing columns of n QoS 2 rows, as the collector hands them to LandingWriter.commit."""
    cols = {"device": ["d"] * n, "boot": [1] * n, "seq": list(range(n)), "qos": [2] * n,
            "topic": ["t"] * n, "sent_ts": [ts] * n, "recv_ts": [ts] * n,
            "recv_idx": list(range(first_idx, first_idx + n)), "collector": ["col"] * n,
            "readings": [[]] * n, "payload_raw": [None] * n, "_q2": [q2(i) for i in range(n)]}
    cols["_idx"] = cols["recv_idx"]
    return cols


def test_a_commit_cut_between_its_files_records_only_what_was_renamed(tmp_path):
    """A batch spanning two hours is two files, renamed one after the other; when the second cannot
    be written, the first one's record holds its own QoS 2 entries and the carried ones, not the
    second file's (those messages are not on disk: their resends must land)."""
    from ternlab.pipeline.landing import LandingError, LandingWriter
    from ternlab.pipeline.qos2 import payload_key as qos2_key

    w = LandingWriter(tmp_path, "col")
    h = 1700000000 - 1700000000 % 3600
    rows = _rows(6, 100, h + 3599.5, lambda i: (10 + i, qos2_key("t", b"%d" % i)))
    rows["recv_ts"][3:] = [h + 3600.5] * 3  # rows 3..5 fall into the next hour
    q = {k: [] for k in (*schema.QUARANTINE_FIELDS, "_idx", "_q2")}
    date, hour = schema.partition_values(h + 3600.5)
    (tmp_path / f"date={date}").mkdir(parents=True, exist_ok=True)
    (tmp_path / f"date={date}" / f"hour={hour}").write_text("in the way")
    carried = {7: b"k" * 8}
    with pytest.raises(LandingError, match="a file is in the way"):
        w.commit(rows, q, carried)
    assert len(parquet_files(tmp_path)) == 1
    want = {**carried, **{10 + i: qos2_key("t", b"%d" % i) for i in range(3)}}
    assert LandingWriter(tmp_path, "col").last_record() == want
    assert LandingWriter(tmp_path, "other").last_record() == {}


@pytest.mark.parametrize("hard, persistence", [(False, True), (True, True), (True, False)],
                         ids=["soft-restart", "hard-restart", "state-lost"])
def test_qos2_lands_once_across_a_broker_restart_between_publish_and_pubcomp(tmp_path, hard, persistence):
    """The broker restarts (SIGTERM, or SIGKILL) while every QoS 2 message of the collector's first
    batch is between PUBLISH and PUBCOMP: the proxy holds the collector's packets from its 11th PUBREC
    on, so the broker has the PUBRECs of 1-10 (and waits for their PUBCOMPs) and none of 11-20. With
    persistence the broker sends what it kept again; without (``state-lost``) it comes back empty and
    the publisher, whose session went with it, publishes all 40 again (as a device must: they were
    never completed for it) -- new packet ids, no DUP. Either way each message is recognised by what
    it is (topic and reading) and lands exactly once. The landing set is read back with pyarrow."""
    from ternlab.brokers.mosquitto import Broker
    from ternlab.brokers.chaos import C2B, ChaosProxy

    msgs = [("tern/dev-r/telemetry", schema.make_payload("dev-r", 1, s, 2, 1700000000.0 + s, {"v": s}), 2)
            for s in range(40)]
    with Broker(tmp_path / "broker", persistence=persistence) as broker, \
            ChaosProxy(broker.address, seed=1) as proxy:
        land = tmp_path / "landing"
        proxy.stall_at_packet("PUBREC", 11, C2B, 60, stall_direction=C2B, connections=1)
        c = start_collector(broker, land, "col-r2", "--batch-size", "20", "--batch-time", "0.3",
                          port=proxy.address[1])
        c.wait_for("subscribed to")
        publish_all(broker, msgs, "pub-r2")
        c.wait_for(r"landed (2\d|[3-9]\d)", after=0)  # the first batch is on disk, its PUBRECs sent
        assert proxy.wait_for(lambda: len(proxy.packets(C2B, "PUBREC")) >= 10, 5)
        time.sleep(1.1)  # the broker's PUBRELs of 1-10 went out (PUBCOMPs held); autosave_interval 1
        broker.restart(hard=hard)
        c.wait_for("subscribed again", after=c.at)
        if not persistence:
            publish_all(broker, msgs, "pub-r2")
        wait_landed(land, 40, timeout=30)
        time.sleep(1.5)  # a second copy would land within a batch time
        assert c.terminate() == 0
        rows, _ = landed(land)
        assert rows == Counter(("dev-r", s) for s in range(40)), \
            f"duplicates {+(rows - Counter(rows.keys()))} missing {set(range(40)) - {k[1] for k in rows}}"
        if not persistence:
            assert c.summary()["qos2_already_landed"] >= 20, c.lines[-20:]
        # nothing stays at the broker: a later collector with the same id gets nothing
        again = start_collector(broker, land, "col-r2", "--batch-time", "0.2")
        again.wait_for(r"session present: 1")
        time.sleep(0.5)
        assert again.terminate() == 0 and again.summary()["landed"] == 0
        assert landed(land)[0] == rows


def test_the_qos2_window_outlives_the_collector(broker, tmp_path):
    """The window is rebuilt from the collector's own window log and landing files: a collector restarted with the
    same id recognises the device's fresh publication (new packet ids, no DUP) of QoS 2 readings it
    landed before it stopped, and lands none of them again -- QoS 1 copies are not held back."""
    land = tmp_path / "landing"
    q2 = [m for m in messages() if m[1] not in BAD.values()][:20]
    q1 = [("tern/dev-q/telemetry", schema.make_payload("dev-q", 1, 100 + s, 1, 1.0, {}), 1) for s in range(5)]
    c = start_collector(broker, land, "col-w", "--batch-time", "0.2")
    c.wait_for("subscribed to")
    publish(broker, q2 + q1)
    wait_landed(land, 25)
    assert c.terminate() == 0
    again = start_collector(broker, land, "col-w", "--batch-time", "0.2", "--qos2-window", "1000")
    again.wait_for("subscribed to")
    publish(broker, q2 + q1)
    wait_landed(land, 30)
    time.sleep(0.5)
    assert again.terminate() == 0
    rows, _ = landed(land)
    assert [n for (_, s), n in sorted(rows.items()) if s < 100] == [1] * 20
    assert [n for (_, s), n in sorted(rows.items()) if s >= 100] == [2] * 5  # QoS 1: at least once
    assert again.summary()["qos2_already_landed"] == 20
