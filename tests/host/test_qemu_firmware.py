"""The telemetry firmware on the qemu boards (MicroPython's qemu port): the same app and the same fault
runs as tests/host/test_firmware.py, on microcontroller firmware -- on the stock boards of both ISAs
(Cortex-M3 and RISC-V RV32) with the app in their ROMFS partition, and frozen into qemu-m3-tight's
image. The outbox is a FlashStore on the board's NOR flash model (native, written through to the
host); the app dials the chaos proxy in front of a real Mosquitto through the board's sockets."""

import pytest

from firmwarekit import Device, check_1000_readings_with_100_pending, check_delivery, run_under_faults

from qemukit import BOTH_ISAS


@BOTH_ISAS
def test_qemu_readings_survive_power_cuts_at_flash_operations(tmp_path, qemu_profile):
    # power fails at seeded random flash operations (torn writes), the network is cut, the broker
    # restarts: every accepted QoS >= 1 reading arrives, QoS 2 exactly once. (FlashStore programs a
    # record in one write since 1cf45db: a boot's 150 readings take fewer operations than 30-250 reached.)
    ledger, keys, log, faults = run_under_faults(tmp_path, n_readings=150, n_cuts=2, n_net_cuts=2, seed=7,
                                                 profile=qemu_profile, cut_ops=(15, 110))
    assert check_delivery(ledger, keys) >= 90
    assert [f[0] for f in faults].count("power cut") == 2, faults
    assert log.boots == [0, 1, 2], log.boots
    assert log.recovered() >= 1, "no boot recovered anything from the outbox: the cuts did not test it"
    assert {e["store"] for e in log.of("boot")} == {"flash"}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [21, 22])
def test_qemu_readings_survive_faults_long(tmp_path, seed):
    ledger, keys, log, faults = run_under_faults(tmp_path, n_readings=600, n_cuts=6, n_net_cuts=8, seed=seed,
                                                 profile="qemu-m3-esp32")
    assert check_delivery(ledger, keys) >= 390
    assert len(log.boots) == 7, (log.boots, faults)


def test_qemu_tight_heap_runs_1000_readings_with_100_pending(tmp_path):
    # the full app with FlashStore, frozen, in the qemu-m3-tight profile's 32 KiB heap: 1,000 QoS 1
    # readings with an outage that leaves more than 100 pending
    check_1000_readings_with_100_pending(tmp_path, "qemu-m3-tight")


def test_qemu_tight_boots_over_a_full_outbox(tmp_path):
    # No broker: the app fills its FlashStore outbox up to max_pending (160) and drops the rest. Each
    # power-on after that recovers all 160 in the 32 KiB heap: the scan that built its index in a dict
    # of lists after the client had taken its buffers raised MemoryError in FlashStore.open at every
    # boot (a boot loop over the board's own outbox).
    from ternlab.brokers.mosquitto import free_port

    cfg = {"host": "127.0.0.1", "port": free_port(), "client_id": "dev-1", "interval_ms": 10, "qos": 1,
           "count": 170, "max_pending": 160, "backoff_min_ms": 20, "backoff_max_ms": 100}
    dev = Device(tmp_path, cfg, profile="qemu-m3-tight")
    try:
        dev.board.power_cycle()
        log = dev.until(lambda t: t.counts["done"] or t.counts["crash"], 60, "the readings")
        assert log.of("done")[0]["pending"] == 160, log.of("done")
        for k in range(1, 5):
            dev.board.power_off()
            dev.board.power_on()
            log = dev.until(lambda t: len(t.of("boot")) > k or t.counts["crash"], 30, "boot %d" % k)
            assert not log.counts["crash"], [x.text for x in dev.board.log.lines[-14:]]
            assert log.of("boot")[k]["recovered"] == 160, log.of("boot")[k]
    finally:
        dev.close()
