"""`tern fleet run --broker HOST:PORT`: a fleet against a broker the team runs (here a Mosquitto the test
starts, standing for it). The fleet starts no Mosquitto of its own; its boards, observer and
collectors all use that broker; a broker fault goes to the hook command, or is skipped and said so."""

import json

import pytest

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


PASSWORD = "fleet-pw-7c1d9e"


@pytest.fixture
def tls_broker(tmp_path):
    """The team's broker as it should be: TLS only for the fleet, a password file, no anonymous clients."""
    from ternlab.brokers.mosquitto import Broker

    b = Broker(tmp_path / "tls-broker", tls=True, users={"fleet": PASSWORD}, persistence=True).start()
    yield b
    b.stop()


def test_a_fleet_against_a_tls_broker_with_a_password_file_logs_in_everywhere_and_says_the_password_nowhere(
        request, tls_broker, tmp_path):
    from ternlab.fleet.login import BrokerLogin

    spec = dict(SCENARIO, profile=selected_profile_name(request.config), collectors={"count": 1},
                faults=[{"kind": "power_cut", "at": "time", "window": [1, 4]}])
    sc = parse_scenario(spec, name="tls")
    host, port = tls_broker.tls_address
    out = tmp_path / "run"
    f = Fleet(sc, seed=9, out=out, broker=ExternalBroker(host, port),
              tls=BrokerLogin(str(tls_broker.ca_path), "fleet", PASSWORD))
    try:
        result = f.run()
    finally:
        f.stop()
    assert result.ok, "\n".join(result.failures)
    assert result.ledger_rows > 5 and result.lost == [] and result.landing["lost"] == 0
    # every client of the fleet logged in as the user, on the TLS listener (the only one it was given)
    log = tls_broker.log_path.read_text()
    for client in ("board-000", "fleet-observer-9", "collector-1", "fleet-commander-board-000"):
        assert any(f"as {client} " in ln and "u'fleet'" in ln for ln in log.splitlines()), client
    assert f"on port {port}" in log
    summary = json.loads((out / "summary.json").read_text())
    assert summary["broker"] == f"external {host}:{port} (TLS verified with {tls_broker.ca_path}, user fleet with a password)"
    # the password is in no log, summary, fault log or console (only the boards' own config.json on their flash)
    for p in out.rglob("*"):
        if p.is_file() and p.suffix in (".log", ".json", ".jsonl", ".txt"):
            assert PASSWORD not in p.read_text(errors="replace"), p


def test_a_wrong_password_fails_at_the_start_naming_no_password(request, tls_broker, tmp_path):
    from ternlab.fleet.login import BrokerLogin

    sc = parse_scenario(dict(SCENARIO, profile=selected_profile_name(request.config), faults=[]), name="tls")
    f = Fleet(sc, seed=9, out=tmp_path / "run", broker=ExternalBroker(*tls_broker.tls_address),
              tls=BrokerLogin(str(tls_broker.ca_path), "fleet", "not-the-" + PASSWORD))
    with pytest.raises(RuntimeError) as e:
        try:
            f.run()
        finally:
            f.stop()
    assert "did not subscribe" in str(e.value) and PASSWORD not in str(e.value)


def test_login_options_are_checked(capsys, tmp_path):
    from ternlab.cli import main as tern

    assert tern(["fleet", "run", "smoke", "--cafile", "ca.pem"]) == 2
    assert "--cafile needs --broker" in capsys.readouterr().err
    assert tern(["fleet", "run", "smoke", "--broker", "127.0.0.1:1", "-P", PASSWORD]) == 2
    err = capsys.readouterr().err
    assert "-P/--pw needs --username" in err and PASSWORD not in err
    assert tern(["fleet", "run", "smoke", "--broker", "127.0.0.1:1", "--cafile", str(tmp_path / "none.pem")]) == 2
    assert "--cafile" in capsys.readouterr().err
