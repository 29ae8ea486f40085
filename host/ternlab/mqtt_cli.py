"""`tern pub` and `tern sub`: publish and subscribe from a shell, with the flags
people know from mosquitto_pub and mosquitto_sub (same meanings, same
defaults), on top of the Tern client library (tern.client.Client).

Exit statuses are mosquitto 2.0's (checked against 2.0.11): 0 ok, 1 a bad
argument or a failure (unreachable broker, lost connection), 2 when the broker
broke the protocol, 27 when `tern sub -W` runs out, and for a refused
connection the CONNACK's reason code (5 on MQTT 3.1.1, 135 on MQTT 5 for a
wrong password). Every failure is one line on stderr. `-d` writes its trace to
stdout in libmosquitto's words.

What differs from mosquitto on purpose is DIFFERENCES below (also the end of
`tern pub --help` / `tern sub --help` and the README's `tern` table); the
-F subset: %% %t %p %q %r %l %m %x %X %I %U %j, MQTT 5 %P %C %D %E %F %R %S, @X
strftime, @N nanoseconds, @@, \\n \\t \\r \\0 \\a \\e \\v \\\\ escapes, with
printf-style `-` and `0` flags, width and precision. NOT_IMPLEMENTED says
what is not there.

Credentials: the password is handed to the client and nowhere else; the debug
trace (-d) never decodes a CONNECT packet, and error messages are built from
host, port and reason codes only (never from the -L URL). The password of -P or
of a -L URL is registered with ternlab.cli.add_secret before argparse runs.
"""

import argparse
import datetime as _dt
import errno
import json
import os
import select
import socket
import ssl
import sys
import time

from tern import props as P
from tern.client import Client, ConnectError
from tern.topic import validate_filter, validate_name
from tern.wire import CONNECT, DISCONNECT, PUBLISH, SUBSCRIBE, MQTTError, utf8

# Exit statuses, as mosquitto_pub/sub 2.0 exit (checked against 2.0.11)
EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 1  # a bad argument: mosquitto exits 1 (argparse would say 2)
EXIT_PROTOCOL = 2  # the broker broke the protocol (libmosquitto's MOSQ_ERR_PROTOCOL)
EXIT_TIMEOUT = 27  # mosquitto_sub's exit status when -W runs out (MOSQ_ERR_TIMEOUT)

# Receive and transmit buffers. A board keeps these small; a host tool must
# handle whatever a broker forwards, so the defaults are generous (an MQTT 5
# broker is told the receive size as Maximum Packet Size).
RX_SIZE = 16 * 1024 * 1024
TX_SIZE = 256 * 1024
MAX_PACKET = 268435460

# What differs from mosquitto_pub/sub on purpose: the end of --help, and the README.
DIFFERENCES = {
    "both": (
        "--outbox DIR (tern only): the session kept in files across runs, crashes and kill -9 (tern pub "
        "resends what was not acknowledged; tern sub prints a QoS 2 message once)",
        "a broker that breaks the protocol ends the run with status 2 (as mosquitto), after a DISCONNECT with "
        "the reason code under MQTT 5 (mosquitto sends none, and mosquitto_sub reconnects after some "
        "violations)",
        "-D values are checked before sending (e.g. payload-format-indicator is 0 or 1), and -D needs -V 5 "
        "(mosquitto switches to MQTT 5 by itself)",
        "-L: -h, -p, -u, -P (and -t for pub) given as well win, whatever the order (mosquitto: the last one)",
        "-d traces bytes as they are read: a 'received' line may come before the lines of an earlier message",
        "--insecure skips only the host name check: the certificate chain is still verified",
        "--help exits 0 (mosquitto: 1)",
    ),
    "sub": (
        "a QoS 1/2 message is acknowledged after it is printed (mosquitto_sub: before); one that arrives "
        "after -C is done is not acknowledged, and stays queued for the next run with -c",
        "MQTT 3.1.1: a message over the receive limit (16 MiB) is dropped with one line on stderr",
    ),
}


NOT_IMPLEMENTED = ("-A, --unix, --proxy, --psk, -M, --tls-version, --ciphers, ws:// and wss:// URLs; "
                   "tern sub: -T, -U, --remove-retained, --random-filter, -F %A and %J")


def _epilog(tool):
    return "differs from mosquitto_%s on purpose:\n%s\nnot implemented: %s" % (
        tool, "\n".join("  * " + d for d in DIFFERENCES["both"] + DIFFERENCES.get(tool, ())),
        NOT_IMPLEMENTED.split("; tern sub")[0] if tool == "pub" else NOT_IMPLEMENTED)


# ----------------------------------------------------------------- errors


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


def _refusal(e, version):
    """What a refused CONNECT's ConnectError says, as text."""
    if e.reason == 1 and version == 5:  # the 3.1.1 code an MQTT 3.1.1-only broker answers MQTT 5 with
        return "the broker does not support MQTT 5 (it answered with the MQTT 3.1.1 return code 1)"
    return reason_text(e.reason, version)


def _os_reason(e):
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(e, ConnectionResetError):
        return "connection reset by peer"
    if getattr(e, "strerror", None):
        return e.strerror[0].lower() + e.strerror[1:]
    return str(e) or e.__class__.__name__


# ------------------------------------------------------- argument parsing


def _int_range(what, lo, hi):
    def conv(text):
        try:
            v = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError("%s must be a whole number, not %r" % (what, text))
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError("%s must be %d..%d, not %d" % (what, lo, hi, v))
        return v

    conv.__name__ = what
    return conv


def _qos(text):
    if text not in ("0", "1", "2"):
        raise argparse.ArgumentTypeError("QoS must be 0, 1 or 2, not %r" % text)
    return int(text)


_VERSIONS = {
    "31": 3, "mqttv31": 3, "3.1": 3,
    "311": 4, "mqttv311": 4, "3.1.1": 4,
    "5": 5, "mqttv5": 5, "5.0": 5,
}


def _version(text):
    v = _VERSIONS.get(text.lower())
    if v is None:
        raise argparse.ArgumentTypeError(
            "protocol version must be 31, 311 or 5 (or mqttv31, mqttv311, mqttv5), not %r" % text)
    return v


def _expiry(text):
    if text in ("-1", "∞"):
        return 0xFFFFFFFF
    return _int_range("session expiry interval", 0, 0xFFFFFFFF)(text)


