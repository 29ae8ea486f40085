"""The harness's Mosquitto: generated config options checked against the real broker,
with paho-mqtt and a raw socket client (tern.codec) as the clients."""

import queue
import socket
import ssl
import stat
import time

import paho.mqtt.client as mqtt
import pytest

from tern.codec import Packet, encode
from tern.wire import CONNECT, PUBACK, PUBLISH, SUBACK, SUBSCRIBE
from ternlab.brokers.mosquitto import INSTALL_HINT, Broker, BrokerError, Listener, free_port, mosquitto_path, password_line

from rawmqtt import Raw  # noqa: E402

TIMEOUT = 5.0


# ---------------------------------------------------------------- clients

def paho(client_id="", clean_session=True, **kw):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                    clean_session=clean_session, protocol=mqtt.MQTTv311, **kw)
    c.messages = queue.Queue()
    c.connacks = queue.Queue()
    c.subacks = queue.Queue()
    c.on_message = lambda cl, ud, m: cl.messages.put(m)
    c.on_connect = lambda cl, ud, flags, rc, props: cl.connacks.put((flags, rc))
    c.on_subscribe = lambda cl, ud, mid, rcs, props: cl.subacks.put(rcs)
    return c


def paho_connect(c, addr, keepalive=30):
    c.connect(addr[0], addr[1], keepalive)
    c.loop_start()
    flags, rc = c.connacks.get(timeout=TIMEOUT)
    assert rc == 0, rc
    return flags


def paho_close(c):
    c.disconnect()
    c.loop_stop()


def subscribe(c, topic, qos=1):
    c.subscribe(topic, qos)
    rcs = c.subacks.get(timeout=TIMEOUT)
    assert [int(r.value) for r in rcs] == [qos]


def publish(c, topic, payload, qos=1):
    info = c.publish(topic, payload, qos=qos)
    info.wait_for_publish(TIMEOUT)
    assert info.is_published()


def drain(c, sentinel, timeout=TIMEOUT):
    """Messages received up to and including the one with payload `sentinel`."""
    out = []
    deadline = time.monotonic() + timeout
    while True:
        m = c.messages.get(timeout=max(0.01, deadline - time.monotonic()))
        out.append(m.payload)
        if m.payload == sentinel:
            return out


# ---------------------------------------------------------------- errors

def test_missing_mosquitto_names_the_install_command(tmp_path):
    missing = tmp_path / "no-such-mosquitto"
    with pytest.raises(BrokerError, match="apt-get install -y mosquitto") as e:
        Broker(tmp_path / "b", binary=missing).start()
    assert INSTALL_HINT in str(e.value) and str(missing) in str(e.value)
    with pytest.raises(BrokerError, match="not installed"):
        mosquitto_path(missing)


