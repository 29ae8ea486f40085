"""A collector's own files: names that carry its exact id (no prefix or escaping collisions between
`col` and `col-2`, `a/b` and `a_b`), a start that removes only what is provably its own, one process per
id and landing, and a restart that reads a bounded part of the landing however old it is."""

import json
import os
import time

import pyarrow.parquet as pq
import pytest

from devices.collecting import parquet_files, publish_all, read_rows, start_collector
from ternlab.pipeline import landing as L
from ternlab.pipeline import schema

HOUR = "date=2026-01-02/hour=03"


def _touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"half written")
    return path


def test_a_start_removes_only_its_own_unfinished_files(broker, tmp_path):
    # was: starting `col` removed `.tmp-col-2-...` (col-2's file in progress, matched by the prefix
    # `.tmp-col-`), and `a_b` removed the files of `a/b` (the same safe_name)
    land = tmp_path / "landing"
    others = [
        _touch(land / HOUR / ".tmp-col-2-part-col-2-00000000000000000001.parquet"),  # older versions' temps
        _touch(land / "quarantine" / HOUR / ".tmp-col-2-q-col-2-00000000000000000002.parquet"),
        _touch(land / HOUR / ".tmp-a_b-part-a_b-00000000000000000003.parquet"),
        _touch(land / ".tern" / "col-2" / "tmp" / "part-col-2-00000000000000000004.parquet"),
        _touch(land / ".tern" / "a~2Fb" / "tmp" / "part-a~2Fb-00000000000000000005.parquet"),
    ]
    own = [_touch(land / ".tern" / "col" / "tmp" / "part-col-00000000000000000006.parquet"),
           _touch(land / ".tern" / "a_b" / "tmp" / "q-a_b-00000000000000000007.parquet")]
    for cid, n in (("col", 1), ("a_b", 1)):
        c = start_collector(broker, land, cid)
        c.wait_for("subscribed to")
        assert c.terminate() == 0
        assert any(f"removed {n} temporary file(s)" in ln for ln in c.lines), c.lines
    assert all(p.exists() for p in others)
    assert not any(p.exists() for p in own)


def test_ids_that_share_a_safe_name_keep_their_files_apart(broker, tmp_path):
    land = tmp_path / "landing"
    cs = [start_collector(broker, land, cid, "--batch-time", "0.2", "--group", cid.replace("/", "-"))
          for cid in ("a/b", "a_b")]
    for c in cs:
        c.wait_for("subscribed to")
    publish_all(broker, [(f"tern/d/telemetry", schema.make_payload("d", 1, s, 2, 1.0, {}), 2)
                         for s in range(5)], "pub-f")
    time.sleep(1)
    for c in cs:
        assert c.terminate() == 0
    for f in parquet_files(land):
        cid = pq.read_metadata(f).metadata[b"tern.collector"].decode()
        assert f.name.startswith(f"part-{L.collector_tag(cid)}-"), f
    assert sorted(r["collector"] for r in read_rows(land)) == ["a/b"] * 5 + ["a_b"] * 5
    assert L.collector_tag("a/b") == "a~2Fb" and L.collector_tag("a_b") == "a_b"
    assert L.collector_tag("..") == "~2E." and L.collector_tag("col") != L.collector_tag("col-2")
    long_ids = ["x" * 200, "x" * 199 + "y", "\u00e9" * 60]
    assert len({L.collector_tag(i) for i in long_ids}) == 3
    assert all(len(L.collector_tag(i)) <= L.MAX_TAG for i in long_ids)
    # the same id twice on one landing: the second is refused before it connects
    first = start_collector(broker, land, "a/b")
    first.wait_for("subscribed to")
    second = start_collector(broker, land, "a/b")
    assert second.proc.wait(20) == 1
    assert any("another collector with --id 'a/b' is running" in ln for ln in second.lines), second.lines
    assert first.terminate() == 0


def _commit(w, first_idx, seqs, qos, ts=1767322800.0, collector="col"):
    """One commit of landing rows (device d, boot 1), as the collector hands them to the writer."""
    import hashlib

    def key(s):  # qos2.message_key: the window's identity of a q=2 reading
        text = json.dumps(["d", 1, 2, s])
        return hashlib.blake2b(text.encode(), digest_size=8, person=b"tern.message").digest()

    n = len(seqs)
    rows = {"device": ["d"] * n, "boot": [1] * n, "seq": list(seqs), "qos": [qos] * n, "topic": ["t"] * n,
            "sent_ts": [ts] * n, "recv_ts": [ts] * n, "recv_idx": list(range(first_idx, first_idx + n)),
            "collector": [collector] * n, "readings": [[]] * n, "payload_raw": [None] * n,
            "_q2": [None] * n, "_win": [key(s) if qos == 2 else None for s in seqs]}
    rows["_idx"] = rows["recv_idx"]
    no_q = {k: [] for k in (*schema.QUARANTINE_FIELDS, "_idx", "_q2")}
    w.commit(rows, no_q)


