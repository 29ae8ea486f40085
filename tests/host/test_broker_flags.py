"""`tern collect` and `tern pub`/`tern sub` share one broker-flag dialect (ternlab.mqttcli.flags), and the
`-d` trace reads packets with the library's own fixed-header and varint code (ternlab.mqttcli.packet_trace)."""

import ssl

import pytest

from ternlab import cli
from ternlab.pipeline.collect_cli import check_args


def collect_args(*argv):
    args = cli.build_parser(["collect"]).parse_args(["collect", "land", *argv])
    return args, check_args(args)


def test_collect_takes_the_flags_of_pub_and_sub():
    args, problem = collect_args("-i", "c1", "-u", "u", "--pw", "s", "-V", "mqttv311", "-k", "30")
    assert problem is None
    assert (args.id, args.version, args.keepalive, args.port, args.password_bytes, args.ssl) == \
        ("c1", 4, 30, 1883, b"s", None)
    args, problem = collect_args("--id", "c1", "-u", "u", "--password", "s")  # the old spelling stays
    assert problem is None and args.password_bytes == b"s" and args.version == 5  # collect's default: MQTT 5
    args, problem = collect_args("--id", "c1", "--tls-use-os-certs")
    assert problem is None and args.port == 8883 and isinstance(args.ssl, ssl.SSLContext)
    assert args.ssl.verify_mode == ssl.CERT_REQUIRED and args.ssl.check_hostname


@pytest.mark.parametrize("argv, message", [
    (["--cert", "c.pem", "--key", "k.pem"], "--cert needs TLS: give --cafile, --capath or --tls-use-os-certs"),
    (["--insecure"], "--insecure needs TLS"),
    (["--cafile", "/nonexistent/ca.pem"], "cannot load --cafile /nonexistent/ca.pem"),
    (["-V", "4"], "protocol version must be 31, 311 or 5"),
    (["-k", "70000"], "--keepalive must be 5..65535"),
])
def test_collect_broker_flag_errors_are_those_of_pub_and_sub(argv, message, capsys):
    assert cli.main(["collect", "land", "--id", "c", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("cmd, status", [(["pub", "-t", "x", "-m", "y"], 1), (["sub", "-t", "x"], 1),
                                         (["collect", "land", "--id", "c"], 2)])
def test_a_password_needs_a_user_name_in_every_command(cmd, status, capsys):
    # mosquitto_pub/sub 2.0.11 refuse a password without a user name before MQTT 5 and send it alone on
    # MQTT 5; Tern refuses it on every version, with the same words in every command.
    assert cli.main([*cmd, "-V", "5", "-P", "s3cret-pw"]) == status
    err = capsys.readouterr().err
    assert "needs --username (-u)" in err and "s3cret-pw" not in err and len(err.strip().splitlines()) == 1


def test_collect_masks_a_password_argparse_would_quote(capsys):
    assert cli.main(["collect", "land", "--id", "c", "-u", "u", "-P", "hunter2-pw", "hunter2-pw"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: ***" in err and "hunter2" not in err, err


def lines_of(data, verb="received", version=5):
    from ternlab.mqttcli.packet_trace import Tracer

    out = []
    t = Tracer(out.append, verb, version)
    for i in range(len(data)):  # a byte at a time: the header and the body cut anywhere
        t.feed(memoryview(data)[i : i + 1])
    return out


def test_trace_words_packets_from_the_library_codec():
    from tern.codec import Packet, encode
    from tern.wire import PUBLISH

    p = Packet(PUBLISH, topic="a/b", payload=b"hello", qos=1, pid=7, props={})
    assert lines_of(encode(p, 5)) == ["received PUBLISH (d0, q1, r0, m7, 'a/b', ... (5 bytes))"]
    assert lines_of(encode(p, 4), version=4) == ["received PUBLISH (d0, q1, r0, m7, 'a/b', ... (5 bytes))"]
    assert lines_of(bytes.fromhex("d000")) == ["received PINGRESP"]


def test_trace_says_a_malformed_fixed_header():
    # A remaining length with a fifth byte: the trace's own decoder raised ValueError out of tern pub/sub.
    assert lines_of(bytes.fromhex("30ffffffff01"))[0] == "received a malformed fixed header"
    assert lines_of(bytes.fromhex("30ffffffff01d000"), "sending")[0] == "sending a malformed fixed header"
