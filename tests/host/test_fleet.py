"""Fleets of emulated boards running the telemetry firmware against Mosquitto under seeded faults.

The default run takes one small seeded sample of every fault kind; `-m slow` runs 16 boards for a
minute on this machine and measures what they cost (docs/fleet.md)."""

import json
import os
import re
import time
from collections import Counter
from pathlib import Path

import pytest

from ternlab.cli import main as tern
from ternlab.fleet import Callbacks, custody, load_scenario
from ternlab.pipeline.schema import LEDGER_FIELDS

ROOT = Path(__file__).resolve().parents[2]

EVERY_FAULT = {
    "boards": 2, "duration": 9.0, "warmup": 1.5, "settle": 30.0,
    "firmware": {"interval_ms": 150, "qos": [1, 2, 0]},
    "faults": [
        # the flash-op cut comes early with a small N so that it has fired (a few readings later) well
        # before the timed cut, which may draw the same board
        {"kind": "power_cut", "at": "flash_op", "flash_ops": [3, 12], "off": [0.2, 0.5], "window": [1.5, 2]},
        {"kind": "power_cut", "at": "time", "off": [0.2, 0.5], "window": [7, 8]},
        {"kind": "network_cut", "length": [1.0, 1.5], "window": [2, 4]},
        # graceful: Mosquitto acknowledges (PUBACK/PUBCOMP) before it saves, so a SIGKILL can lose what it
        # had acknowledged but not yet delivered -- the broker's loss, not the device's (docs/qos2-restart.md)
        {"kind": "broker_restart", "mode": "soft", "window": [5, 6]},
    ],
}


class Recorder(Callbacks):
    def __init__(self):
        self.phases, self.records, self.events, self.ticks, self.ended = [], [], Counter(), 0, None

    def on_phase(self, name):
        self.phases.append(name)

    def on_fault(self, record):
        self.records.append(record)

    def on_event(self, board, event):
        self.events[(board, event["ev"])] += 1

    def on_tick(self, fleet):
        self.ticks += 1
        assert set(fleet.progress()) == set(fleet.board_names)

    def on_end(self, result):
        self.ended = result