def _seconds(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("timeout must be a number of seconds, not %r" % text)
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError("timeout must be more than 0 seconds, not %r" % text)
    return v


def _arg_bytes(text):
    """An argument's bytes as the shell passed them: Python decodes argv with
    surrogateescape, so bytes that are not UTF-8 come back unchanged (as
    mosquitto sends -m, --will-payload and -F text)."""
    return os.fsencode(text)


def _mqtt_string(flag, text):
    """text checked as an MQTT UTF-8 string (user name, client id): a
    UsageError naming flag, never the value, when it cannot be one."""
    try:
        b = text.encode()
    except UnicodeEncodeError:
        raise UsageError("%s is not valid UTF-8" % flag)
    if len(b) > 65535:
        raise UsageError("%s is longer than 65535 bytes (%d)" % (flag, len(b)))
    try:
        utf8(b)
    except ValueError as e:
        raise UsageError("%s: %s" % (flag, e))


def _mqtt_binary(flag, text):
    """The argument's bytes as MQTT binary data (password, will payload)."""
    b = _arg_bytes(text)
    if len(b) > 65535:
        raise UsageError("%s is longer than 65535 bytes (%d)" % (flag, len(b)))
    return b


# MQTT 5 properties by mosquitto's names: identifier and the -D commands that may carry it.
PROPERTY_NAMES = {
    "payload-format-indicator": (P.PAYLOAD_FORMAT_INDICATOR, ("publish", "will")),
    "message-expiry-interval": (P.MESSAGE_EXPIRY_INTERVAL, ("publish", "will")),
    "content-type": (P.CONTENT_TYPE, ("publish", "will")),
    "response-topic": (P.RESPONSE_TOPIC, ("publish", "will")),
    "correlation-data": (P.CORRELATION_DATA, ("publish", "will")),
    "subscription-identifier": (P.SUBSCRIPTION_IDENTIFIER, ("subscribe",)),
    "session-expiry-interval": (P.SESSION_EXPIRY_INTERVAL, ("connect", "disconnect")),
    "receive-maximum": (P.RECEIVE_MAXIMUM, ("connect",)),
    "topic-alias-maximum": (P.TOPIC_ALIAS_MAXIMUM, ("connect",)),
    "maximum-packet-size": (P.MAXIMUM_PACKET_SIZE, ("connect",)),
    "request-problem-information": (P.REQUEST_PROBLEM_INFORMATION, ("connect",)),
    "request-response-information": (P.REQUEST_RESPONSE_INFORMATION, ("connect",)),
    "will-delay-interval": (P.WILL_DELAY_INTERVAL, ("will",)),
    "user-property": (P.USER_PROPERTY, ("connect", "publish", "subscribe", "disconnect", "will")),
}
# Real MQTT 5 properties tern pub/sub cannot send (they need a protocol
# exchange the command does not do, or only a server sends them).
_UNSUPPORTED = ("authentication-method", "authentication-data", "topic-alias", "reason-string",
                "assigned-client-identifier", "server-keep-alive", "response-information",
                "server-reference", "maximum-qos", "retain-available",
                "wildcard-subscription-available", "subscription-identifier-available",
                "shared-subscription-available")
_COMMANDS = {"pub": ("connect", "publish", "disconnect", "will"),
             "sub": ("connect", "subscribe", "disconnect", "will")}
_PACKET = {"connect": CONNECT, "publish": PUBLISH, "subscribe": SUBSCRIBE,
           "disconnect": DISCONNECT, "will": P.WILL}
_SEP = "\0"  # joins the 3 or 4 words of one -D into one argparse value


def _parse_property(words, tool):
    """(command, identifier, value) from the words of one -D; UsageError when wrong."""
    if len(words) < 3:
        raise UsageError("-D needs a command, a property name and a value "
                         "(e.g. -D publish user-property key value)")
    cmd, name = words[0].lower(), words[1].lower()
    if cmd not in _COMMANDS[tool]:
        raise UsageError("-D: unknown command %r for tern %s (one of: %s)"
                         % (words[0], tool, ", ".join(_COMMANDS[tool])))
    if name not in PROPERTY_NAMES:
        if name in _UNSUPPORTED:
            raise UsageError("-D: property %r is not supported by tern %s" % (words[1], tool))
        raise UsageError("-D: unknown property %r" % words[1])
    pid, cmds = PROPERTY_NAMES[name]
    if cmd not in cmds:
        raise UsageError("-D: property %s is not allowed in %s (only in: %s)" % (name, cmd, ", ".join(cmds)))
    t = P.prop_type(pid)
    want = 4 if t == P.TYPE_PAIR else 3
    if len(words) != want:
        raise UsageError("-D %s %s needs %s" % (cmd, name, "a name and a value" if want == 4 else "one value"))
    text = words[2]
    if t in (P.TYPE_BYTE, P.TYPE_U16, P.TYPE_U32, P.TYPE_VARINT):
        hi = {P.TYPE_BYTE: 0xFF, P.TYPE_U16: 0xFFFF, P.TYPE_U32: 0xFFFFFFFF, P.TYPE_VARINT: 268435455}[t]
        try:
            value = int(text, 10)
        except ValueError:
            raise UsageError("-D %s %s: %r is not a whole number" % (cmd, name, text))
        if not 0 <= value <= hi:
            raise UsageError("-D %s %s: %d is out of range 0..%d" % (cmd, name, value, hi))
    elif t == P.TYPE_UTF8:
        value = text
    elif t == P.TYPE_BINARY:
        value = _arg_bytes(text)  # as mosquitto: the argument's bytes
    else:
        value = (words[2], words[3])
    try:  # the library's own rules (e.g. payload-format-indicator is 0 or 1)
        P.encode({pid: [value] if t == P.TYPE_PAIR else value}, _PACKET[cmd])
    except ValueError as e:
        raise UsageError("-D %s %s: %s" % (cmd, name, e))
    return cmd, pid, value


def _collect_properties(raw, tool):
    """{command: {identifier: value}} from the -D values (user properties as lists)."""
    out = {}
    for joined in raw or ():
        cmd, pid, value = _parse_property(joined.split(_SEP), tool)
        d = out.setdefault(cmd, {})
        if pid == P.USER_PROPERTY:
            d.setdefault(pid, []).append(value)
        elif pid in d:
            raise UsageError("-D: %s given twice for %s" % (_prop_name(pid), cmd))
        else:
            d[pid] = value
    return out


def _prop_name(pid):
    for name, (p, _) in PROPERTY_NAMES.items():
        if p == pid:
            return name
    return "0x%02X" % pid


def parse_url(text):
    """mosquitto's -L URL, mqtt(s)://[user[:password]@]host[:port]/topic, as
    (tls, host, port, user, password, topic); UsageError naming what is wrong,
    never quoting the URL (it may hold a password)."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise UsageError("-L: the URL must start with mqtt:// or mqtts://")
    if scheme.lower() not in ("mqtt", "mqtts"):
        raise UsageError("-L: unsupported URL scheme %r (mqtt:// or mqtts://)" % scheme)
    tls = scheme.lower() == "mqtts"
    authority, _, topic = rest.partition("/")
    if not topic:
        raise UsageError("-L: the URL has no topic (mqtt://host/topic)")
    userinfo, at, hostport = authority.rpartition("@")
    user = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        password = pw if colon else None
    if hostport.startswith("["):  # [IPv6]:port
        host, _, port = hostport[1:].partition("]")
        port = port[1:] if port.startswith(":") else port
    else:
        host, _, port = hostport.partition(":")
    if not host:
        raise UsageError("-L: the URL has no host")
    if port:
        try:
            port = _int_range("-L: port", 1, 65535)(port)
        except argparse.ArgumentTypeError as e:
            raise UsageError(str(e))
    return tls, host, port or (8883 if tls else 1883), user, password, topic


def _url_password(text):
    try:
        return parse_url(text)[4]
    except UsageError:  # reported later; whatever follows '//user:' may still be a password
        userinfo = text.partition("//")[2].partition("/")[0].rpartition("@")[0]
        return userinfo.partition(":")[2] or None


# Options that take a value, for the argv pre-pass below.
_VALUE_SHORT = set("hptmfqiIkVuPxCWFDL")
_VALUE_LONG = {"--host", "--port", "--topic", "--message", "--file", "--qos", "--id", "--id-prefix", "--url",
               "--outbox", "--keepalive", "--protocol-version", "--username", "--pw", "--session-expiry-interval",
               "--will-topic", "--will-payload", "--will-qos", "--cafile", "--capath", "--cert",
               "--key", "--repeat", "--repeat-delay", "--property"}
_FLAG_SHORT = set("lnsrcdvNRE")
_SECRET_OPTIONS = ("-P", "--pw")


def prepare_argv(argv):
    """Make argparse read pub/sub arguments the way mosquitto does.

    mosquitto's -D takes 3 words, or 4 for user-property, and argparse wants a
    fixed count: each -D's words are joined into one value (split again
    later). An option's value is taken as it is even when it starts with '-'
    (`-m -5`, `-P -secret`): it is written `-m=-5` for argparse. Clusters of
    short flags (`-rq1`, `-dv`) are split. Password values are registered
    with ternlab.cli.add_secret so no error message can show them.
    """
    from .cli import add_secret

    out = []
    i = 0
    n = len(argv)
    while i < n:
        a = argv[i]
        i += 1
        if a == "--" or not a.startswith("-") or len(a) < 2:
            if a == "--":
                out += argv[i - 1 :]
                break
            out.append(a)
            continue
        if a in ("-D", "--property"):
            k = 4 if i + 1 < n and argv[i + 1].lower() == "user-property" else 3
            words = argv[i : i + k]
            i += len(words)
            out.append(a + "=" + _SEP.join(words) if words else a)
            continue
        if a.startswith("--"):
            name, eq, val = a.partition("=")
            if not eq and name in _VALUE_LONG and i < n:
                val = argv[i]
                i += 1
                a = name + "=" + val
                eq = "="
            if eq and name in _SECRET_OPTIONS:
                add_secret(val)
            elif eq and name == "--url" and _url_password(val):
                add_secret(_url_password(val))
            out.append(a)
            continue
        # one short option or a cluster of them: -r, -q1, -rq 1, -dv
        body = a[1:]
        parts = []
        ok = True
        for j, c in enumerate(body):
            if c in _FLAG_SHORT:
                parts.append("-" + c)
                continue
            if c in _VALUE_SHORT:
                val = body[j + 1 :]
                if not val:
                    if i >= n:
                        parts.append("-" + c)  # argparse says a value is missing
                        break
                    val = argv[i]
                    i += 1
                if c == "P":
                    add_secret(val)
                elif c == "L" and _url_password(val):
                    add_secret(_url_password(val))
                parts.append("-" + c + "=" + val)
                break
            ok = False  # not one of ours: leave the token to argparse
            break
        out += parts if ok else [a]
    return out


def _common_options(p, tool):
    p.add_argument("--help", action="help", help="show this help and exit")
    g = p.add_argument_group("connection")
    g.add_argument("-h", "--host", help="broker host (default: localhost)")
    g.add_argument("-L", "--url", metavar="URL", help="mqtt(s)://[user[:password]@]host[:port]/topic, as "
                   "mosquitto's -L (mqtts: TLS, with the system's CAs unless --cafile/--capath); -h, -p, -u, "
                   "-P%s given as well win over the URL's parts" % (" and -t" if tool == "pub" else ""))
    g.add_argument("-p", "--port", type=_int_range("port", 1, 65535),
                   help="broker port (default: 1883, or 8883 with TLS)")
    g.add_argument("-V", "--protocol-version", dest="version", type=_version, default=4,
                   metavar="VERSION", help="MQTT version: 31, 311 (default) or 5; mqttv31, mqttv311, mqttv5 too")
    g.add_argument("-i", "--id", dest="client_id", help="client id (default: chosen by the broker; "
                   "tern_%s_PID for MQTT 3.1)" % tool)
    g.add_argument("-I", "--id-prefix", dest="id_prefix", help="client id: this prefix and the process id")
    g.add_argument("-k", "--keepalive", type=_int_range("keepalive", 0, 65535), default=60,
                   help="keepalive in seconds (default: 60)")
    g.add_argument("-c", "--disable-clean-session", dest="persistent", action="store_true",
                   help="persistent session: no clean session / clean start (needs -i or -I)")
    g.add_argument("-x", "--session-expiry-interval", dest="expiry", type=_expiry,
                   help="MQTT 5 session expiry in seconds; -1 never expires (default: -1 with -c, else 0)")
    g.add_argument("-u", "--username", help="user name")
    g.add_argument("-P", "--pw", dest="password", help="password (never printed)")
    g.add_argument("-D", "--property", dest="props", action="append", metavar="CMD NAME VALUE",
                   help="MQTT 5 property, e.g. '-D connect session-expiry-interval 60' or "
                   "'-D %s user-property key value'" % ("publish" if tool == "pub" else "subscribe"))
    g.add_argument("-d", "--debug", action="store_true", help="print packets and events on stdout")
    g.add_argument("--outbox", metavar="DIR", help=(
        "keep the session in DIR (created if missing; needs -c and -i): a QoS 1/2 message accepted "
        "before a crash or kill is resent on the next run with the same -i" if tool == "pub" else
        "keep the session in DIR (created if missing; needs -c and -i): a QoS 2 message is printed "
        "once across runs, even when the broker sends it again after a crash or kill"))
    g.add_argument("--quiet", action="store_true", help="print no error messages")
    w = p.add_argument_group("will")
    w.add_argument("--will-topic", help="topic of the will message")
    w.add_argument("--will-payload", help="payload of the will message (default: empty)")
    w.add_argument("--will-qos", type=_qos, default=0, help="QoS of the will message")
    w.add_argument("--will-retain", action="store_true", help="retain the will message")
    t = p.add_argument_group("TLS (on with --cafile, --capath or --tls-use-os-certs; the server is verified)")
    t.add_argument("--cafile", help="CA certificates (PEM) to verify the broker with")
    t.add_argument("--capath", help="directory of CA certificates")
    t.add_argument("--tls-use-os-certs", action="store_true", help="trust the system's CA certificates")
    t.add_argument("--cert", help="client certificate (PEM)")
    t.add_argument("--key", help="client private key (PEM)")
    t.add_argument("--insecure", action="store_true",
                   help="do not check that the certificate names the host (the chain is still verified)")


class _Help(argparse.HelpFormatter):
    """Options wrapped as usual; the epilog (one difference a line) kept as written."""

    def _fill_text(self, text, width, indent):
        if text.startswith("differs"):
            import textwrap

            return "\n".join(textwrap.fill(line, width, subsequent_indent="    ", break_on_hyphens=False)
                             for line in text.splitlines())
        return super()._fill_text(text, width, indent)


def add_subcommands(subparsers):
    """Register `pub` and `sub` on the `tern` command's subparsers."""
    pub = subparsers.add_parser(
        "pub", add_help=False, help="publish messages (flags as mosquitto_pub)",
        description="Publish one message, or one per line of stdin, then disconnect. "
                    "Flags, defaults and exit statuses follow mosquitto_pub 2.0.",
        epilog=_epilog("pub"), formatter_class=_Help)
    _common_options(pub, "pub")
    g = pub.add_argument_group("message")
    g.add_argument("-t", "--topic", help="topic to publish to (or the topic of -L URL)")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("-m", "--message", help="message payload")
    src.add_argument("-f", "--file", help="send the contents of a file as the message")
    src.add_argument("-l", "--stdin-line", dest="lines", action="store_true",
                     help="read stdin, send each line as a message")
    src.add_argument("-n", "--null-message", dest="null", action="store_true", help="send a zero length message")
    src.add_argument("-s", "--stdin-file", dest="stdin", action="store_true", help="send all of stdin as one message")
    g.add_argument("-q", "--qos", type=_qos, default=0, help="QoS 0, 1 or 2 (default: 0)")
    g.add_argument("-r", "--retain", action="store_true", help="retain the message")
    g.add_argument("--repeat", type=_int_range("repeat", 1, 1 << 31), default=1,
                   help="with -m, -f or -s: publish the message N times")
    g.add_argument("--repeat-delay", type=float, default=0.0, help="seconds between repeats")
    pub.set_defaults(func=run_pub, tool="pub")

    sub = subparsers.add_parser(
        "sub", add_help=False, help="subscribe and print messages (flags as mosquitto_sub)",
        description="Subscribe to topic filters and print the messages. Flags, defaults and exit statuses "
                    "follow mosquitto_sub 2.0; -F supports %%t %%p %%q %%r %%l %%m %%x %%X %%I %%U %%j %%P "
                    "%%C %%D %%E %%F %%R %%S %%%%, @-strftime and \\n \\t escapes.",
        epilog=_epilog("sub"), formatter_class=_Help)
    _common_options(sub, "sub")
    g = sub.add_argument_group("subscription and output")
    g.add_argument("-t", "--topic", dest="topics", action="append", default=[],
                   help="topic filter; repeat for more ($share/GROUP/FILTER for a shared subscription); "
                   "-L URL adds its topic")
    g.add_argument("-q", "--qos", type=_qos, default=0, help="QoS of the subscriptions (default: 0)")
    g.add_argument("-C", dest="count", type=_int_range("count", 1, 1 << 31),
                   help="exit after printing this many messages")
    g.add_argument("-R", dest="no_stale", action="store_true", help="skip stale messages (retain flag set)")
    g.add_argument("--retained-only", action="store_true",
                   help="print only retained messages; exit at the first message without the retain flag")
    g.add_argument("-E", dest="exit_subscribed", action="store_true", help="exit once subscribed")
    g.add_argument("-W", dest="timeout", type=_seconds,
                   help="exit after this many seconds (status 27), as mosquitto_sub")
    g.add_argument("-v", "--verbose", action="store_true", help="print 'topic payload'")
    g.add_argument("-N", dest="no_eol", action="store_true", help="no newline after each message")
    g.add_argument("-F", dest="format", help="output format (see the description above)")
    sub.set_defaults(func=run_sub, tool="sub")


