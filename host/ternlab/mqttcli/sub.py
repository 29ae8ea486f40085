"""`tern sub`: subscribe and print each message (plain, -v or -F), acknowledging
a QoS 1/2 message only after it is printed; -C, -W, -E, -R, --retained-only
end the run as mosquitto_sub. SIGTERM ends it as Ctrl-C does. Flags are
registered in ternlab.mqttcli.commands."""

import os
import sys
import time

from tern import props as P
from tern.client import ConnectError
from tern.topic import validate_filter

from . import connect
from .output_format import compile_format, render
from .connect import debug_printer, failure, lost, open_client, say_err, settings
from .errors import (EXIT_OK, EXIT_TIMEOUT, BrokeProtocol, CLIError, UsageError, broke_protocol, reason_text,
                          refusal, refused_code)
from .outbox_dir import hold_outbox, outbox_status, release_outbox


def run_sub(args):
    say = say_err(args)
    restore = _stop_on_sigterm()
    try:
        return outbox_status(args, _sub(args, say))
    except CLIError as e:
        say(str(e))
        return e.code
    finally:
        release_outbox(args)
        restore()


RECONNECT_MAX_S = 1.0


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
    kw, props = settings(args, "sub")
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
    dbg = debug_printer(args)
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
            if broke_protocol(err):
                # e.g. MQTT 5: a packet over the RX_SIZE we announced; the broker would
                # send it again after every reconnect (retained, queued): the end
                c.reconnect = False
                raise BrokeProtocol()
            if dbg:
                dbg("tern sub: %s; reconnecting" % lost(c, err))

        c.on_disconnect = on_disconnect

    hold_outbox(args, kw)
    # After a lost connection: the library's policy (the first try at once, then backoff), with retries
    # at most a second apart, as mosquitto_sub's (libmosquitto's reconnect delay of 1 s): someone is
    # watching this one, and a broker back from a restart is met within a second.
    kw["backoff_max"] = RECONNECT_MAX_S
    client = open_client(args, kw, reconnect=True, setup=setup)
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
                if not client.loop(wait) and broke_protocol(client.last_error):
                    raise BrokeProtocol()  # in a CONNACK, on a reconnect
                if client.session.stats_dropped > state.setdefault("dropped", 0):
                    # MQTT 3.1.x: the client discards what it cannot hold and acknowledges it
                    state["dropped"] = client.session.stats_dropped
                    say("a message over the receive limit of %d bytes was dropped (%d so far)"
                        % (connect.RX_SIZE, state["dropped"]))
        except ConnectError as e:  # a reconnect the broker refused for good
            raise CLIError("connection refused by the broker: %s" % refusal(e, args.version),
                           refused_code(e))
        except ValueError as e:
            raise CLIError(str(e))
        except (OSError, BrokeProtocol) as e:
            raise failure(client, args, e if isinstance(e, OSError) else None)
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
