"""The one judge of delivery (ternlab.pipeline.judge), from Tern's promise: a QoS >= 1 message that
publish() accepted must be delivered, a QoS 2 message exactly once; QoS 0 may be lost and QoS 1
duplicated. The landing it reads back is written by the collector's own LandingWriter."""

from collections import Counter

from ternlab.pipeline import schema
from ternlab.pipeline.judge import KEY, LandingIndex, message_key, tally, verdict
from ternlab.pipeline.landing import LandingWriter

TS = 1714521600.0


def row(device, boot, qos, seq):
    return {"device": device, "boot": boot, "qos": qos, "seq": seq, "topic": "t/%s" % device, "sent_ts": TS}


def test_a_message_is_its_stream_then_its_number():
    assert KEY == ("device", "boot", "qos", "seq")
    assert message_key(row("d1", 3, 2, 7)) == ("d1", 3, 2, 7)


def test_loss_fails_from_qos_1_and_duplicates_at_qos_2_only():
    ledger = [row("a", 1, q, s) for q in (0, 1, 2) for s in range(3)]
    copies = Counter(message_key(r) for r in ledger)
    lost, per_qos = tally(ledger, copies)
    assert lost == [] and verdict(per_qos) == {"ok": True, "reasons": []}

    del copies[("a", 1, 0, 1)]      # QoS 0: may be lost
    copies[("a", 1, 1, 2)] += 2     # QoS 1: at least once, two extra copies are fine
    lost, per_qos = tally(ledger, copies)
    assert lost == [] and verdict(per_qos)["ok"], per_qos

    del copies[("a", 1, 1, 0)]      # QoS 1 lost
    copies[("a", 1, 2, 1)] += 1     # QoS 2 twice
    lost, per_qos = tally(ledger, copies)
    assert [message_key(r) for r in lost] == [("a", 1, 1, 0)]
    assert per_qos[1] == {"lost": 1, "duplicated": 2} and per_qos[2] == {"lost": 0, "duplicated": 1}
    assert verdict(per_qos) == {"ok": False, "reasons": ["QoS 1: 1 message(s) lost",
                                                         "QoS 2: 1 message(s) duplicated"]}


def landing_columns(rows, first_idx, collector):
    n = len(rows)
    cols = {k: [r[k] for r in rows] for k in ("device", "boot", "seq", "qos", "topic", "sent_ts")}
    cols.update(recv_ts=[TS + 1] * n, recv_idx=list(range(first_idx, first_idx + n)), collector=[collector] * n,
                readings=[[]] * n, payload_raw=[None] * n, _q2=[None] * n)
    cols["_idx"] = cols["recv_idx"]
    assert set(schema.LANDING_FIELDS) <= set(cols)
    return cols


def test_the_landing_is_read_back_once_a_file_keyed_as_the_ledger(tmp_path):
    no_quarantine = {k: [] for k in (*schema.QUARANTINE_FIELDS, "_idx", "_q2")}
    ledger = [row("a", 1, 1, s) for s in range(4)] + [row("b", 2, 2, s) for s in range(3)]
    index = LandingIndex(tmp_path)
    assert index.refresh() == 0 and index.files() == 0

    LandingWriter(str(tmp_path), "col-1").commit(landing_columns(ledger[:5], 0, "col-1"), no_quarantine)
    assert index.refresh() == 5 and index.refresh() == 0  # a file is read once
    lost, per_qos = tally(ledger, index.copies)
    assert [message_key(r) for r in lost] == [("b", 2, 2, 1), ("b", 2, 2, 2)] and not verdict(per_qos)["ok"]

    # the second collector lands the rest, and one QoS 2 message again
    LandingWriter(str(tmp_path), "col-2").commit(landing_columns(ledger[4:], 100, "col-2"), no_quarantine)
    assert index.refresh() == 3 and index.rows == 8 and index.files() == 2
    assert index.by_collector == Counter({"col-1": 5, "col-2": 3}) and index.by_device == Counter({"a": 4, "b": 3})
    assert index.has(("b", 2, 2, 0)) and index.copies[("b", 2, 2, 0)] == 2
    lost, per_qos = tally(ledger, index.copies)
    assert lost == [] and verdict(per_qos) == {"ok": False, "reasons": ["QoS 2: 1 message(s) duplicated"]}


def test_python_and_spark_count_loss_and_duplicates_by_one_definition(spark, tmp_path):
    """The fleet judges its landing in Python (tally over LandingIndex), the audit in Spark: the same
    landing and ledger give the same lost and duplicated per QoS, including the cases where two
    definitions could part: a ledger row written twice (a console line read twice), a landed message
    the ledger does not list, QoS 0 losses, and duplicates at every QoS."""
    from ternlab.app_events import write_ledger
    from ternlab.pipeline.audit import run_audit

    no_quarantine = {k: [] for k in (*schema.QUARANTINE_FIELDS, "_idx", "_q2")}
    ledger = [row(d, b, q, s) for d in ("a", "b") for b in (1, 2) for q in (0, 1, 2) for s in range(6)]
    gone = {("a", 1, 1, 2), ("a", 2, 2, 5), ("b", 1, 0, 0), ("b", 2, 1, 0), ("b", 2, 1, 1)}
    landed = [r for r in ledger if message_key(r) not in gone]
    landed += [r for r in landed if message_key(r) in {("a", 1, 2, 3), ("b", 1, 1, 4), ("b", 2, 0, 2)}]
    landed.append(row("c", 1, 1, 0))  # landed, listed by no ledger row
    ledger.append(dict(ledger[7]))    # ("a", 1, 1, 1) twice in the ledger, landed once
    ledger.append(row("a", 1, 1, 2))  # ("a", 1, 1, 2) twice in the ledger, never landed: one loss

    LandingWriter(str(tmp_path / "landing"), "col-1").commit(landing_columns(landed, 0, "col-1"), no_quarantine)
    index = LandingIndex(tmp_path / "landing")
    index.refresh()
    lost, per_qos = tally(ledger, index.copies)
    python = {q: (c["lost"], c["duplicated"]) for q, c in per_qos.items()}
    assert python == {0: (0, 1), 1: (3, 1), 2: (1, 1)}, python  # QoS 0: tally counts no QoS 0 loss
    assert sorted(message_key(r) for r in lost) == sorted(k for k in gone if k[2])

    write_ledger(ledger, tmp_path / "ledger.jsonl")
    summary = run_audit(spark, str(tmp_path / "landing"), str(tmp_path / "audit"), ledger=str(tmp_path / "ledger.jsonl"))
    by_qos = {int(q): (c["lost"], c["duplicated"]) for q, c in summary["per_qos"].items()}
    for q in (1, 2):
        assert by_qos[q] == python[q], (q, by_qos, python)
    assert by_qos[0] == (1, python[0][1])  # the audit also counts QoS 0's loss, which does not fail
    assert verdict(per_qos)["reasons"] == summary["verdict"]["reasons"]