# --------------------------------------------------------------- settings


def _apply_url(args, tool):
    """Fill host, port, user name, password and topic from -L (what is given
    on its own wins); check that a topic was given one way or the other."""
    if args.url is not None:
        tls, host, port, user, password, topic = parse_url(args.url)
        args.host = args.host or host
        args.port = args.port or port
        if args.username is None and args.password is None:
            args.username, args.password = user, password
        if tool == "pub":
            args.topic = args.topic or topic
        else:
            args.topics.append(topic)
        if tls and not (args.cafile or args.capath):
            args.tls_use_os_certs = True
    args.host = args.host or "localhost"
    if not (args.topic if tool == "pub" else args.topics):
        raise UsageError("a topic is needed: -t/--topic or -L URL")


def _settings(args, tool):
    """Check what argparse cannot and build the Client's keyword arguments."""
    _apply_url(args, tool)
    v = args.version
    props = {}
    if args.props:
        if v != 5:
            raise UsageError("-D needs MQTT 5 (-V 5)")
        props = _collect_properties(args.props, tool)
    if args.expiry is not None and v != 5:
        raise UsageError("-x needs MQTT 5 (-V 5)")
    if args.client_id is not None and args.id_prefix is not None:
        raise UsageError("-i and -I cannot be used together")
    if args.persistent and args.client_id is None and args.id_prefix is None:
        raise UsageError("-c needs a client id (-i or -I)")
    if args.outbox is not None and (not args.persistent or args.client_id is None):
        raise UsageError("--outbox needs -c and a client id (-i), the same on every run")
    if args.password is not None and args.username is None and v != 5:
        raise UsageError("a password (-P) needs a user name (-u) before MQTT 5")
    if args.will_topic is None and (args.will_payload is not None or args.will_retain or args.will_qos):
        raise UsageError("--will-payload, --will-qos and --will-retain need --will-topic")
    if args.will_topic is not None:
        try:
            validate_name(args.will_topic)
        except ValueError as e:
            raise UsageError("--will-topic: %s" % e)
    if args.client_id is not None:
        cid = args.client_id
    elif args.id_prefix is not None:
        cid = "%s%d" % (args.id_prefix, os.getpid())
    elif v == 3:
        cid = "tern_%s_%d" % (tool, os.getpid())  # MQTT 3.1 needs 1..23 characters
    else:
        cid = ""  # the broker assigns one
    if args.username is not None:
        _mqtt_string("-u", args.username)
    password = None if args.password is None else _mqtt_binary("-P", args.password)
    _mqtt_string("-i" if args.client_id is not None else "-I", cid)
    will_payload = _mqtt_binary("--will-payload", args.will_payload or "")
    ctx = _tls_context(args)
    conn = dict(props.get("connect", {}))
    opts = {"rx_size": RX_SIZE, "tx_size": TX_SIZE}
    expiry = conn.pop(P.SESSION_EXPIRY_INTERVAL, None)
    if args.expiry is not None:
        expiry = args.expiry
    if v == 5 and expiry is None and args.persistent:
        expiry = 0xFFFFFFFF
    if expiry:
        opts["session_expiry"] = expiry
    mps = conn.pop(P.MAXIMUM_PACKET_SIZE, None)
    if mps is not None:
        opts["rx_size"] = min(max(mps, 64), MAX_PACKET)  # a CONNACK must fit
    tam = conn.pop(P.TOPIC_ALIAS_MAXIMUM, None)
    if tam:
        opts["topic_alias_max"] = tam
    kw = dict(
        client_id=cid, port=args.port, version=v, keepalive=args.keepalive,
        clean=not args.persistent, ssl=ctx, username=args.username, password=password,
        connect_props=conn or None, **opts)
    if args.will_topic is not None:
        kw.update(will_topic=args.will_topic, will_payload=will_payload,
                  will_qos=args.will_qos, will_retain=args.will_retain, will_props=props.get("will"))
    elif "will" in props:
        raise UsageError("-D will ... needs --will-topic")
    return kw, props


