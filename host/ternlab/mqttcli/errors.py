"""Exit statuses and error messages of `tern pub` / `tern sub`: the exceptions
that carry a one-line message and an exit status, the names of CONNACK /
SUBACK / PUBACK reason codes, how an OS error or a protocol violation is
said, and the printer of error lines. Nothing here touches a connection."""

import socket
import sys

from tern.wire import MQTTError

from .redact import redact

# Exit statuses, as mosquitto_pub/sub 2.0 exit (checked against 2.0.11)
EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 1  # a bad argument: mosquitto exits 1 (argparse would say 2)
EXIT_PROTOCOL = 2  # the broker broke the protocol (libmosquitto's MOSQ_ERR_PROTOCOL)
EXIT_TIMEOUT = 27  # mosquitto_sub's exit status when -W runs out (MOSQ_ERR_TIMEOUT)


class CLIError(Exception):
    """A failure to report as one line on stderr; code is the exit status."""

    def __init__(self, msg, code=EXIT_FAIL):
        super().__init__(msg)
        self.code = code


class UsageError(CLIError):
    def __init__(self, msg):
        super().__init__(msg, EXIT_USAGE)


_V3_REASONS = {
    1: "unacceptable protocol version",
    2: "client identifier rejected",
    3: "server unavailable",
    4: "bad user name or password",
    5: "not authorized",
}

_V5_REASONS = {
    0x80: "unspecified error", 0x81: "malformed packet", 0x82: "protocol error",
    0x83: "implementation specific error", 0x84: "unsupported protocol version",
    0x85: "client identifier not valid", 0x86: "bad user name or password",
    0x87: "not authorized", 0x88: "server unavailable", 0x89: "server busy", 0x8A: "banned",
    0x8B: "server shutting down", 0x8C: "bad authentication method", 0x8D: "keep alive timeout",
    0x8E: "session taken over", 0x8F: "topic filter invalid", 0x90: "topic name invalid",
    0x91: "packet identifier in use", 0x92: "packet identifier not found",
    0x93: "receive maximum exceeded", 0x94: "topic alias invalid", 0x95: "packet too large",
    0x96: "message rate too high", 0x97: "quota exceeded", 0x98: "administrative action",
    0x99: "payload format invalid", 0x9A: "retain not supported", 0x9B: "QoS not supported",
    0x9C: "use another server", 0x9D: "server moved", 0x9E: "shared subscriptions not supported",
    0x9F: "connection rate exceeded", 0xA0: "maximum connect time",
    0xA1: "subscription identifiers not supported", 0xA2: "wildcard subscriptions not supported",
}


def reason_text(code, version=5):
    """'not authorized (reason 0x87)' for a CONNACK/SUBACK/PUBACK... code."""
    if version < 5 and code < 0x80:
        name = _V3_REASONS.get(code, "unknown reason")
        return "%s (reason %d)" % (name, code)
    return "%s (reason 0x%02X)" % (_V5_REASONS.get(code, "unknown reason"), code)


def refusal(e, version):
    """What a refused CONNECT's ConnectError says, as text."""
    if e.reason == 1 and version == 5:  # the 3.1.1 code an MQTT 3.1.1-only broker answers MQTT 5 with
        return "the broker does not support MQTT 5 (it answered with the MQTT 3.1.1 return code 1)"
    return reason_text(e.reason, version)


def os_reason(e):
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(e, ConnectionResetError):
        return "connection reset by peer"
    if getattr(e, "strerror", None):
        return e.strerror[0].lower() + e.strerror[1:]
    return str(e) or e.__class__.__name__


def refused_code(e):
    """The exit status for a refused CONNECT: the CONNACK's reason code, as
    mosquitto_pub and mosquitto_sub exit (5 or 135 for a bad password), so a
    script can tell a refusal from a broker it could not reach (1)."""
    return e.reason if 0 < e.reason < 256 else EXIT_FAIL


def broke_protocol(err):
    """True for an error that says the broker broke the protocol (a malformed
    or unexpected packet; the session has sent DISCONNECT with its reason
    code under MQTT 5), not for a DISCONNECT the broker sent or a lost link."""
    return isinstance(err, MQTTError) and not (err.args and err.args[0].startswith("server sent DISCONNECT"))


class BrokeProtocol(Exception):
    """Raised from on_disconnect: a reconnect would meet the same broker."""


def protocol_error(err, version):
    """The CLIError (status 2) for a broker that broke the protocol."""
    how = "sent DISCONNECT 0x%02X and closed the connection" % err.code if version == 5 else "closed the connection"
    return CLIError("the broker broke the protocol: %s; %s" % (err, how), EXIT_PROTOCOL)


def say_err(args):
    """The command's error printer: 'tern pub: message' on stderr (passwords masked), unless --quiet."""
    def say(msg):
        if not args.quiet:
            sys.stderr.write("tern %s: %s\n" % (args.tool, redact(msg)))
            sys.stderr.flush()
    return say
