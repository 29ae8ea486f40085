"""The telemetry firmware over TLS, on an emulated board (the MicroPython unix port, its mbedtls)
against Mosquitto's TLS listener.

The CA goes on the board's flash as the PEM file users have (`ca` names it), or as DER; the
firmware decodes PEM to DER on the device, which MicroPython's mbedtls needs. Readings are watched on the broker's
plain port, so what arrives there went through the board's TLS connection.
"""

import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from ternlab.brokers import certs
from ternlab.brokers.mosquitto import Broker, Listener
from firmwarekit import Device, Watcher, check_delivery

N = 12  # readings per run


@pytest.fixture
def tls_broker(tmp_path):
    b = Broker(tmp_path / "broker", tls=True).start()
    yield b
    b.stop()


def tls_device(tmp_path, port, ca_pem=None):
    """A board configured for TLS to 127.0.0.1:port, with ca_pem (bytes) as ca.pem on its flash."""
    cfg = {"host": "127.0.0.1", "port": port, "tls": True, "client_id": "dev-tls",
           "interval_ms": 40, "qos": 1, "count": N, "backoff_min_ms": 100, "backoff_max_ms": 300}
    if ca_pem is not None:
        cfg["ca"] = "ca.pem"
    dev = Device(tmp_path, cfg)
    if ca_pem is not None:
        dev.board.write_file("ca.pem", ca_pem)
    return dev


def delivered(dev, watch, timeout=15):
    """Wait until every reading of the ledger reached the watcher; returns the QoS >= 1 count."""
    ledger = list(dev.pump().ledger)
    want = {(r["device"], r["boot"], r["qos"], r["seq"]) for r in ledger}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not want <= set(watch.keys()):
        time.sleep(0.05)
    return check_delivery(ledger, watch.keys())


@pytest.mark.parametrize("form", ["pem", "der"])
def test_tls_with_the_broker_ca_on_flash_delivers_readings(tmp_path, tls_broker, form):
    ca = tls_broker.ca_path.read_bytes()
    if form == "der":
        ca = x509.load_pem_x509_certificate(ca).public_bytes(Encoding.DER)
    watch = Watcher(tls_broker.address)
    dev = tls_device(tmp_path, tls_broker.tls_port, ca)
    try:
        dev.board.power_cycle()
        log = dev.until(lambda t: t.counts["done"], 30, f"{N} readings over TLS")
        assert delivered(dev, watch) == N
        assert log.counts["connected"] >= 1 and not log.counts["connect_failed"], dict(log.counts)
        assert not [e for e in log.of("config") if e.get("key") == "ca"], log.of("config")
    finally:
        dev.close()
        watch.close()


def test_a_wrong_ca_is_reported_by_key_readings_wait_then_go_out_once_it_is_fixed(tmp_path, tls_broker):
    other = certs.make_ca(tmp_path / "other", "A CA that did not sign the broker")
    watch = Watcher(tls_broker.address)
    dev = tls_device(tmp_path, tls_broker.tls_port, other.cert_path.read_bytes())
    try:
        dev.board.power_cycle()
        log = dev.until(lambda t: t.counts["connect_failed"] >= 3 and t.counts["done"], 30,
                        "failed TLS connections while the readings queue")
        failed = log.of("connect_failed")
        assert all(e.get("key") == "ca" and "not correctly signed by the trusted CA" in e["err"]
                   for e in failed), failed
        time.sleep(0.5)
        dev.pump()
        assert log.boots == [0] and not log.counts["crash"] and not dev.tracebacks, dict(log.counts)
        assert not log.counts["connected"] and not watch.got, watch.got
        assert len(log.ledger) == N  # accepted into the outbox, waiting
        # the right CA on flash (in a PEM bundle after the wrong one: every certificate is loaded) and
        # a reboot: what waited in the outbox goes out
        dev.board.write_file("ca.pem", other.cert_path.read_bytes() + tls_broker.ca_path.read_bytes())
        dev.pump()
        dev.tracebacks = 0  # writing a file stops the app with Ctrl-C (raw REPL): not a fault of its own
        dev.board.power_cycle()
        dev.until(lambda t: t.counts["connected"] >= 1 and t.counts["boot"] >= 2, 20, "a connection with the right CA")
        dev.until(lambda t: t.counts["done"] >= 2, 30, "the second boot's readings")
        assert delivered(dev, watch) == 2 * N
    finally:
        dev.close()
        watch.close()


