"""From the parsed flags of `tern pub` / `tern sub` to a connected Client:
`settings` checks what argparse cannot and builds the Client's keyword
arguments (with -L, -D, the will and the outbox), `open_client` connects to
the first address that answers, `failure` says why a connection ended. The
error and debug printers of both commands are here too."""

import os
import socket
import ssl
import sys

from tern import props as P
from tern.client import Client, ConnectError
from tern.topic import validate_name
from tern.wire import MQTTError

from .flags import default_port, login, mqtt_binary, mqtt_string, parse_url, tls_context
from .errors import (CLIError, UsageError, broke_protocol, os_reason, protocol_error, reason_text, refusal,
                          refused_code, say_err)  # noqa: F401  (say_err: pub and sub take it from here)
from .properties import collect_properties
from .outbox_dir import claim_outbox, kept
from .packet_trace import hook_trace

# Receive and transmit buffers. A board keeps these small; a host tool must
# handle whatever a broker forwards, so the defaults are generous (an MQTT 5
# broker is told the receive size as Maximum Packet Size).
RX_SIZE = 16 * 1024 * 1024
TX_SIZE = 256 * 1024
MAX_PACKET = 268435460


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
    if tool == "pub" and args.topic == "":
        raise UsageError("-t: the topic is empty (a topic name has at least one character)")
    if not (args.topic if tool == "pub" else args.topics):
        raise UsageError("a topic is needed: -t/--topic or -L URL")


def settings(args, tool):
    """Check what argparse cannot and build the Client's keyword arguments."""
    _apply_url(args, tool)
    v = args.version
    props = {}
    if args.props:
        if v != 5:
            raise UsageError("-D needs MQTT 5 (-V 5)")
        props = collect_properties(args.props, tool)
    if v != 5:
        args.expiry = None  # as mosquitto_pub/sub: -x is an MQTT 5 setting, ignored under 3.1.x
    if args.client_id is not None and args.id_prefix is not None:
        raise UsageError("-i and -I cannot be used together")
    if args.persistent and args.client_id is None and args.id_prefix is None:
        raise UsageError("-c needs a client id (-i or -I)")
    if args.outbox is not None and (not args.persistent or args.client_id is None):
        raise UsageError("--outbox needs -c and a client id (-i), the same on every run")
    password = login(args)
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
    mqtt_string("-i" if args.client_id is not None else "-I", cid)
    will_payload = mqtt_binary("--will-payload", args.will_payload or "")
    ctx = tls_context(args)
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


def debug_printer(args):
    if not args.debug:
        return None

    def say(msg):  # on stdout, as mosquitto_pub/sub -d (among the messages, for tern sub)
        sys.stdout.write(msg + "\n")
        sys.stdout.flush()
    return say


def open_client(args, kw, reconnect, setup=None):
    """Connect to the first address of --host that answers; CLIError otherwise.
    setup(client) runs before connecting: messages of a persistent session
    may arrive in the same read as CONNACK, so handlers must be in place."""
    port = default_port(args)
    where = "%s:%d" % (args.host, port)
    try:
        infos = socket.getaddrinfo(args.host, port, 0, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise CLIError("cannot resolve host %r: %s" % (args.host, getattr(e, "strerror", None) or e))
    addrs = []
    for info in infos:
        if info[4][0] not in addrs:
            addrs.append(info[4][0])
    dbg = debug_printer(args)
    last = None
    for ip in addrs:
        c = Client(server=ip, server_hostname=args.host, reconnect=False, **kw)
        if args.outbox is not None:
            claim_outbox(args, c.session)
        if dbg:
            hook_trace(c, dbg)
        if setup:
            setup(c)
        try:
            c.connect()
        except ConnectError as e:
            raise CLIError("connection to %s refused by the broker: %s" % (where, refusal(e, args.version)),
                           refused_code(e))
        except ssl.SSLCertVerificationError as e:
            raise CLIError("TLS: the certificate of %s failed verification: %s" % (where, e.verify_message or e.reason))
        except ssl.SSLError as e:
            raise CLIError("TLS handshake with %s failed: %s" % (where, e.reason or e))
        except MQTTError as e:  # a CONNACK that breaks the protocol (or something before it)
            raise protocol_error(e, args.version)
        except OSError as e:
            last = e
            c.session.store.close()  # the next address's client opens it again
            continue
        c.reconnect = reconnect
        return c
    raise CLIError("cannot connect to %s: %s" % (where, os_reason(last)))


def failure(client, args, e=None):
    """The CLIError for a connection that ended under a command."""
    err = client.last_error or e
    if broke_protocol(err):
        return protocol_error(err, args.version)
    return CLIError(lost(client, e) + kept(args, client))


def lost(client, e=None):
    err = client.last_error or e
    if isinstance(err, MQTTError) and err.args and err.args[0] == "server sent DISCONNECT":
        return "the broker closed the connection: %s" % reason_text(err.code)
    if isinstance(err, OSError):
        return "connection lost: %s" % os_reason(err)
    return "connection lost: %s" % (err or "unknown reason")
