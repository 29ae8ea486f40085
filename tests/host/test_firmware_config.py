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
from firmwarekit import Device, Watcher, check_delivery


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


def test_a_host_with_its_port_is_named_on_the_console_and_the_board_runs_on_without_a_broker(tmp_path):
    # "host": "127.0.0.1:18831" passed every check; the board then logged only
    # {"err":"[addrinfo error -2]","ev":"connect_failed"} at each attempt, nothing naming the key.
    dev = Device(tmp_path, {"host": "127.0.0.1:18831", "client_id": "dev-1", "interval_ms": 30})
    try:
        dev.board.power_cycle()
        log = dev.until(lambda t: t.counts["published"] >= 5, 20, "readings after the bad host")
        assert log.counts["boot"] == 1 and not log.counts["crash"] and not dev.tracebacks, dict(log.counts)
        bad = said(log, "host")
        assert "put the port in `port`" in bad[0]["err"] and bad[0]["got"] == "127.0.0.1:18831", bad
        assert "unusable: no broker to connect to" in bad[1]["err"], bad  # and what that means
        assert not log.counts["connect_failed"], log.of("connect_failed")  # no dialling a name that is no name
    finally:
        dev.close()


def test_a_trailing_comma_is_read_as_micropythons_json_reads_it_and_the_check_says_so(tmp_path):
    # tern deploy's check said a trailing comma made "the board run on defaults, with no broker"; the board
    # (MicroPython's json skips commas) ran on the file's values. Both now say the same.
    from ternlab.boards import load_profile
    from ternlab.boards.config_check import check

    broker = Broker(tmp_path / "broker").start()
    watch = Watcher(broker.address)
    text = '{"host": "%s",\n "port": %d,\n "client_id": "dev-1", "interval_ms": 30,\n}' % broker.address
    (tmp_path / "config.json").write_text(text)
    notes = check(tmp_path / "config.json", load_profile("unix-emulated"))
    assert any("line 3 column 41: a trailing comma" in n and "the board uses the file's values" in n
               for n in notes), notes
    dev = Device(tmp_path, text)
    try:
        dev.board.power_cycle()
        log = dev.until(lambda t: len(t.ledger) >= 3 and t.counts["connected"], 20, "readings through the broker")
        assert not log.of("config"), log.of("config")  # no complaint: the board read every value
        want = {(r["device"], r["boot"], r["qos"], r["seq"]) for r in log.ledger[:3]}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not want <= set(watch.keys()):
            time.sleep(0.05)
        assert want <= set(watch.keys())
    finally:
        dev.close()
        watch.close()
        broker.stop()