def _tls_context(args):
    tls = args.cafile or args.capath or args.tls_use_os_certs
    if not tls:
        for flag, given in (("--cert", args.cert), ("--key", args.key), ("--insecure", args.insecure)):
            if given:
                raise UsageError("%s needs TLS: give --cafile, --capath or --tls-use-os-certs" % flag)
        return None
    if bool(args.cert) != bool(args.key):
        raise UsageError("--cert and --key go together")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the host name
    try:
        if args.cafile or args.capath:
            what = "--cafile %s" % args.cafile if args.cafile else "--capath %s" % args.capath
            ctx.load_verify_locations(cafile=args.cafile, capath=args.capath)
        if args.tls_use_os_certs:
            what = "the system's CA certificates"
            ctx.load_default_certs()
        if args.cert:
            what = "--cert %s / --key %s" % (args.cert, args.key)
            ctx.load_cert_chain(args.cert, args.key)
    except (OSError, ssl.SSLError) as e:
        raise CLIError("cannot load %s: %s" % (what, _os_reason(e) if not isinstance(e, ssl.SSLError)
                                               else e.reason or e))
    if args.insecure:
        ctx.check_hostname = False
    return ctx


# ------------------------------------------------------------ debug trace

_NAMES = ("RESERVED", "CONNECT", "CONNACK", "PUBLISH", "PUBACK", "PUBREC", "PUBREL", "PUBCOMP",
          "SUBSCRIBE", "SUBACK", "UNSUBSCRIBE", "UNSUBACK", "PINGREQ", "PINGRESP", "DISCONNECT", "AUTH")