def read_jsonl(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def test_a_seeded_fleet_survives_every_kind_of_fault(fleet):
    rec = Recorder()
    f = fleet(seed=3, callbacks=rec, **EVERY_FAULT)
    result = f.run()
    assert result.ok, "\n".join(result.failures)
    assert rec.ended is result and rec.phases == ["starting", "running", "settling", "stopping", "done"]
    assert rec.ticks > 20
    # every fault happened and ended, logged with time and target
    by = {}
    for r in rec.records:
        by.setdefault(r.fault.kind + "/" + r.fault.params.get("at", ""), []).append(r.status)
    assert by["power_cut/flash_op"] == ["armed", "fired", "restored"]
    assert by["power_cut/time"] == ["injected", "restored"]
    assert by["network_cut/"] == ["injected", "restored"]
    assert by["broker_restart/"] == ["injected", "restored"]
    logged = read_jsonl(result.out / "faults.jsonl")
    assert [(x["kind"], x["status"], x["target"]) for x in logged] == [
        (r.fault.kind, r.status, r.target) for r in rec.records]
    assert all(x["t"] >= x["scheduled_t"] for x in logged)
    # the ledger is the pipeline's, each QoS >= 1 row reached the subscriber, sequences run 0..n-1
    ledger = read_jsonl(result.out / "ledger.jsonl")
    assert ledger and all(tuple(r) == LEDGER_FIELDS for r in ledger)
    got = {(x["device"], x["boot"], x["seq"], x["qos"]) for x in read_jsonl(result.out / "received.jsonl")}
    assert {(r["device"], r["boot"], r["seq"], r["qos"]) for r in ledger if r["qos"]} <= got
    assert {r["qos"] for r in ledger} == {0, 1, 2}
    assert sum(b["power_cuts"] for b in result.boards.values()) == 2
    assert sum(b["boots"] for b in result.boards.values()) >= 2 + 3  # a flash-op cut costs two boots
    for name in f.board_names:
        assert rec.events[(name, "published")] == result.boards[name]["published"] > 10
        assert (result.out / "boards" / name / "console.log").stat().st_size > 0
    summary = json.loads((result.out / "summary.json").read_text())
    assert summary["seed"] == 3
    if custody.available():
        # the boards talk to the broker directly, and a board whose power fails vanishes: its broker
        # learns of it when the next boot takes the session over, not from a closed connection
        assert summary["relays"] is False and not list(result.out.glob("boards/*/packets.jsonl"))
        log = (result.out / "broker" / "mosquitto.log").read_text()
        assert log.count("already connected, closing old connection") >= 2, "a power cut closed the connection"
    # a network cut takes the board's Wi-Fi link down and ends its connection (if it had one: the
    # board may have been off or booting); the app sees its link go
    cut = next(r for r in rec.records if r.fault.kind == "network_cut" and r.status == "injected")
    n = int(re.search(r"(\d+) connection\(s\) cut", cut.detail).group(1))
    assert n <= 2, cut.detail  # its connection, and at most one left open by a power cut just before
    if n:
        assert '"link lost"' in (result.out / "boards" / cut.target / "console.log").read_text()


def test_with_relays_each_boards_packets_are_logged_on_the_ledgers_clock(fleet):
    f = fleet(seed=4, relay=True, boards=1, duration=4.0, warmup=1.0, settle=20.0,
              firmware={"interval_ms": 150, "qos": [1, 2, 0]},
              faults=[{"kind": "network_cut", "length": [0.5, 0.8], "window": [1.5, 2]},
                      {"kind": "power_cut", "at": "time", "off": [0.2, 0.3], "window": [3, 3.5]}])
    result = f.run()
    assert result.ok, "\n".join(result.failures)
    summary = json.loads((result.out / "summary.json").read_text())
    assert summary["relays"] is True
    ledger = read_jsonl(result.out / "ledger.jsonl")
    # the offset puts the proxy's packet times on the ledger's clock: each board's first reading left
    # (a PUBLISH through its proxy) after its timestamp and within a second of it
    for name in f.board_names:
        first = min((r for r in ledger if r["device"] == name), key=lambda r: r["sent_ts"])
        sent = [p["t"] + summary["wall_minus_monotonic"] for p in read_jsonl(result.out / "boards" / name / "packets.jsonl")
                if p.get("direction") == "c2b" and p.get("type") == "PUBLISH"]
        assert any(first["sent_ts"] <= t < first["sent_ts"] + 1.0 for t in sent), (first, sent[:3])


def test_the_command_line_names_a_bad_key_and_prints_seed_and_replay_on_failure(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('duration = 5\n[[faults]]\nkind = "network_cut"\nlenght = 2\n')
    assert tern(["fleet", "run", str(bad), "--seed", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"tern fleet run: {bad}: unknown key 'faults[0].lenght' (known here: count, kind, length, per_board, window)"
    assert tern(["fleet", "run", str(bad), "--seed", "-3"]) == 2
    assert "--seed: must be a non-negative integer" in capsys.readouterr().err
    # a run that breaks down (its output directory cannot be made) still says how to replay it
    blocker = tmp_path / "file"
    blocker.write_text("")
    smoke = ROOT / "scenarios" / "smoke.toml"
    assert tern(["fleet", "run", str(smoke), "--seed", "5", "--boards", "3", "--out", str(blocker / "x"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "seed=5\n" in err
    assert f"replay: tern fleet run {smoke} --seed 5 --boards 3 --duration 12\n" in err


def _proc_stats(pid):
    """(rss bytes, cpu seconds) of a live process from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return rss, (int(fields[11]) + int(fields[12])) / tick


class Meter(Callbacks):
    """Samples every board process (RSS, CPU time), the broker and the observer during the run."""

    def __init__(self):
        self.rss = {}
        self.cpu = {}
        self.broker = (0, 0.0)
        self.observer = 0.0
        self.fleet = None

    def on_start(self, fleet):
        self.fleet = fleet

    def on_tick(self, fleet):
        for s in fleet.slots:
            pid = s.board.pid if s.board is not None and s.board.is_on else None
            st = _proc_stats(pid) if pid else None
            if st:
                self.rss[s.name] = max(self.rss.get(s.name, 0), st[0])
                self.cpu[(s.name, pid)] = st[1]
        if fleet.broker.proc is not None:
            st = _proc_stats(fleet.broker.proc.pid)
            if st:
                self.broker = (max(self.broker[0], st[0]), st[1])
        if fleet.observer is not None and fleet.observer.proc is not None:
            st = _proc_stats(fleet.observer.proc.pid)
            if st:
                self.observer = st[1]


@pytest.mark.slow
def test_sixteen_boards_for_a_minute_on_this_machine(fleet):
    """Scale: 16 boards under the demo's fault mix; prints the figures docs/fleet.md quotes."""
    meter = Meter()
    s = load_scenario(ROOT / "scenarios" / "demo.toml").with_overrides(boards=16, duration=60)
    cpu0 = os.times()
    t0 = time.monotonic()
    result = fleet(s, seed=16, callbacks=meter).run()
    wall = time.monotonic() - t0
    cpu1 = os.times()
    assert result.ok, "\n".join(result.failures)
    boards_cpu = sum(meter.cpu.values())
    host_cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    rss = sorted(meter.rss.values())
    published = sum(b["published"] for b in result.boards.values())
    print(f"\nFLEET16 wall={wall:.1f}s boards=16 published={published} ledger={result.ledger_rows} "
          f"faults={len(result.faults)} lost={len(result.lost)}\n"
          f"FLEET16 board RSS max={rss[-1] / 2**20:.1f} MiB median={rss[len(rss) // 2] / 2**20:.1f} MiB "
          f"sum={sum(rss) / 2**20:.1f} MiB\n"
          f"FLEET16 board CPU total={boards_cpu:.1f}s ({100 * boards_cpu / wall / 16:.1f}% of a core per board)\n"
          f"FLEET16 runner CPU={host_cpu:.1f}s ({100 * host_cpu / wall:.1f}% of a core) "
          f"observer CPU={meter.observer:.1f}s "
          f"broker RSS={meter.broker[0] / 2**20:.1f} MiB CPU={meter.broker[1]:.1f}s")
    assert len(rss) == 16


def test_a_second_run_into_the_same_directory_starts_afresh(fleet, tmp_path):
    # The replay line names the same output directory. A second run used to reuse the boards' flash
    # images (their outboxes, boot counters and the earlier run's "stop measuring" interval command,
    # which the firmware keeps), so it barely measured; the broker's and collectors' files leaked too.
    quiet = {"boards": 1, "duration": 3.0, "warmup": 0.5, "settle": 15.0, "faults": [],
             "firmware": {"interval_ms": 100, "qos": [1]}}
    runs = [fleet(seed=5, out=tmp_path / "same", **quiet).run() for _ in range(2)]
    assert all(r.ok for r in runs), [r.failures for r in runs]
    first, second = (r.boards["board-000"] for r in runs)
    assert first["published"] > 10 and second["published"] >= first["published"] // 2, (first, second)
    assert second["boots"] == 1, second  # a fresh board: not the first run's boots plus one
