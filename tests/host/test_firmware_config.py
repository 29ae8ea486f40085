"""Values the telemetry firmware must survive without a reboot: a config value the client would
refuse at its first publish or connect, and a broker whose CONNACK forbids what the config asks for.

Each was a crash in the main loop before (main.py prints it, waits 30 s and resets: the same crash at
every boot, a slow boot loop with the boot counter climbing). Now each is one console line, naming the
config key where there is one, and the device runs on.
"""

import json
import time

import pytest

from ternlab.brokers.mosquitto import Broker
from test_firmware import Device, Watcher, check_delivery


def said(log, key):
    return [e for e in log.of("config") if e.get("key") == key]


def test_values_the_client_would_refuse_are_reported_by_key_and_the_device_runs_on(tmp_path):
    cfg = {"client_id": "dev-1", "interval_ms": 30,
           "cmd_topic": "tern/a\u0000b",              # U+0000: SUBSCRIBE at boot raised ValueError
           "status_topic": "s/" + "x" * 600,          # longer than the 512-byte transmit buffer
           "readings": ["tmep", "temp"],              # a typo: that sensor was silently never read
           "version": 4, "password": "hunter2",       # MQTT 3.1.1 sends a password only with a user
           "tls": True, "port": "abc"}                # a bad port with TLS fell back to 1883, not 8883
    dev = Device(tmp_path, json.dumps(cfg))
    try:
        dev.board.power_cycle()
        log = dev.until(lambda t: t.counts["published"] >= 5, 20, "readings after the bad values")
        time.sleep(0.5)
        dev.pump()
        assert log.counts["boot"] == 1 and not log.counts["crash"] and not dev.tracebacks, dict(log.counts)
        assert "U+0000" in said(log, "cmd_topic")[0]["err"], log.of("config")
        assert said(log, "cmd_topic")[0]["using"] == "tern/{id}/cmd"
        assert "tx_size" in said(log, "status_topic")[0]["err"], log.of("config")
        assert said(log, "readings")[0]["got"] == "tmep", log.of("config")
        assert all(set(e["m"]["r"]) == {"temp"} for e in log.of("published")), log.of("published")[:2]
        assert "password" in said(log, "user")[0]["err"], log.of("config")
        assert said(log, "port")[0]["using"] == 8883, said(log, "port")
        text = "\n".join(x.text for x in dev.board.log.lines)
        assert "hunter2" not in text, "the password was printed"
    finally:
        dev.close()


def test_a_broker_with_maximum_qos_1_gets_the_qos_1_readings_and_qos_2_is_dropped_not_a_crash(tmp_path):
    # CONNACK Maximum QoS 1 (as AWS IoT Core says): publish() refuses QoS 2 with ValueError
    broker = Broker(tmp_path / "broker", extra=["max_qos 1"]).start()
    watch = Watcher(broker.address)
    cfg = {"host": broker.address[0], "port": broker.address[1], "client_id": "dev-1", "interval_ms": 30,
           "qos": [1, 2]}
    dev = Device(tmp_path, cfg)
    try:
        dev.board.power_cycle()
        log = dev.until(lambda t: len(t.ledger) >= 6 and t.counts["dropped"] >= 6, 20,
                        "QoS 1 readings published, QoS 2 dropped")
        time.sleep(0.5)
        dev.pump()
        assert log.counts["boot"] == 1 and not log.counts["crash"] and not dev.tracebacks, dict(log.counts)
        assert {r["qos"] for r in log.ledger} == {1}
        dropped = log.of("dropped")
        assert all(e["q"] == 2 and "Maximum QoS" in e["err"] for e in dropped), dropped[:3]
        ledger = list(log.ledger)
        want = {(r["device"], r["boot"], r["qos"], r["seq"]) for r in ledger}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not want <= set(watch.keys()):
            time.sleep(0.05)
        assert check_delivery(ledger, watch.keys()) == len(ledger)
    finally:
        dev.close()
        watch.close()
        broker.stop()


@pytest.mark.parametrize("sizes, reset", [
    ({"max_pending": 65535}, ["max_pending"]),
    ({"rx_size": 200000}, ["rx_size"]),
    ({"tx_size": 65535, "rx_size": 65536}, ["rx_size", "tx_size"]),
    ({"rx_size": 49152, "tx_size": 4096, "max_pending": 4000}, []),  # 65,248 bytes: within a quarter, kept
])
def test_buffers_over_a_quarter_of_the_heap_fall_back_to_defaults_instead_of_a_boot_loop(tmp_path, sizes, reset):
    # Values the checker accepted raised MemoryError in Session.__init__ on the 256 KiB profile: crash,
    # 30 s, reset, crash. Now the largest goes back to its default until rx_size + tx_size +
    # 3 x max_pending fits in a quarter of the profile's heap (65,536 bytes), one line per key.
    dev = Device(tmp_path, {"client_id": "dev-1", "interval_ms": 30, **sizes})
    try:
        dev.board.power_cycle()
        log = dev.until(lambda t: t.counts["published"] >= 3, 20, "readings after the oversize buffers")
        assert log.counts["boot"] == 1 and not log.counts["crash"] and not dev.tracebacks, dict(log.counts)
        said = [e for e in log.of("config") if e.get("key") in ("rx_size", "tx_size", "max_pending")]
        assert [e["key"] for e in said] == reset, log.of("config")
        defaults = {"rx_size": 4096, "tx_size": 512, "max_pending": 256}
        for e in said:
            assert e["got"] == sizes[e["key"]] and e["using"] == defaults[e["key"]], e
            assert "65536 bytes" in e["err"], e
    finally:
        dev.close()