def _varint(b, i):
    v = 0
    shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        if not c & 0x80:
            return v, i
        shift += 7
        if shift > 21:
            raise ValueError("bad variable byte integer")


class Tracer:
    """Cuts one direction of an MQTT byte stream into packets and describes
    each in one line. A CONNECT's body is never kept or looked at, so user
    names and passwords cannot reach the trace."""

    KEEP = 1024  # body bytes kept per packet: enough for topics and ids

    def __init__(self, say, verb, version, subscribed=None):
        self.say = say
        self.verb = verb
        self.version = version
        self.subscribed = subscribed  # subscribed(line) after a SUBACK's own line
        self.reset()

    def reset(self):
        self.hdr = bytearray()
        self.body = bytearray()
        self.left = -1
        self.total = 0

    def feed(self, data):
        i = 0
        n = len(data)
        while i < n:
            if self.left < 0:
                self.hdr.append(data[i])
                i += 1
                if len(self.hdr) >= 2 and not self.hdr[-1] & 0x80:
                    self.total = self.left = _varint(self.hdr, 1)[0]
                    if not self.left:
                        self._done()
                elif len(self.hdr) > 5:
                    self.say("%s a malformed fixed header" % self.verb)
                    self.reset()
                continue
            k = min(self.left, n - i)
            room = 0 if self.hdr[0] >> 4 == CONNECT else self.KEEP - len(self.body)
            if room > 0:
                self.body += bytes(data[i : i + min(k, room)])
            i += k
            self.left -= k
            if not self.left:
                self._done()

    def _done(self):
        t = self.hdr[0] >> 4
        flags = self.hdr[0] & 15
        try:
            desc = self.describe(t, flags, self.body, self.total)
        except (IndexError, ValueError, UnicodeError):
            desc = "%s (%d bytes)" % (_NAMES[t], self.total)
        self.say("%s %s" % (self.verb, desc))
        if t == 9 and self.subscribed:  # as mosquitto_sub -d: "Subscribed (mid: 1): 0, 1"
            b = self.body
            try:
                i = self._props_end(b, 2)
                self.subscribed("Subscribed (mid: %d): %s" % (
                    b[0] << 8 | b[1], ", ".join(str(c) for c in b[i : self.total])))
            except (IndexError, ValueError):
                pass
        self.reset()

    def _props_end(self, b, i):
        if self.version != 5:
            return i
        n, j = _varint(b, i)
        return j + n

    def describe(self, t, flags, b, total):
        name = _NAMES[t]
        if t == CONNECT or t in (12, 13):
            return name
        if t == 2:  # CONNACK
            return "%s (%d)" % (name, b[1])
        if t == PUBLISH:
            q = flags >> 1 & 3
            tl = b[0] << 8 | b[1]
            topic = bytes(b[2 : 2 + tl]).decode("utf-8", "replace")
            if tl > len(b) - 2:
                topic += "..."
            i = 2 + tl
            mid = 0
            if q:
                mid = b[i] << 8 | b[i + 1]
                i += 2
            if self.version == 5:
                if i < len(b):
                    n, j = _varint(b, i)
                    i = j + n
            return "%s (d%d, q%d, r%d, m%d, '%s', ... (%d bytes))" % (
                name, flags >> 3 & 1, q, flags & 1, mid, topic, total - i)
        if 4 <= t <= 7:  # as libmosquitto words them
            mid = b[0] << 8 | b[1]
            rc = b[2] if total >= 3 else 0
            if self.verb == "sending":
                return "%s (m%d, rc%d)" % (name, mid, rc) if t < 6 else "%s (m%d)" % (name, mid)
            if t in (4, 7):  # PUBACK, PUBCOMP
                return "%s (Mid: %d, RC:%d)" % (name, mid, rc)
            return "%s (Mid: %d)" % (name, mid)
        if t in (SUBSCRIBE, 10):
            mid = b[0] << 8 | b[1]
            i = self._props_end(b, 2)
            out = []
            while i + 2 <= len(b):
                tl = b[i] << 8 | b[i + 1]
                flt = bytes(b[i + 2 : i + 2 + tl]).decode("utf-8", "replace")
                i += 2 + tl
                if t == SUBSCRIBE:
                    o = b[i]
                    i += 1
                    out.append("Topic: %s, QoS: %d, Options: 0x%02X" % (flt, o & 3, o & 0xFC))
                else:
                    out.append("Topic: %s" % flt)
            return "%s (Mid: %d, %s)" % (name, mid, "; ".join(out))
        if t in (9, 11):  # SUBACK, UNSUBACK: no codes (a SUBACK's get a line of their own, see _done)
            return name
        if t in (DISCONNECT, 15):
            return "%s (%d)" % (name, b[0]) if total else name
        return name


def _hook_trace(client, say):
    s = client.session
    out = Tracer(lambda m: say("Client %s %s" % (s.client_id or "(null)", m)), "sending", s.version)
    inn = Tracer(lambda m: say("Client %s %s" % (s.client_id or "(null)", m)), "received", s.version, say)
    send = s.send
    feed_n = s.feed_n
    connect = client.connect

    def traced_send(buf, off, n):
        send(buf, off, n)
        out.feed(memoryview(buf)[off : off + n])

    def traced_feed_n(n, now):
        inn.feed(memoryview(s.rx)[s.rx_len : s.rx_len + n])
        feed_n(n, now)

    def traced_connect(*a, **k):
        out.reset()
        inn.reset()
        return connect(*a, **k)

    s.send = traced_send
    s.feed_n = traced_feed_n
    client.connect = traced_connect


