"""`tern fleet run --broker HOST:PORT`: a fleet against a broker the team runs (here a Mosquitto the test
starts, standing for it). The fleet starts no Mosquitto of its own; its boards, observer and
collectors all use that broker; a broker fault goes to the hook command, or is skipped and said so."""

import json

from ternlab.fleet import ExternalBroker, Fleet, parse_scenario
from ternlab.pytest_plugin import selected_profile_name

SCENARIO = {
    "boards": 1, "duration": 5.0, "warmup": 1.0, "settle": 20.0,
    "firmware": {"interval_ms": 200, "qos": [1, 2]},
    "faults": [{"kind": "broker_restart", "mode": "hard", "window": [2, 3]}],
}


def _run(request, broker, out, hook):
    sc = parse_scenario(dict(SCENARIO, profile=selected_profile_name(request.config)), name="external")
    f = Fleet(sc, seed=5, out=out, broker=ExternalBroker(broker.host, broker.port, hook=hook))
    try:
        return f.run()
    finally:
        f.stop()


def test_a_fleet_against_an_external_broker_starts_none_and_hands_its_faults_to_the_hook(request, broker, tmp_path):
    calls = tmp_path / "hook.log"
    result = _run(request, broker, tmp_path / "run", f'echo "$TERN_BROKER_FAULT $TERN_BROKER" >> {calls}')
    assert result.ok, "\n".join(result.failures)
    assert not (tmp_path / "run" / "broker").exists()  # no Mosquitto of the fleet's
    assert calls.read_text() == f"hard {broker.host}:{broker.port}\n"
    summary = json.loads((result.out / "summary.json").read_text())
    assert summary["broker"] == f"external {broker.host}:{broker.port}" and summary["skipped_faults"] == []
    assert result.ledger_rows > 5 and result.lost == []
    # the readings went through the test's broker
    log = broker.log_path.read_text()
    assert "board-000" in log and "fleet-observer-5" in log
    assert broker.running()  # the fleet left the team's broker alone


def test_without_a_hook_broker_faults_are_skipped_and_said(request, broker, tmp_path):
    result = _run(request, broker, tmp_path / "run", None)
    assert result.ok, "\n".join(result.failures)
    (skipped,) = [f for f in result.faults if f["kind"] == "broker_restart"]
    assert skipped["status"] == "skipped" and "no --broker-fault-hook" in skipped["detail"]
    summary = json.loads((result.out / "summary.json").read_text())
    assert [f["kind"] for f in summary["skipped_faults"]] == ["broker_restart"]
    assert broker.running()


def test_broker_options_are_checked_in_one_line(capsys):
    from ternlab.cli import main as tern

    assert tern(["fleet", "run", "smoke", "--broker", "mqtt.lab"]) == 2
    assert "--broker: must be HOST:PORT" in capsys.readouterr().err
    assert tern(["fleet", "run", "smoke", "--broker-fault-hook", "true"]) == 2
    assert "--broker-fault-hook needs --broker" in capsys.readouterr().err
