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
of a -L URL is registered with ternlab.mqttcli.redact.add_secret before argparse runs.

This module registers the two commands and their flags; the work is done by the other modules of
ternlab.mqttcli (each one job, none importing this module or ternlab.cli):

- argv          -- the argv pre-pass (mosquitto's -D words, `-m -5`, `-rq1`);
- flags         -- the broker flags shared with `tern collect`, -L URLs, TLS;
- properties    -- -D MQTT 5 properties;
- connect       -- flags -> Client keyword arguments, connecting, why it ended;
- outbox_dir    -- --outbox DIR;
- packet_trace  -- the -d packet trace, on tern.wire / tern.codec;
- output_format -- the -F output format;
- pub, sub      -- the commands themselves;
- errors        -- exit statuses, reason code names, one-line errors;
- redact        -- the passwords no output may show.
"""

import argparse

from .flags import (add_broker_options, add_login_options, add_tls_options, expiry_arg, int_range, qos_arg,
                         seconds_arg)
from .argv import prepare_argv  # noqa: F401  (ternlab.cli runs it before argparse)
from .errors import EXIT_USAGE  # noqa: F401  (ternlab.cli: a bad argument's exit status)
from .pub import run_pub
from .sub import run_sub

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
        "a password without a user name is an error on MQTT 5 too (mosquitto_pub/sub send it alone on MQTT 5)",
        "--insecure skips only the host name check: the certificate chain is still verified",
        "--help exits 0 (mosquitto: 1)",
        "an empty topic (-t '') is an error, status 1, before connecting (mosquitto_pub prints an error and "
        "exits 0; mosquitto_sub sends the empty filter and waits)",
        "--will-qos without --will-topic is an error, status 1, as --will-payload and --will-retain are for "
        "both (mosquitto connects without a will and exits 0)",
    ),
    "sub": (
        "a QoS 1/2 message is acknowledged after it is printed (mosquitto_sub: before); one that arrives "
        "after -C is done is not acknowledged, and stays queued for the next run with -c",
        "MQTT 3.1.1: a message over the receive limit (16 MiB) is dropped with one line on stderr",
        "-F %j: a payload byte that is not UTF-8 is written as the escape \\udcXX (80..ff), which "
        "json.loads(line)['payload'].encode('utf-8', 'surrogateescape') turns back into the bytes "
        "(mosquitto_sub writes the raw byte: the line is not UTF-8)",
    ),
}


NOT_IMPLEMENTED = ("-A, --unix, --proxy, --psk, --tls-version, --ciphers, ws:// and wss:// URLs; "
                   "tern sub: -T, -U, --remove-retained, --random-filter, -F %A and %J")


def _epilog(tool):
    return "differs from mosquitto_%s on purpose:\n%s\nnot implemented: %s" % (
        tool, "\n".join("  * " + d for d in DIFFERENCES["both"] + DIFFERENCES.get(tool, ())),
        NOT_IMPLEMENTED.split("; tern sub")[0] if tool == "pub" else NOT_IMPLEMENTED)



def _common_options(p, tool):
    p.add_argument("--help", action="help", help="show this help and exit")
    g = p.add_argument_group("connection")
    add_broker_options(g, id_help="client id (default: chosen by the broker; tern_%s_PID for MQTT 3.1)" % tool)
    g.add_argument("-L", "--url", metavar="URL", help="mqtt(s)://[user[:password]@]host[:port]/topic, as "
                   "mosquitto's -L (mqtts: TLS, with the system's CAs unless --cafile/--capath); -h, -p, -u, "
                   "-P%s given as well win over the URL's parts" % (" and -t" if tool == "pub" else ""))
    g.add_argument("-I", "--id-prefix", dest="id_prefix", help="client id: this prefix and the process id")
    g.add_argument("-c", "--disable-clean-session", dest="persistent", action="store_true",
                   help="persistent session: no clean session / clean start (needs -i or -I)")
    g.add_argument("-x", "--session-expiry-interval", dest="expiry", type=expiry_arg,
                   help="MQTT 5 session expiry in seconds; -1 never expires (default: -1 with -c, else 0)")
    add_login_options(g)
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
    w.add_argument("--will-qos", type=qos_arg, default=0, help="QoS of the will message")
    w.add_argument("--will-retain", action="store_true", help="retain the will message")
    add_tls_options(p)



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
    g.add_argument("-q", "--qos", type=qos_arg, default=0, help="QoS 0, 1 or 2 (default: 0)")
    g.add_argument("-r", "--retain", action="store_true", help="retain the message")
    g.add_argument("-M", dest="max_inflight", type=int_range("max_inflight", 0, 65535), default=20,
                   help="QoS 1/2 messages in flight at most (default: 20, as mosquitto_pub; 0: no limit)")
    g.add_argument("--repeat", type=int_range("repeat", 1, 1 << 31), default=1,
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
    g.add_argument("-q", "--qos", type=qos_arg, default=0, help="QoS of the subscriptions (default: 0)")
    g.add_argument("-C", dest="count", type=int_range("count", 1, 1 << 31),
                   help="exit after printing this many messages")
    g.add_argument("-R", dest="no_stale", action="store_true", help="skip stale messages (retain flag set)")
    g.add_argument("--retained-only", action="store_true",
                   help="print only retained messages; exit at the first message without the retain flag")
    g.add_argument("-E", dest="exit_subscribed", action="store_true", help="exit once subscribed")
    g.add_argument("-W", dest="timeout", type=seconds_arg,
                   help="exit after this many seconds (status 27), as mosquitto_sub")
    g.add_argument("-v", "--verbose", action="store_true", help="print 'topic payload'")
    g.add_argument("-N", dest="no_eol", action="store_true", help="no newline after each message")
    g.add_argument("-F", dest="format", help="output format (see the description above)")
    sub.set_defaults(func=run_sub, tool="sub")