def test_a_restart_reads_only_the_newest_files_of_a_large_landing(broker, tmp_path):
    """300 commits over 300 hours, a QoS 2 reading in every 10th; every file's access time set to 0, so
    the files `tern collect` reads while it starts are the ones whose access time moves (relatime
    updates it on the first read). It reads the newest 3 and recognises a reading of the oldest commit
    when it comes again."""
    land = tmp_path / "landing"
    w = L.LandingWriter(land, "col-r")
    w.check()
    for k in range(300):
        _commit(w, 1000 * k + 1, [k], 2 if k % 10 == 0 else 1, ts=1767322800.0 + 3600 * k, collector="col-r")
    getattr(w, "close", lambda: None)()  # (the lock a running collector holds)
    files = parquet_files(land)
    assert len(files) == 300
    probe = files[0]
    os.utime(probe, (0, probe.stat().st_mtime))
    probe.read_bytes()
    if probe.stat().st_atime == 0:
        pytest.skip("this filesystem does not update access times (noatime): reads cannot be seen")
    for f in files:
        os.utime(f, (0, f.stat().st_mtime))
    c = start_collector(broker, land, "col-r", "--batch-time", "0.2")
    c.wait_for("subscribed to")
    read = [f for f in files if f.stat().st_atime > 0]
    assert len(read) <= 3, f"the start read {len(read)} of 300 files"
    publish_all(broker, [("tern/d/telemetry", schema.make_payload("d", 1, 0, 2, 1.0, {}), 2)], "pub-r")  # seq 0: the oldest commit
    time.sleep(0.5)
    assert c.terminate() == 0
    assert c.summary()["qos2_already_landed"] == 1 and c.summary()["landed"] == 0


@pytest.fixture
def reads(monkeypatch):
    """Every landing file the collector's code opens (footer or columns)."""
    opened = []
    for name in ("read_metadata", "read_table"):
        real = getattr(L.pq, name)

        def spy(path, *a, _real=real, **k):
            opened.append(str(path))
            return _real(path, *a, **k)
        monkeypatch.setattr(L.pq, name, spy)
    return opened


def test_a_restart_reads_the_window_log_not_the_landing(tmp_path, reads):
    # was: with little QoS 2 traffic the window never filled, so every start read every file the
    # collector ever landed (2,000 files: 2.2 s) before it connected
    from ternlab.pipeline import qos2

    w = L.LandingWriter(tmp_path, "col", window=50)
    w.check()
    w.window_keys()
    for k in range(300):  # 300 commits over 300 hours: QoS 1, and a QoS 2 reading every 10th
        _commit(w, 1000 * k + 1, [k], 2 if k % 10 == 0 else 1, ts=1767322800.0 + 3600 * k)
    want = [qos2.message_key("d", 1, 2, k) for k in range(0, 300, 10)]
    del reads[:]
    again = L.LandingWriter(tmp_path, "col", window=50)
    assert again.window_keys() == want
    assert len(reads) == 1, reads  # the newest file's footer: the log has reached its commit
    del reads[:]
    assert again.last_record() == {}
    assert len(reads) == 2, reads  # the newest commit's footer, and the one before (another commit)

    # a crash between a commit's rename and its log block: that commit is read from its file
    _commit(again, 10**9, [7, 8], 2, ts=1767322800.0 + 3600 * 400)
    log = again.log.path
    data = open(log, "rb").read()
    open(log, "wb").write(data[:-5])  # the last block torn
    del reads[:]
    third = L.LandingWriter(tmp_path, "col", window=50)
    assert third.window_keys() == want[-48:] + [qos2.message_key("d", 1, 2, s) for s in (7, 8)]
    assert len(reads) == 3, reads  # the torn commit's file (footer, columns), the footer before it

    # a landing written before collectors kept a log: read once, newest first, until the window is full
    os.unlink(log)
    del reads[:]
    fourth = L.LandingWriter(tmp_path, "col", window=5)
    assert fourth.window_keys() == want[-3:] + [qos2.message_key("d", 1, 2, s) for s in (7, 8)]
    assert len(reads) == 2 * 31  # footer and columns of the newest 31 files (of 301): 5 keys
    del reads[:]
    assert L.LandingWriter(tmp_path, "col", window=5).window_keys() == want[-3:] + [
        qos2.message_key("d", 1, 2, s) for s in (7, 8)]
    assert len(reads) == 1  # and the log written then serves the next start
