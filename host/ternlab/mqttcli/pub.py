"""`tern pub`: publish one message (-m, -f, -s, -n, with --repeat), or one per
line of stdin (-l), then disconnect once every QoS 1/2 message is
acknowledged. Flags are registered in ternlab.mqttcli.commands."""

import errno
import os
import select
import sys
import time

from tern.topic import validate_name
from tern.wire import MQTTError

from .flags import arg_bytes
from .connect import failure, open_client, say_err, settings
from .errors import EXIT_FAIL, EXIT_OK, CLIError, UsageError, os_reason, reason_text
from .outbox_dir import hold_outbox, outbox_status, release_outbox


def _stdin_bytes():
    s = sys.stdin
    return getattr(s, "buffer", s)


def _stdin_batches(client):
    """Lists of stdin's lines without their '\\n' (as mosquitto_pub -l: an empty line is an empty
    message), one list per read of up to 256 KiB. While it waits for stdin the client reads what
    the broker sends as it comes (the acknowledgements that move QoS 1/2 messages on: a PUBREC is
    answered at once, not at the next line) and keeps the connection alive."""
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
            yield [line[:-1] if line.endswith(b"\n") else line]
    rest = b""
    while True:
        sock = client.sock
        r, _, _ = select.select([fd] if sock is None else [fd, sock], [], [], 0.1)
        if fd not in r:
            client.loop(0)
            continue
        chunk = os.read(fd, 1 << 18)
        if not chunk:
            break
        lines = (rest + chunk if rest else chunk).split(b"\n")
        rest = lines.pop()  # a line not ended yet (b"": the chunk ended with one)
        if lines:
            yield lines
    if rest:
        yield [rest]


def run_pub(args):
    say = say_err(args)
    try:
        return outbox_status(args, _pub(args))
    except CLIError as e:
        say(str(e))
        return e.code
    finally:
        release_outbox(args)


def _pub(args):
    kw, props = settings(args, "pub")
    try:
        validate_name(args.topic)
    except ValueError as e:
        raise UsageError("-t: %s" % e)
    payload = None
    if args.message is not None:
        payload = arg_bytes(args.message)
    elif args.null:
        payload = b""
    elif args.file is not None:
        try:
            with open(args.file, "rb") as f:
                payload = f.read()
        except OSError as e:
            raise CLIError("cannot read %s: %s" % (args.file, os_reason(e)))
    elif args.stdin:
        payload = _stdin_bytes().read()
        if isinstance(payload, str):
            payload = payload.encode()
    pprops = props.get("publish")
    kw["window"] = args.max_inflight or 65535  # -M (0: no limit but the outbox's)
    hold_outbox(args, kw)
    client = open_client(args, kw, reconnect=False)
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
                raise CLIError("cannot store the message in %s: %s" % (args.outbox, os_reason(e)))
            raise failure(client, args, e)

    s = client.session
    try:
        if payload is not None:
            for k in range(args.repeat):
                if k and args.repeat_delay > 0:
                    _pump(client, args, args.repeat_delay)
                send(payload)
        else:
            for lines in _stdin_batches(client):
                for line in lines:
                    if s.outbox_full():
                        # read what the broker sent first: publish() would find no room, and wait
                        # for it itself at the cost of a refused try and two clock reads a wake-up
                        client.loop(20, True)
                    send(line)
        while s.pending():
            if not client.loop(100, True) and s.pending():  # (brief: back as soon as the last ack is read)
                raise failure(client, args)
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
            raise failure(client, args)
