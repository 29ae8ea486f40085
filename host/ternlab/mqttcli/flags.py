"""The broker flags `tern pub`, `tern sub` and `tern collect` share, in one
dialect: mosquitto_pub/sub's spellings, value checks and rules.

    -h/--host  -p/--port  -V/--protocol-version  -i/--id  -k/--keepalive
    -u/--username  -P/--pw  --cafile --capath --tls-use-os-certs --cert --key --insecure

What each command chooses for itself: the default host (pub/sub: localhost;
collect: 127.0.0.1), the default protocol version (pub/sub: 3.1.1, as
mosquitto; collect: 5, whose session expiry and Receive Maximum it relies
on) and whether -i is required (collect). `tern collect` also keeps its older
spelling `--password` as an alias of `-P/--pw`.

Rules: a password needs a user name, on every MQTT version (mosquitto_pub/sub
2.0 refuse a password alone before MQTT 5 and send it alone on MQTT 5; Tern
keeps the one rule tern collect always had). TLS is on with --cafile, --capath
or --tls-use-os-certs and always verifies the certificate chain; --cert, --key
and --insecure need it; the port defaults to 8883 with TLS, 1883 without.

Also here: the argument types (port, QoS, version, seconds...), MQTT string
checks for the user name and client id, and mosquitto's -L URL.
"""

import argparse
import os
import ssl

from tern.wire import utf8

from .errors import CLIError, UsageError, os_reason
from .redact import add_secret, add_url_secrets


def int_range(what, lo, hi):
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


def qos_arg(text):
    if text not in ("0", "1", "2"):
        raise argparse.ArgumentTypeError("QoS must be 0, 1 or 2, not %r" % text)
    return int(text)


_VERSIONS = {
    "31": 3, "mqttv31": 3, "3.1": 3,
    "311": 4, "mqttv311": 4, "3.1.1": 4,
    "5": 5, "mqttv5": 5, "5.0": 5,
}


def version_arg(text):
    v = _VERSIONS.get(text.lower())
    if v is None:
        raise argparse.ArgumentTypeError(
            "protocol version must be 31, 311 or 5 (or mqttv31, mqttv311, mqttv5), not %r" % text)
    return v


def expiry_arg(text):
    if text in ("-1", "∞"):
        return 0xFFFFFFFF
    return int_range("session expiry interval", 0, 0xFFFFFFFF)(text)


def seconds_arg(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("timeout must be a number of seconds, not %r" % text)
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError("timeout must be more than 0 seconds, not %r" % text)
    return v


def arg_bytes(text):
    """An argument's bytes as the shell passed them: Python decodes argv with
    surrogateescape, so bytes that are not UTF-8 come back unchanged (as
    mosquitto sends -m, --will-payload and -F text)."""
    return os.fsencode(text)


def mqtt_string(flag, text):
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


def mqtt_binary(flag, text):
    """The argument's bytes as MQTT binary data (password, will payload)."""
    b = arg_bytes(text)
    if len(b) > 65535:
        raise UsageError("%s is longer than 65535 bytes (%d)" % (flag, len(b)))
    return b


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
        if not (port.isdigit() and 1 <= int(port) <= 65535):  # never quoted: it may be a password
            raise UsageError("-L: the URL's port is not a number 1..65535 (mqtt://user:password@host:port/topic; "
                             "a password holding '/' or '@' goes in -P)")
        port = int(port)
    return tls, host, port or (8883 if tls else 1883), user, password, topic


PASSWORD_FLAGS = ("-P", "--pw")  # and tern collect's old --password


def add_broker_options(g, host_default=None, host_help="localhost", version_default=4, id_dest="client_id",
                       id_required=False, id_help="client id"):
    """-h -p -V -i -k on the argument group g (login and TLS: add_login_options, add_tls_options)."""
    g.add_argument("-h", "--host", default=host_default, help="broker host (default: %s)" % host_help)
    g.add_argument("-p", "--port", type=int_range("--port", 1, 65535),
                   help="broker port (default: 1883, or 8883 with TLS)")
    names = {3: "31", 4: "311", 5: "5"}
    g.add_argument("-V", "--protocol-version", dest="version", type=version_arg, default=version_default,
                   metavar="VERSION", help="MQTT version: %s; mqttv31, mqttv311, mqttv5 too" % ", ".join(
                       n + (" (default)" if v == version_default else "") for v, n in sorted(names.items())))
    # a required -i is named --id first in argparse's message (tern collect's words before it had -i)
    g.add_argument(*(("--id", "-i") if id_required else ("-i", "--id")), dest=id_dest, required=id_required,
                   help=id_help)
    g.add_argument("-k", "--keepalive", type=int_range("--keepalive", 5, 65535), default=60,
                   help="keepalive in seconds, 5 to 65535 as mosquitto_pub/sub take it (default: 60)")


def add_login_options(g, old_spellings=False):
    """-u and -P/--pw (and, with old_spellings, tern collect's --password)."""
    g.add_argument("-u", "--username", help="user name")
    g.add_argument(*PASSWORD_FLAGS, *(("--password",) if old_spellings else ()), dest="password",
                   help="password (never printed; needs -u)")


def add_tls_options(p):
    t = p.add_argument_group("TLS (on with --cafile, --capath or --tls-use-os-certs; the server is verified)")
    t.add_argument("--cafile", help="CA certificates (PEM) to verify the broker with")
    t.add_argument("--capath", help="directory of CA certificates")
    t.add_argument("--tls-use-os-certs", action="store_true", help="trust the system's CA certificates")
    t.add_argument("--cert", help="client certificate (PEM)")
    t.add_argument("--key", help="client private key (PEM)")
    t.add_argument("--insecure", action="store_true",
                   help="do not check that the certificate names the host (the chain is still verified)")


def register_passwords(argv, flags=PASSWORD_FLAGS + ("--password",), urls=("-L", "--url")):
    """Register the value of every password flag in argv with add_secret, and
    what may be a password in every -L URL, before argparse runs (it may quote
    a value in an error message)."""
    for i, a in enumerate(argv):
        if a == "--":
            return
        for f in flags + urls:
            if a == f and i + 1 < len(argv):
                value = argv[i + 1]
            elif a.startswith(f + "=") or (len(f) == 2 and a.startswith(f) and len(a) > 2):
                value = a[len(f) + (a[len(f)] == "=" and len(f) > 2):]
            else:
                continue
            (add_url_secrets if f in urls else add_secret)(value)


def tls_wanted(args):
    return bool(args.cafile or args.capath or args.tls_use_os_certs)


def default_port(args):
    return args.port or (8883 if tls_wanted(args) else 1883)


def login(args, old_spellings=False):
    """The user name checked as an MQTT string and the password as MQTT binary
    data (bytes), or None; UsageError (naming the flag, never the value) when
    wrong, and for a password without a user name."""
    if args.password is not None and args.username is None:
        raise UsageError("%s needs --username (-u): a password is only sent with a user name, on every MQTT version"
                         % ("-P/--pw/--password" if old_spellings else "-P/--pw"))
    if args.username is not None:
        mqtt_string("-u", args.username)
    return None if args.password is None else mqtt_binary("-P", args.password)


def tls_context(args):
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
        raise CLIError("cannot load %s: %s" % (what, os_reason(e) if not isinstance(e, ssl.SSLError)
                                               else e.reason or e))
    if args.insecure:
        ctx.check_hostname = False
    return ctx
