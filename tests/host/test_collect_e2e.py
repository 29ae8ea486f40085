"""End to end: devices on the MicroPython unix port -> Mosquitto -> two `tern collect` processes on one
shared subscription, one of them SIGKILLed mid-batch and restarted with the same id -> the Spark audit
(with the devices' ledger) finds no QoS 1 message lost."""

import json
import time

from devices.collecting import device_ledger, read_rows, start_collector, start_device

DEVICES, PER_DEVICE = 3, 300


def test_two_collectors_one_killed_mid_batch_lose_nothing(broker, spark, tmp_path):
    from ternlab.pipeline.audit import run_audit

    land = tmp_path / "landing"
    # c1 writes every 60 messages (or 10 s), so most of the time it holds received, unacknowledged ones
    c1 = start_collector(broker, land, "c1", "--batch-size", "60", "--batch-time", "10")
    c2 = start_collector(broker, land, "c2", "--batch-size", "40", "--batch-time", "0.5")
    c1_again = None
    try:
        for c in (c1, c2):
            c.wait_for(r"subscribed to \$share/tern/tern/\+/telemetry")
        devs = [start_device(broker, f"dev-{i}", PER_DEVICE, qos=1, interval_ms=8) for i in range(DEVICES)]
        # kill c1 once it has landed a batch and holds part of the next one
        deadline = time.monotonic() + 30
        while True:
            p = c1.progress()
            if p and p[0] >= 60 and 10 <= p[2] <= 45:
                break
            assert time.monotonic() < deadline, f"c1 never got mid-batch: {c1.lines[-5:]}"
            time.sleep(0.01)
        c1.kill()
        landed_by_c1 = sum(1 for r in read_rows(land) if r["collector"] == "c1")
        time.sleep(0.5)  # the devices go on publishing; Mosquitto keeps c1's share for its session
        c1_again = start_collector(broker, land, "c1", "--batch-size", "60", "--batch-time", "0.5")
        outs = [d.communicate(timeout=60)[0] for d in devs]
        ledger = []
        for out in outs:
            rows, done = device_ledger(out)
            assert done is not None and done["published"] == PER_DEVICE, out[-2000:]
            ledger += rows
        assert len(ledger) == DEVICES * PER_DEVICE
        # wait until everything has landed (or time runs out: the audit then says what is missing)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = {(r["device"], r["seq"]) for r in read_rows(land)}
            if len(got) >= len(ledger):
                break
            time.sleep(0.2)
    finally:
        rcs = [c.terminate() for c in (c2, c1_again) if c is not None]
        if c1.proc.poll() is None:
            c1.kill()
    assert rcs == [0, 0]
    s2, s1 = c2.summary(), c1_again.summary()
    # the restarted c1 got back what it held unacknowledged when it was killed (sent again, DUP set)
    assert s1["redelivered"] > 0, c1_again.lines
    assert landed_by_c1 > 0

    rows = read_rows(land)
    assert {r["collector"] for r in rows} == {"c1", "c2"}
    assert read_rows(land, quarantine=True) == []
    led_path = tmp_path / "ledger.jsonl"
    led_path.write_text("".join(json.dumps(r) + "\n" for r in ledger))
    summary = run_audit(spark, str(land), str(tmp_path / "audit"), ledger=str(led_path))
    print("c1 landed", landed_by_c1, "before SIGKILL | c1 again", s1, "| c2", s2, "| audit", summary["totals"])
    q1 = summary["per_qos"]["1"]
    assert q1["expected"] == DEVICES * PER_DEVICE
    assert q1["lost"] == 0 and q1["unexpected"] == 0
    assert q1["unique"] == DEVICES * PER_DEVICE
    assert q1["received"] == len(rows) == s1["landed"] + s2["landed"] + landed_by_c1
    assert summary["devices"] == DEVICES
    assert summary["verdict"]["ok"], summary["verdict"]
