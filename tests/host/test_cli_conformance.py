"""`tern pub` against brokers that break or predate MQTT 5, played byte for byte by the scripted
broker (ternlab.brokers.scripted): a PUBACK answering QoS 2 (RabbitMQ 3.10), an MQTT 3.1.1 refusal of an MQTT 5
CONNECT (aedes, RabbitMQ, amqtt). The library side is tests/lib/test_scripted.py."""

from ternlab import cli
from ternlab.brokers.scripted import ScriptedBroker
from tern.codec import Packet, encode
from tern.wire import CONNECT, CONNACK, PUBLISH, PUBACK


def _play(capsys, script, *argv):
    b = ScriptedBroker(script).start()
    try:
        capsys.readouterr()
        rc = cli.main(["pub", "-h", b.host, "-p", str(b.port)] + list(argv))
        out, err = capsys.readouterr()
    finally:
        b.stop()
    assert not b.errors and b.complete, b.errors
    return rc, err


def test_tern_pub_qos2_to_a_broker_that_answers_puback_fails_and_says_why(capsys):
    # `tern pub -q 2` used to wait for ever for a PUBCOMP that never comes
    hello = [("recv_type", CONNECT), ("send", encode(Packet(CONNACK), 4))]
    pub = encode(Packet(PUBLISH, topic="t", payload=b"m", qos=2, pid=1), 4)
    rc, err = _play(capsys, [hello + [("recv", pub), ("send", encode(Packet(PUBACK, pid=1), 4)), ("eof",)]],
                    "-t", "t", "-m", "m", "-q", "2", "-i", "cli")
    assert rc == 1, (rc, err)
    assert "QoS 2 message 1 with PUBACK (it does not do QoS 2: publish at QoS 1 to this broker)" in err, err


def test_tern_pub_mqtt5_to_an_mqtt311_broker_names_the_version(capsys):
    refused = [("recv_type", CONNECT), ("send", bytes((0x20, 2, 0, 1)))]
    rc, err = _play(capsys, [refused], "-t", "t", "-m", "m", "-V", "5")
    assert rc == 1 and "the broker does not support MQTT 5" in err, (rc, err)