def test_tls_without_a_ca_fails_closed_unless_insecure_is_true(tmp_path, tls_broker):
    # `"tls": true` without `ca` connected unverified (a warning on the console): now no connection
    # until the config names a CA or says `"insecure": true`.
    watch = Watcher(tls_broker.address)
    dev = tls_device(tmp_path, tls_broker.tls_port)
    try:
        dev.board.power_cycle()
        log = dev.until(lambda t: t.counts["connect_failed"] >= 2 and t.counts["done"], 30,
                        "failed TLS connections without a CA")
        assert not log.counts["connected"], "connected unverified"
        said = [e for e in log.of("config") if e.get("key") == "ca"]
        assert said and "insecure" in said[0]["err"], log.of("config")
        assert log.boots == [0] and not log.counts["crash"], dict(log.counts)
    finally:
        dev.close()
    dev = Device(tmp_path, {"host": "127.0.0.1", "port": tls_broker.tls_port, "tls": True, "insecure": True,
                            "client_id": "dev-tls2", "interval_ms": 40, "qos": 1, "count": N,
                            "backoff_min_ms": 100, "backoff_max_ms": 300}, name="board2")
    try:
        dev.board.power_cycle()
        log = dev.until(lambda t: t.counts["done"], 30, f"{N} readings over unverified TLS")
        warned = [e for e in log.of("config") if e.get("key") == "insecure"]
        assert warned and "not verified" in warned[0]["err"], log.of("config")
        assert delivered(dev, watch) == N
    finally:
        dev.close()
        watch.close()


def test_a_certificate_for_another_host_is_reported_by_key(tmp_path):
    # a listener whose certificate (signed by the CA the board has) names only elsewhere.example
    ca = certs.make_ca(tmp_path / "ca", "Elsewhere CA")
    cert = certs.make_cert(ca, tmp_path / "ca", "elsewhere", hosts=("elsewhere.example",))
    b = Broker(tmp_path / "broker", listeners=[Listener(options=[
        f"cafile {ca.cert_path}", f"certfile {cert.cert_path}", f"keyfile {cert.key_path}"])]).start()
    dev = tls_device(tmp_path, b.listeners[0].port, ca.cert_path.read_bytes())
    try:
        dev.board.power_cycle()
        log = dev.until(lambda t: t.counts["connect_failed"] >= 2, 20, "failed TLS connections")
        failed = log.of("connect_failed")
        assert all(e.get("key") == "host" and "Common Name (CN) does not match" in e["err"] for e in failed), failed
        assert log.boots == [0] and not log.counts["connected"] and not log.counts["crash"], dict(log.counts)
    finally:
        dev.close()
        b.stop()


def test_a_tls_or_ca_value_that_is_unusable_fails_closed(tmp_path, tls_broker):
    # A value given but unusable used to become the default: `"ca": 5` connected unverified, `"tls":
    # "yes"` connected in plain text with the password. Now: TLS verified against no CA, every
    # connection fails and says so, readings wait in the outbox.
    base = {"host": "127.0.0.1", "client_id": "dev-tls", "interval_ms": 40, "qos": 1, "count": 3,
            "backoff_min_ms": 100, "backoff_max_ms": 300, "user": "u", "password": "pw-not-sent"}
    cases = [({"port": tls_broker.tls_port, "tls": True, "ca": 5}, "ca"),
             ({"port": tls_broker.address[1], "tls": "yes"}, "tls")]
    for i, (cfg, key) in enumerate(cases):
        dev = Device(tmp_path, {**base, **cfg}, name=f"board{i}")
        try:
            dev.board.power_cycle()
            log = dev.until(lambda t: t.counts["connect_failed"] >= 2 and t.counts["done"], 20,
                            f"failed connections with an unusable {key}")
            assert not log.counts["connected"], f"{key}: connected anyway (unverified or in plain text)"
            assert [e for e in log.of("config") if e.get("key") == key], log.of("config")
            if key == "ca":  # (tls without a ca is unverified TLS only with "insecure": true)
                assert not [e for e in log.of("config") if "not verified" in e.get("err", "")], log.of("config")
            assert log.boots == [0] and not log.counts["crash"] and len(log.ledger) == 3, dict(log.counts)
        finally:
            dev.close()
