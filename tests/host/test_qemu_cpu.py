"""Instructions per message on the stock qemu boards of both ISAs (qemu-m3-esp32: Cortex-M3;
qemu-rv32-c3: RISC-V RV32), counted (issue 26, issue 37): QEMU runs with `-icount shift=0` and
`qboard.icount()` reads the instructions executed, whatever the host's load, so each figure is a
property of the code, not of this machine. tools/bench/cpu_bench.py measures them (beside
umqtt.simple) for docs/benchmarks.md; this holds Tern's own within a stated headroom, both ways: a
path that got dearer fails, and so does a counter that stopped counting."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "bench"))
import cpu_bench  # noqa: E402

from qemukit import ISAS  # noqa: E402

# Instructions per message as measured on 2026-12-02 (this test's 24 messages, 16 received) on the stock
# boards, Tern in place from ROMFS (issue 37), budgets rounded up to the next thousand. On the Cortex-M3:
# 28,940 / 126,568 / 76,527 / 135,245 / 99,845; the same build with Tern frozen counted 25,108 / 112,722
# for the first two and 97,368 received (each function of a .mpy run in place keeps its code object on
# the heap, which the collections inside the regions scan). Before issue 37 (frozen, no network UART):
# 24,055 / 101,230 / 72,491 / 154,520 / 108,725. The RV32 takes 9-18 % more instructions than Thumb-2.
CASES = {
    "QoS 0 publish": ("tern_qos0", {}),
    "QoS 1 + PUBACK, MemoryStore": ("tern_qos1", {}),
    "QoS 1, window 8": ("tern_window", {}),
    "QoS 1 + PUBACK, FlashStore": ("tern_qos1", {"store": cpu_bench.FLASH}),
    "receive a QoS 1 message": ("tern_rx", {}),
}
BUDGET = {
    "qemu-m3-esp32": dict(zip(CASES, (29_000, 127_000, 77_000, 136_000, 100_000))),
    "qemu-rv32-c3": dict(zip(CASES, (32_000, 143_000, 89_000, 160_000, 113_000))),
}
HEADROOM = 1.25  # the heap's layout moves a count by a few per cent between builds; a GC inside a region more


@pytest.fixture(scope="module", params=list(ISAS), ids=list(ISAS.values()))
def bench(request, tmp_path_factory):
    from ternlab.brokers.mosquitto import Broker

    d = tmp_path_factory.mktemp("cpu")
    with Broker(d / "broker") as broker:
        b = cpu_bench.Bench(broker, d / "board", request.param, with_umqtt=False, with_mpy=False)
        b.profile = request.param
        yield b
        b.close()


@pytest.mark.parametrize("label", CASES)
def test_instructions_per_message_stay_within_budget(bench, label):
    case, kw = CASES[label]
    budget = BUDGET[bench.profile][label]
    got = bench.run(case, n=24, m=16, **kw)
    print("%s, %s: %d instructions per message (budget %d)" % (bench.profile, label, got, budget))
    assert budget / 2 < got <= budget * HEADROOM, "%s, %s: %d instructions per message, budget %d (x%.2f)" % (
        bench.profile, label, got, budget, HEADROOM)
