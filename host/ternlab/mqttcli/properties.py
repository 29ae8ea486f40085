"""`-D COMMAND NAME VALUE`: MQTT 5 properties by mosquitto's names, checked
against the library's own rules before anything is sent."""

from tern import props as P
from tern.wire import CONNECT, DISCONNECT, PUBLISH, SUBSCRIBE

from .flags import arg_bytes
from .errors import UsageError


# MQTT 5 properties by mosquitto's names: identifier and the -D commands that may carry it.
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
SEP = "\0"  # joins the 3 or 4 words of one -D into one argparse value


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
        value = arg_bytes(text)  # as mosquitto: the argument's bytes
    else:
        value = (words[2], words[3])
    try:  # the library's own rules (e.g. payload-format-indicator is 0 or 1)
        P.encode({pid: [value] if t == P.TYPE_PAIR else value}, _PACKET[cmd])
    except ValueError as e:
        raise UsageError("-D %s %s: %s" % (cmd, name, e))
    return cmd, pid, value


def collect_properties(raw, tool):
    """{command: {identifier: value}} from the -D values (user properties as lists)."""
    out = {}
    for joined in raw or ():
        cmd, pid, value = _parse_property(joined.split(SEP), tool)
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