@pytest.mark.parametrize("kwargs, match", [
    ({"port": 0}, "port must be a port number"),
    ({"port": 70000}, "port must be a port number"),
    ({"max_inflight_messages": -1}, "max_inflight_messages must be a non-negative int"),
    ({"message_size_limit": "1k"}, "message_size_limit must be a non-negative int"),
    ({"users": {"a:b": "pw"}}, "must not contain ':'"),
    ({"users": {"": "pw"}}, "username must not be empty"),
    ({"users": {"alice": "pw\nroot"}}, "newline"),
    ({"tls_port": 8883}, "tls_port given without tls=True"),
    ({"listeners": [("127.0.0.1", 1884)]}, "Listener objects"),
])
def test_bad_options_are_refused_with_a_clear_error(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        Broker(tmp_path / "b", **kwargs)


def test_bad_listener_specs_are_refused():
    with pytest.raises(ValueError, match="'mqtt' or 'websockets'"):
        Listener(protocol="mqtt5")
    with pytest.raises(ValueError, match="require_certificate needs tls=True"):
        Listener(require_certificate=True)


def test_broker_that_cannot_start_says_why(tmp_path):
    with Broker(tmp_path / "a") as a:
        b = Broker(tmp_path / "b", port=a.port)  # the port is taken
        with pytest.raises(BrokerError, match="did not start"):
            b.start(timeout=2)
        assert not b.running()


# ---------------------------------------------------------------- persistence

def test_kill9_and_restart_keep_a_queued_qos1_message_for_a_persistent_session(tmp_path):
    b = Broker(tmp_path / "b", persistence=True).start()
    try:
        sub = paho("sub-1", clean_session=False)
        assert not paho_connect(sub, b.address).session_present
        subscribe(sub, "q/persist", 1)
        paho_close(sub)

        pub = paho("pub-1")
        paho_connect(pub, b.address)
        mark = b.save_mark()
        publish(pub, "q/persist", b"survives kill -9", qos=1)
        b.wait_saved(mark)  # mosquitto acks, then saves: see Broker's docstring
        paho_close(pub)

        port = b.port
        b.kill()
        assert not b.running()
        with pytest.raises(OSError):
            socket.create_connection(b.address, timeout=1).close()
        b.restart()
        assert b.port == port and b.running()

        sub = paho("sub-1", clean_session=False)
        assert paho_connect(sub, b.address).session_present
        m = sub.messages.get(timeout=TIMEOUT)
        assert (m.topic, m.payload, m.qos) == ("q/persist", b"survives kill -9", 1)
        paho_close(sub)
    finally:
        b.stop()


def test_a_broker_that_saves_every_minute_keeps_what_it_held_at_save_across_kill9(tmp_path):
    """autosave_seconds: no save per change (a large fleet's broker would rewrite its database for every
    message); save() writes it now, and a kill -9 after it keeps the queued message."""
    b = Broker(tmp_path / "b", persistence=True, autosave_seconds=60).start()
    try:
        assert "autosave_on_changes false" in b.config() and "autosave_interval 60" in b.config()
        sub = paho("sub-s", clean_session=False)
        paho_connect(sub, b.address)
        subscribe(sub, "q/saved", 1)
        paho_close(sub)
        pub = paho("pub-s")
        paho_connect(pub, b.address)
        publish(pub, "q/saved", b"kept by save()", qos=1)
        paho_close(pub)
        b.save()
        b.kill()
        b.restart()
        sub = paho("sub-s", clean_session=False)
        assert paho_connect(sub, b.address).session_present
        m = sub.messages.get(timeout=TIMEOUT)
        assert (m.topic, m.payload) == ("q/saved", b"kept by save()")
        paho_close(sub)
    finally:
        b.stop()
    with pytest.raises(ValueError, match="autosave_seconds must be a positive int"):
        Broker(tmp_path / "c", autosave_seconds=0)
    with pytest.raises(BrokerError, match="not running"):
        Broker(tmp_path / "d", persistence=True).save()


def test_without_packet_logging_the_log_keeps_connections_and_subscriptions_only(tmp_path):
    with Broker(tmp_path / "b", log_packets=False) as b:
        sub = paho("quiet-sub")
        paho_connect(sub, b.address)
        subscribe(sub, "quiet/#", 1)
        pub = paho("quiet-pub")
        paho_connect(pub, b.address)
        publish(pub, "quiet/t", b"x", qos=1)
        assert sub.messages.get(timeout=TIMEOUT).payload == b"x"
        paho_close(pub)
        paho_close(sub)
        log = b.log_path.read_text()
    assert "New client connected" in log and "quiet-pub" in log and "quiet/#" in log
    assert "PUBLISH" not in log and "PUBACK" not in log


def test_without_persistence_a_restart_forgets_the_session(tmp_path):
    b = Broker(tmp_path / "b").start()
    try:
        sub = paho("sub-2", clean_session=False)
        paho_connect(sub, b.address)
        subscribe(sub, "q/gone", 1)
        paho_close(sub)
        b.restart(hard=True)
        sub = paho("sub-2", clean_session=False)
        assert not paho_connect(sub, b.address).session_present
        paho_close(sub)
    finally:
        b.stop()


# ---------------------------------------------------------------- limits

def test_message_size_limit_drops_an_oversize_message(tmp_path):
    with Broker(tmp_path / "b", message_size_limit=100) as b:
        assert "message_size_limit 100" in b.config()
        sub = paho("size-sub")
        paho_connect(sub, b.address)
        subscribe(sub, "size/#", 1)
        pub = paho("size-pub")
        paho_connect(pub, b.address)
        publish(pub, "size/t", b"a" * 100)  # at the limit: delivered
        publish(pub, "size/t", b"b" * 101)  # over it: acknowledged but dropped
        publish(pub, "size/t", b"end")
        assert drain(sub, b"end") == [b"a" * 100, b"end"]
        paho_close(pub)
        paho_close(sub)


def test_max_inflight_messages_holds_back_unacknowledged_deliveries(tmp_path):
    with Broker(tmp_path / "b", max_inflight_messages=2) as b:
        sub = Raw(b.address)
        sub.connect("inflight-sub")
        sub.send(Packet(SUBSCRIBE, pid=1, topics=[("inf/t", 1)]))
        assert sub.recv().type == SUBACK

        pub = paho("inflight-pub")
        paho_connect(pub, b.address)
        for i in range(5):
            publish(pub, "inf/t", b"m%d" % i)  # all 5 accepted by the broker
        got = [sub.recv(), sub.recv()]
        assert [p.payload for p in got] == [b"m0", b"m1"]
        with pytest.raises(socket.timeout):
            sub.recv(timeout=0.3)  # a third would exceed max_inflight_messages
        seen = [bytes(p.payload) for p in got]
        for p in got:
            sub.send(Packet(PUBACK, pid=p.pid))
        while len(seen) < 5:
            p = sub.recv()
            assert p.type == PUBLISH
            seen.append(bytes(p.payload))
            sub.send(Packet(PUBACK, pid=p.pid))
        assert seen == [b"m%d" % i for i in range(5)]
        sub.close()
        paho_close(pub)


def test_max_queued_messages_caps_an_offline_session(tmp_path):
    with Broker(tmp_path / "b", max_queued_messages=3) as b:
        sub = paho("queued-sub", clean_session=False)
        paho_connect(sub, b.address)
        subscribe(sub, "queue/t", 1)
        paho_close(sub)

        pub = paho("queued-pub")
        paho_connect(pub, b.address)
        for i in range(6):
            publish(pub, "queue/t", b"m%d" % i)

        sub = paho("queued-sub", clean_session=False)
        assert paho_connect(sub, b.address).session_present
        publish(pub, "queue/t", b"end")
        # The first three were queued, the rest dropped as the queue was full.
        assert drain(sub, b"end") == [b"m0", b"m1", b"m2", b"end"]
        paho_close(pub)
        paho_close(sub)


# ---------------------------------------------------------------- TLS

def test_tls_listener_round_trips_for_a_client_that_verifies_the_generated_ca(tmp_path):
    with Broker(tmp_path / "b", tls=True) as b:
        assert b.tls_port not in (None, b.port)
        assert b.ca_path.exists()
        for host in ("127.0.0.1", "localhost"):  # the server certificate names both
            c = paho("tls-" + host)
            c.tls_set(ca_certs=str(b.ca_path), cert_reqs=ssl.CERT_REQUIRED)
            paho_connect(c, (host, b.tls_port))
            subscribe(c, "tls/t", 1)
            publish(c, "tls/t", b"over tls " + host.encode())
            m = c.messages.get(timeout=TIMEOUT)
            assert m.payload == b"over tls " + host.encode()
            paho_close(c)


def test_tls_listener_fails_verification_without_the_ca(tmp_path):
    with Broker(tmp_path / "b", tls=True) as b:
        c = paho("tls-no-ca")
        c.tls_set(cert_reqs=ssl.CERT_REQUIRED)  # the system's CAs only
        with pytest.raises(ssl.SSLCertVerificationError):
            c.connect(b.host, b.tls_port, 30)
        # and a CA of our own that did not sign the broker's certificate fails too
        from ternlab.brokers.certs import make_ca
        other = make_ca(tmp_path / "other", "Some other CA")
        c = paho("tls-wrong-ca")
        c.tls_set(ca_certs=str(other.cert_path), cert_reqs=ssl.CERT_REQUIRED)
        with pytest.raises(ssl.SSLCertVerificationError):
            c.connect(b.host, b.tls_port, 30)


def test_tls_listener_with_client_certificates(tmp_path):
    from ternlab.brokers.certs import make_cert
    with Broker(tmp_path / "b", listeners=[Listener(tls=True, require_certificate=True)]) as b:
        port = b.listeners[0].port
        cli = make_cert(b.ca, tmp_path / "client", "client", client=True, hosts=())
        c = paho("tls-client-cert")
        c.tls_set(ca_certs=str(b.ca_path), certfile=str(cli.cert_path), keyfile=str(cli.key_path))
        paho_connect(c, (b.host, port))
        paho_close(c)
        # Without a client certificate the handshake is refused.
        ctx = ssl.create_default_context(cafile=str(b.ca_path))
        with socket.create_connection((b.host, port), timeout=TIMEOUT) as s:
            with pytest.raises((ssl.SSLError, ConnectionError)):
                with ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:
                    t.sendall(encode(Packet(CONNECT, client_id="x")))
                    t.recv(10)  # TLS 1.3 reports the refusal on the first read


# ---------------------------------------------------------------- users

def test_password_file_accepts_the_right_credentials_and_refuses_others(tmp_path):
    with Broker(tmp_path / "b", users={"alice": "s3cret:x", "bob": "hunter2"}) as b:
        assert "allow_anonymous false" in b.config()
        assert stat.S_IMODE(b.passwd_path.stat().st_mode) == 0o600
        assert "s3cret" not in b.passwd_path.read_text()

        def connack(**kw):
            c = Raw(b.address)
            try:
                return c.connect("auth-test", expect=None, **kw).reason
            finally:
                c.close()

        assert connack(username="alice", password="s3cret:x") == 0
        assert connack(username="bob", password="hunter2") == 0
        assert connack(username="alice", password="wrong") == 5      # not authorized
        assert connack(username="alice", password="hunter2") == 5    # bob's password
        assert connack(username="mallory", password="s3cret:x") == 5
        assert connack() == 5                                        # anonymous

        c = paho("auth-paho")
        c.username_pw_set("bob", "hunter2")
        paho_connect(c, b.address)
        paho_close(c)


def test_password_line_is_the_mosquitto_passwd_format():
    line = password_line("carol", "pw")
    user, rest = line.split(":", 1)
    fields = rest.split("$")
    assert user == "carol" and fields[:3] == ["", "7", "101"]
    assert line != password_line("carol", "pw")  # a fresh salt each time


# ---------------------------------------------------------------- listeners

def test_extra_listener_shares_the_broker_and_keeps_its_port_across_restart(tmp_path):
    b = Broker(tmp_path / "b", listeners=[Listener()]).start()
    try:
        extra = b.listeners[0].port
        assert extra != b.port
        sub = paho("l-sub")
        paho_connect(sub, (b.host, extra))
        subscribe(sub, "l/t", 1)
        pub = paho("l-pub")
        paho_connect(pub, b.address)
        publish(pub, "l/t", b"across listeners")
        assert sub.messages.get(timeout=TIMEOUT).payload == b"across listeners"
        paho_close(pub)
        paho_close(sub)
        b.restart(hard=True)
        assert b.listeners[0].port == extra
        c = Raw((b.host, extra))
        assert c.connect("after-restart").reason == 0
        c.close()
    finally:
        b.stop()


# ---------------------------------------------------------------- loopback only

@pytest.mark.parametrize("where, line", [
    ("extra", "listener 1884"),                 # mosquitto binds every interface
    ("extra", "listener 1884 0.0.0.0"),
    ("extra", "listener 1884 192.168.1.10"),
    ("extra", "port 1884"),                     # the default listener, on every interface
    ("extra", "bind_address 0.0.0.0"),
    ("extra", "bind_interface eth0"),
    ("options", "bind_address 0.0.0.0"),
    ("options", "  Listener 1885"),
    ("extra", "#\nlistener 29507"),             # a newline: Mosquitto reads two lines, the second bound everywhere
    ("extra", "max_qos 1\r\nport 1884"),
    ("options", "max_connections 5\nbind_address 0.0.0.0"),
    ("extra", "max_qos 1\rlistener 1884"),      # any other control character
    ("extra", "include_dir /etc/mosquitto/conf.d"),  # its files' listeners were never checked
    ("extra", "plugin /usr/lib/x.so"),
    ("options", "auth_plugin /usr/lib/x.so"),
])
def test_a_config_line_that_would_listen_beyond_loopback_is_refused(tmp_path, where, line):
    with pytest.raises(ValueError, match="127.0.0.1 only"):
        kw = {"extra": [line]} if where == "extra" else {"listeners": [Listener(options=[line])]}
        Broker(tmp_path / "b", **kw)


def test_every_listener_written_binds_127_0_0_1(tmp_path):
    b = Broker(tmp_path / "b", tls=True, persistence=True, users={"u": "p"},
               listeners=[Listener(), Listener(tls=True, options=["max_connections 5"])],
               extra=["listener %d 127.0.0.1" % free_port(), "max_qos 1"])
    lines = [ln.split() for ln in b.config().splitlines()]
    listeners = [ln for ln in lines if ln and ln[0] == "listener"]
    assert len(listeners) == 5 and all(ln[2:] == ["127.0.0.1"] for ln in listeners)
    assert not [ln for ln in lines if ln and ln[0] in ("port", "bind_address", "bind_interface")]