# ---------------------------------------------------------------- connect


def _say_err(args):
    from .cli import redact

    def say(msg):
        if not args.quiet:
            sys.stderr.write("tern %s: %s\n" % (args.tool, redact(msg)))
            sys.stderr.flush()
    return say


def _debug(args):
    if not args.debug:
        return None

    def say(msg):  # on stdout, as mosquitto_pub/sub -d (among the messages, for tern sub)
        sys.stdout.write(msg + "\n")
        sys.stdout.flush()
    return say


def _open(args, kw, reconnect, setup=None):
    """Connect to the first address of --host that answers; CLIError otherwise.
    setup(client) runs before connecting: messages of a persistent session
    may arrive in the same read as CONNACK, so handlers must be in place."""
    port = args.port or (8883 if kw["ssl"] else 1883)
    where = "%s:%d" % (args.host, port)
    try:
        infos = socket.getaddrinfo(args.host, port, 0, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise CLIError("cannot resolve host %r: %s" % (args.host, getattr(e, "strerror", None) or e))
    addrs = []
    for info in infos:
        if info[4][0] not in addrs:
            addrs.append(info[4][0])
    dbg = _debug(args)
    last = None
    for ip in addrs:
        c = Client(server=ip, server_hostname=args.host, reconnect=False, **kw)
        if args.outbox is not None:
            _claim_outbox(args, c.session)
        if dbg:
            _hook_trace(c, dbg)
        if setup:
            setup(c)
        try:
            c.connect()
        except ConnectError as e:
            raise CLIError("connection to %s refused by the broker: %s" % (where, _refusal(e, args.version)),
                           _refused_code(e))
        except ssl.SSLCertVerificationError as e:
            raise CLIError("TLS: the certificate of %s failed verification: %s" % (where, e.verify_message or e.reason))
        except ssl.SSLError as e:
            raise CLIError("TLS handshake with %s failed: %s" % (where, e.reason or e))
        except MQTTError as e:  # a CONNACK that breaks the protocol (or something before it)
            raise _protocol_error(e, args.version)
        except OSError as e:
            last = e
            c.session.store.close()  # the next address's client opens it again
            continue
        c.reconnect = reconnect
        return c
    raise CLIError("cannot connect to %s: %s" % (where, _os_reason(last)))


# ------------------------------------------------------------------ outbox

_OWNER = "tern-cli"  # meta key of the outbox: "<MQTT version> <client id>" of its session


def _hold_outbox(args, kw):
    """--outbox DIR: put a FileStore holding the session into kw, with an
    exclusive lock on DIR so two processes never write one outbox at once.
    _release_outbox(args) lets go of both."""
    if args.outbox is None:
        return
    import fcntl
    from tern.filestore import FileStore

    path = args.outbox
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(os.path.join(path, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise CLIError("--outbox %s: %s" % (path, _os_reason(e)))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise CLIError("--outbox %s is in use by another tern process" % path)
    args.held = [fd]
    # verbose=False: stdout is for messages; a torn tail after a kill is expected and skipped
    kw["store"] = FileStore(path, verbose=False)
    args.held.append(kw["store"])


def _release_outbox(args):
    for h in reversed(getattr(args, "held", ())):
        try:
            os.close(h) if isinstance(h, int) else h.close()
        except OSError:
            pass
    args.held = []


def _claim_outbox(args, session):
    """The outbox holds one client's session: refuse another client id or
    MQTT version while it has messages pending (they were encoded for it)."""
    store = session.store
    me = ("%d %s" % (args.version, args.client_id)).encode()
    owner = store.meta(_OWNER)
    if owner is not None and bytes(owner) != me:
        n = store.count()
        if n:
            v, _, cid = bytes(owner).decode("utf-8", "replace").partition(" ")
            raise CLIError("--outbox %s holds %d message(s) of client id %r (MQTT %s): run with -i %s -V %s "
                           "to send them, or use another directory" % (
                               args.outbox, n, cid, {"3": "3.1", "4": "3.1.1"}.get(v, v), cid,
                               {"3": "31", "4": "311"}.get(v, v)))
        store.in_clear()  # inbound QoS 2 ids of another session
    store.set_meta(_OWNER, me)


def _kept(args, client):
    """'; N message(s) stay in DIR for the next run', when an outbox holds them."""
    n = len(client.session.pending()) if args.outbox is not None else 0
    return "; %d message(s) stay in %s for the next run" % (n, args.outbox) if n else ""


def _refused_code(e):
    """The exit status for a refused CONNECT: the CONNACK's reason code, as
    mosquitto_pub and mosquitto_sub exit (5 or 135 for a bad password), so a
    script can tell a refusal from a broker it could not reach (1)."""
    return e.reason if 0 < e.reason < 256 else EXIT_FAIL


def _broke_protocol(err):
    """True for an error that says the broker broke the protocol (a malformed
    or unexpected packet; the session has sent DISCONNECT with its reason
    code under MQTT 5), not for a DISCONNECT the broker sent or a lost link."""
    return isinstance(err, MQTTError) and not (err.args and err.args[0].startswith("server sent DISCONNECT"))


class _BrokeProtocol(Exception):
    """Raised from on_disconnect: a reconnect would meet the same broker."""


def _protocol_error(err, version):
    """The CLIError (status 2) for a broker that broke the protocol."""
    how = "sent DISCONNECT 0x%02X and closed the connection" % err.code if version == 5 else "closed the connection"
    return CLIError("the broker broke the protocol: %s; %s" % (err, how), EXIT_PROTOCOL)


def _failure(client, args, e=None):
    """The CLIError for a connection that ended under a command."""
    err = client.last_error or e
    if _broke_protocol(err):
        return _protocol_error(err, args.version)
    return CLIError(_lost(client, e) + _kept(args, client))


def _lost(client, e=None):
    err = client.last_error or e
    if isinstance(err, MQTTError) and err.args and err.args[0] == "server sent DISCONNECT":
        return "the broker closed the connection: %s" % reason_text(err.code)
    if isinstance(err, OSError):
        return "connection lost: %s" % _os_reason(err)
    return "connection lost: %s" % (err or "unknown reason")


# -------------------------------------------------------------------- pub


def _stdin_bytes():
    s = sys.stdin
    return getattr(s, "buffer", s)


def _stdin_lines(idle):
    """Lines of stdin without their '\\n' (as mosquitto_pub -l: an empty line is
    an empty message); idle() runs while waiting so keepalive goes on."""
    stream = _stdin_bytes()
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        fd = None
    if fd is None:
        while True:
            line = stream.readline()
            if isinstance(line, str):
                line = line.encode()
            if not line:
                return
            yield line[:-1] if line.endswith(b"\n") else line
    buf = b""
    while True:
        r, _, _ = select.select([fd], [], [], 0.1)
        if not r:
            idle()
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        while True:
            k = buf.find(b"\n")
            if k < 0:
                break
            yield buf[:k]
            buf = buf[k + 1 :]
    if buf:
        yield buf


def run_pub(args):
    say = _say_err(args)
    try:
        return _pub(args)
    except CLIError as e:
        say(str(e))
        return e.code
    finally:
        _release_outbox(args)


def _pub(args):
    kw, props = _settings(args, "pub")
    try:
        validate_name(args.topic)
    except ValueError as e:
        raise UsageError("-t: %s" % e)
    payload = None
    if args.message is not None:
        payload = _arg_bytes(args.message)
    elif args.null:
        payload = b""
    elif args.file is not None:
        try:
            with open(args.file, "rb") as f:
                payload = f.read()
        except OSError as e:
            raise CLIError("cannot read %s: %s" % (args.file, _os_reason(e)))
    elif args.stdin:
        payload = _stdin_bytes().read()
        if isinstance(payload, str):
            payload = payload.encode()
    pprops = props.get("publish")
    dbg = _debug(args)
    _hold_outbox(args, kw)
    client = _open(args, kw, reconnect=False)
    refused = []

    def on_published(pid, reason):
        if reason >= 0x80:
            refused.append((pid, reason))
    client.on_published = on_published

    def send(data):
        try:
            client.publish(args.topic, data, qos=args.qos, retain=args.retain, props=pprops)
        except ValueError as e:  # what the broker said it accepts (QoS, retain, size)
            raise CLIError("cannot publish: %s" % e)
        except OSError as e:
            if args.outbox is not None and e.errno == errno.ENOSPC:  # FileStore: "outbox full"
                raise CLIError("cannot store the message in %s: %s" % (args.outbox, _os_reason(e)))
            raise _failure(client, args, e)

    try:
        if payload is not None:
            for k in range(args.repeat):
                if k and args.repeat_delay > 0:
                    _pump(client, args, args.repeat_delay)
                send(payload)
        else:
            for line in _stdin_lines(lambda: client.loop(0)):
                send(line)
        s = client.session
        while s.pending():
            if not client.loop(100) and s.pending():
                raise _failure(client, args)
    except KeyboardInterrupt:
        client.disconnect()
        return EXIT_FAIL
    except BaseException:
        client.close()
        raise
    client.disconnect(props=props.get("disconnect"))
    if refused:
        pid, reason = refused[0]
        err = client.last_error
        if reason == 0x82 and isinstance(err, MQTTError) and err.code == 0x82:
            raise CLIError(str(err))  # a wrong acknowledgement: the broker broke the protocol (it says how)
        raise CLIError("the broker refused %d message(s): %s" % (len(refused), reason_text(reason)))
    return EXIT_OK


def _pump(client, args, seconds):
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return
        if not client.loop(int(min(left, 0.1) * 1000)) and not client.connected:
            raise _failure(client, args)


# ------------------------------------------------------------------ format

_ESCAPES = {"\\": b"\\", "0": b"\0", "a": b"\a", "e": b"\x1b", "n": b"\n", "r": b"\r", "t": b"\t", "v": b"\v"}
_CONVERSIONS = "%tpqrlmxXIUjPCDEFRS"
_ZERO_PAD = "EFlmSxX"
_MAX_WIDTH = "CIRt"


def compile_format(fmt):
    """The -F string as a list of bytes literals and (conversion, left, zero,
    width, precision) tuples; UsageError naming the first bad sequence."""
    items = []
    lit = bytearray()
    i = 0
    n = len(fmt)
    while i < n:
        c = fmt[i]
        if c == "\\":
            e = fmt[i + 1 : i + 2]
            if e not in _ESCAPES:
                raise UsageError("-F: invalid escape '\\%s'" % e)
            lit += _ESCAPES[e]
            i += 2
        elif c == "@":
            e = fmt[i + 1 : i + 2]
            if not e:
                raise UsageError("-F: '@' at the end of the format")
            if e == "@":
                lit += b"@"
            else:
                if lit:
                    items.append(bytes(lit))
                    lit = bytearray()
                items.append(("@", e))
            i += 2
        elif c == "%":
            j = i + 1
            left = zero = False
            while j < n and fmt[j] in "-0":
                left |= fmt[j] == "-"
                zero |= fmt[j] == "0"
                j += 1
            k = j
            while j < n and fmt[j].isdigit():
                j += 1
            width = int(fmt[k:j]) if j > k else 0
            prec = None
            if j < n and fmt[j] == ".":
                j += 1
                k = j
                while j < n and fmt[j].isdigit():
                    j += 1
                prec = int(fmt[k:j]) if j > k else 0
            conv = fmt[j : j + 1]
            if not conv or conv not in _CONVERSIONS:
                raise UsageError("-F: unsupported format sequence '%s'" % fmt[i : j + 1])
            if conv == "%":
                lit += b"%"
            else:
                if lit:
                    items.append(bytes(lit))
                    lit = bytearray()
                items.append((conv, left, zero and not left, width, prec))
            i = j + 1
        else:
            lit += _arg_bytes(c)
            i += 1
    if lit:
        items.append(bytes(lit))
    return items


def _iso(ns, micro=False):
    t = _dt.datetime.fromtimestamp(ns / 1e9).astimezone()
    if micro:
        return t.strftime("%Y-%m-%dT%H:%M:%S.%f%z")
    return t.strftime("%Y-%m-%dT%H:%M:%S%z")


_JSON_PROPS = ((P.PAYLOAD_FORMAT_INDICATOR, "payload-format-indicator"),
               (P.MESSAGE_EXPIRY_INTERVAL, "message-expiry-interval"), (P.CONTENT_TYPE, "content-type"),
               (P.RESPONSE_TOPIC, "response-topic"), (P.CORRELATION_DATA, "correlation-data"),
               (P.SUBSCRIPTION_IDENTIFIER, "subscription-identifier"), (P.USER_PROPERTY, "user-properties"))


def _value(conv, m, now):
    """Bytes of one conversion for the message snapshot m."""
    pr = m["props"] or {}
    if conv == "t":
        return m["topic"].encode()
    if conv == "p":
        return m["payload"]
    if conv == "q":
        return b"%d" % m["qos"]
    if conv == "r":
        return b"%d" % m["retain"]
    if conv == "l":
        return b"%d" % len(m["payload"])
    if conv == "m":
        return b"%d" % m["mid"]
    if conv == "x":
        return m["payload"].hex().encode()
    if conv == "X":
        return m["payload"].hex().upper().encode()
    if conv == "I":
        return _iso(now).encode()
    if conv == "U":
        return b"%d.%09d" % divmod(now, 1000000000)
    if conv == "j":
        d = {"tst": _iso(now, True), "topic": m["topic"], "qos": m["qos"], "retain": m["retain"],
             "payloadlen": len(m["payload"])}
        if m["qos"]:
            d["mid"] = m["mid"]
        if pr:
            jp = {}
            for pid, key in _JSON_PROPS:
                if pid in pr:
                    v = pr[pid]
                    if pid == P.USER_PROPERTY:
                        v = dict(v)
                    elif isinstance(v, (bytes, bytearray, memoryview)):
                        v = bytes(v).decode("utf-8", "backslashreplace")
                    jp[key] = v
            d["properties"] = jp
        d["payload"] = m["payload"].decode("utf-8", "backslashreplace")
        return json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode()
    if conv == "P":
        return " ".join("%s:%s" % kv for kv in pr.get(P.USER_PROPERTY, ())).encode()
    if conv == "S":
        sids = pr.get(P.SUBSCRIPTION_IDENTIFIER)
        if sids is None:
            return b""
        return ",".join(str(x) for x in (sids if isinstance(sids, list) else [sids])).encode()
    pid = {"C": P.CONTENT_TYPE, "D": P.CORRELATION_DATA, "E": P.MESSAGE_EXPIRY_INTERVAL,
           "F": P.PAYLOAD_FORMAT_INDICATOR, "R": P.RESPONSE_TOPIC}[conv]
    v = pr.get(pid)
    if v is None:
        return b""
    if isinstance(v, int):
        return b"%d" % v
    if isinstance(v, str):
        return v.encode()
    return bytes(v)


def render(items, m, now):
    out = bytearray()
    for it in items:
        if isinstance(it, bytes):
            out += it
            continue
        if it[0] == "@":
            e = it[1]
            if e == "N":
                out += b"%09d" % (now % 1000000000)
            else:
                out += time.strftime("%" + e, time.localtime(now // 1000000000)).encode()
            continue
        conv, left, zero, width, prec = it
        v = _value(conv, m, now)
        if prec is not None and conv in _MAX_WIDTH:
            v = v[:prec]
        if len(v) < width:
            pad = width - len(v)
            if left:
                v = v + b" " * pad
            elif zero and conv in _ZERO_PAD:
                v = b"0" * pad + v
            else:
                v = b" " * pad + v
        out += v
    return bytes(out)


# -------------------------------------------------------------------- sub


def run_sub(args):
    say = _say_err(args)
    restore = _stop_on_sigterm()
    try:
        return _sub(args, say)
    except CLIError as e:
        say(str(e))
        return e.code
    finally:
        _release_outbox(args)
        restore()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _stop_on_sigterm():
    """SIGTERM (kill, systemd, timeout) ends `tern sub` as Ctrl-C does: a
    DISCONNECT, so the broker drops the will, and status 0, as mosquitto_sub.
    Left alone when the signal is ignored or handled already or off the main
    thread. Returns what puts the old handler back."""
    import signal

    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return lambda: None
        signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _sub(args, say):
    start = time.monotonic()
    kw, props = _settings(args, "sub")
    for t in args.topics:
        try:
            validate_filter(t)
        except ValueError as e:
            raise UsageError("-t: %s" % e)
    items = compile_format(args.format) if args.format is not None else None
    sprops = props.get("subscribe", {})
    if args.timeout:
        kw["connect_timeout"] = max(0.1, min(10, args.timeout))
    kw["manual_ack"] = True  # acknowledge only what was printed
    dbg = _debug(args)
    out = getattr(sys.stdout, "buffer", None)
    state = {"printed": 0, "done": False, "code": EXIT_OK}
    eol = b"" if args.no_eol else b"\n"

    def write(data):
        if out is not None:
            out.write(data)
            out.flush()
        else:
            sys.stdout.write(data.decode("utf-8", "replace"))
            sys.stdout.flush()

    def on_message(msg):
        if state["done"]:
            return  # not acknowledged: a persistent session gets it next time
        retain = msg.retain
        if args.retained_only and not retain:
            state["done"] = True
            return
        if args.no_stale and retain:
            if msg.qos:
                client.ack(msg.ack_id)
            return
        payload = bytes(msg.payload)
        if items is not None:
            m = {"topic": msg.topic, "payload": payload, "qos": msg.qos, "retain": retain,
                 "mid": msg.pid if msg.qos else 0,
                 "props": msg.properties if args.version == 5 else None}
            line = render(items, m, time.time_ns())
        elif args.verbose:
            line = msg.topic.encode() + b" " + (payload if payload else b"(null)")
        else:
            line = payload
        try:
            write(line + eol)
        except BrokenPipeError:
            state["done"] = True
            state["pipe"] = True
            return
        if msg.qos:
            client.ack(msg.ack_id)
        state["printed"] += 1
        if args.count and state["printed"] >= args.count:
            state["done"] = True

    client = None

    def setup(c):
        nonlocal client
        client = c
        c.on_message = on_message

        def on_disconnect(err):
            if _broke_protocol(err):
                # e.g. MQTT 5: a packet over the RX_SIZE we announced; the broker would
                # send it again after every reconnect (retained, queued): the end
                c.reconnect = False
                raise _BrokeProtocol()
            if dbg:
                dbg("tern sub: %s; reconnecting" % _lost(c, err))

        c.on_disconnect = on_disconnect

    _hold_outbox(args, kw)
    client = _open(args, kw, reconnect=True, setup=setup)
    try:
        try:
            refused = []
            for t in args.topics:
                codes = client.subscribe(
                    t, args.qos, sub_id=sprops.get(P.SUBSCRIPTION_IDENTIFIER) or 0,  # none unless asked, as mosquitto_sub
                    user_props=sprops.get(P.USER_PROPERTY))
                if codes and codes[0] >= 0x80:
                    refused.append("subscription to %r refused by the broker: %s"
                                   % (t, reason_text(codes[0], args.version)))
            if refused and len(refused) == len(args.topics):
                raise CLIError(refused[0] if len(refused) == 1 else
                               "all %d subscriptions refused by the broker (first: %s)" % (
                                   len(refused), refused[0].split(": ", 1)[1]))
            for line in refused:
                say(line)
            if args.exit_subscribed:
                state["done"] = True
            while not state["done"]:
                wait = 100
                if args.timeout:
                    left = args.timeout - (time.monotonic() - start)
                    if left <= 0:
                        state["code"] = EXIT_TIMEOUT
                        say("timed out after %g s" % args.timeout)
                        break
                    wait = max(1, min(wait, int(left * 1000)))
                if not client.loop(wait) and _broke_protocol(client.last_error):
                    raise _BrokeProtocol()  # in a CONNACK, on a reconnect
                if client.session.stats_dropped > state.setdefault("dropped", 0):
                    # MQTT 3.1.x: the client discards what it cannot hold and acknowledges it
                    state["dropped"] = client.session.stats_dropped
                    say("a message over the receive limit of %d bytes was dropped (%d so far)"
                        % (RX_SIZE, state["dropped"]))
        except ConnectError as e:  # a reconnect the broker refused for good
            raise CLIError("connection refused by the broker: %s" % _refusal(e, args.version),
                           _refused_code(e))
        except ValueError as e:
            raise CLIError(str(e))
        except (OSError, _BrokeProtocol) as e:
            raise _failure(client, args, e if isinstance(e, OSError) else None)
    except KeyboardInterrupt:
        pass
    finally:
        client.disconnect(props=props.get("disconnect"))
    if state.get("pipe"):
        _quiet_stdout()
    return state["code"]


def _quiet_stdout():
    # stdout's reader went away (e.g. `| head -1`): no complaint at exit.
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
