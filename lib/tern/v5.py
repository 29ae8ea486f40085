"""The session's MQTT 5 paths that a plain connect never runs, imported on first use (a board
speaking MQTT 3.1.1, or MQTT 5 without them, does not load this module): topic aliases both ways, the checks of No Local, chosen subscription
identifiers and what the server lacks (functions of the session `s`, called from where they were
its methods), and for the drivers the error of a server's DISCONNECT and reply() to a request.
"""

from .wire import const, MQTTError

_PROTOCOL_ERROR = const(0x82)
_PUBLISH = const(3)
_P_ALIAS = const(0x23)
_P_ALIAS_MAX = const(0x22)


def publish_props(s, topic, payload, qos, props):
    # Session.publish with properties: checked, encoded (the block returned).
    if s.version != 5:
        raise ValueError("properties need MQTT 5")
    from . import props as P  # (loaded when properties are sent or received: see Session._on_publish)

    P.client_publish(props, payload, qos, topic, s.server.get(_P_ALIAS_MAX, 0))
    pblock = P.encode(props, _PUBLISH)
    if 2 + len(topic) + 2 + 5 + len(pblock) > len(s.tx):
        raise ValueError("topic and properties too long for the transmit buffer (%d bytes)" % len(s.tx))
    return pblock


def alias_out(s, topic, props, pblock, size, mx):
    # Session.publish of a QoS 0 message with outbound topic aliases on (outbound_aliases: how many
    # we may use towards the server, capped by the Topic Alias Maximum in its CONNACK). Only QoS 0
    # messages carry an outbound alias: aliases live only as long as one network connection, and a
    # QoS 1/2 message is stored as first sent and resent byte for byte after a reconnect, when any
    # alias it used would mean nothing (or something else) to the server. The first message to a
    # topic carries the topic and the alias; later ones only the alias. Aliases are handed out
    # until the cap is reached (no replacement) and forgotten on every new connection. The
    # property block for each topic is built once, so a repeat allocates nothing. Returns (topic,
    # property block) to send: the topic empty once its alias is set.
    d = s._oalias
    if d is None:
        d = s._oalias = {}
    blk = d.get(topic)
    new = blk is None and len(d) < s._oalias_cap
    if new:
        a = len(d) + 1
        blk = bytes((3, _P_ALIAS, a >> 8, a & 0xFF))
    if blk is not None:
        ablk = blk  # the alias alone, kept per topic
        if props:
            pp = dict(props)
            pp[_P_ALIAS] = blk[2] << 8 | blk[3]
            from . import props as P

            blk = P.encode(pp, _PUBLISH)
        if not new:
            return b"", blk
        if not mx or size + len(blk) - len(pblock) + 1 <= mx:
            # (+1: the remaining length may take a byte more) a new alias only where its property
            # keeps the packet within the server's maximum [MQTT-3.1.2-24]
            d[topic] = ablk
            return topic, blk
    return topic, pblock


def alias_in(s, m, now):
    # An inbound PUBLISH with a Topic Alias, or with an empty topic (which
    # needs one): the alias is learnt, or the topic it stands for filled in.
    a = m.alias
    if not a:
        s.violation(_PROTOCOL_ERROR, "empty topic without a topic alias", now)
    if a > s.topic_alias_max:
        s.violation(0x94, "unknown topic alias %d (maximum %d)" % (a, s.topic_alias_max), now)
    if s.in_aliases is None:
        s.in_aliases = {}
    if m.topic_end > m.topic_start:
        s.in_aliases[a] = bytes(s.rxmv[m.topic_start : m.topic_end])
    else:
        t = s.in_aliases.get(a)
        if t is None:
            s.violation(_PROTOCOL_ERROR, "unknown topic alias %d (maximum %d)" % (a, s.topic_alias_max), now)
        m.tbuf = t
        m.topic_start = 0
        m.topic_end = len(t)


def check_sub(s, flt, shared, match, no_local, sub_id):
    # No Local, a chosen subscription identifier, and what the server's last
    # CONNACK said it lacks (Session.subscribe's docstring): ValueError before
    # anything is registered or sent. (Retain Handling, an option a device
    # commonly sets, is checked in the session without loading this module.)
    if shared and no_local:
        raise ValueError("No Local cannot be set on a shared subscription")
    if shared and not s.shared_ok:
        raise ValueError("the server does not support shared subscriptions (CONNACK: Shared Subscription Available = 0)")
    if not s.wildcard_ok and (43 in match or 35 in match):  # "+" or "#"
        raise ValueError("the server does not support wildcard subscriptions (CONNACK: Wildcard Subscription Available = 0)")
    if sub_id:  # 0: none (the subscription is reached by copies without identifiers only)
        if not 0 < sub_id <= 268435455:
            raise ValueError("subscription identifier must be 1..268435455")
        if not s.sid_ok:
            raise ValueError("the server does not support subscription identifiers (CONNACK: Subscription Identifiers Available = 0)")
        for x in s.subs:  # an automatic identifier is never shared with a chosen one
            if x.sid == sub_id and x.auto and x.filter != flt:
                raise ValueError("subscription identifier %d is the automatic one of %r: give sub_id to all "
                                 "overlapping subscriptions or to none" % (sub_id, x.filter))


def reply_args(msg, props):
    """(topic, properties) to answer a request message `msg` (MQTT 5
    request/response): its Response Topic, with its Correlation Data copied."""
    mp = msg.properties or {}
    topic = mp.get(0x08)
    if not topic:
        raise ValueError("the message has no response topic to reply to")
    out = dict(props) if props else {}
    if 0x09 in mp:
        out[0x09] = mp[0x09]
    return topic, out


def server_disconnect(reason, p):
    """The error for a DISCONNECT from the server (MQTT 5 only), with its reason string."""
    rs = p.props.get(0x1F) if p is not None and p.props else None
    return MQTTError(reason, "server sent DISCONNECT" + (": " + rs if rs else ""))


def unaliased(s, pid, dup, now):
    # A stored PUBLISH sent on a later connection than the one it was
    # published on (MQTT 5): a Topic Alias in it means nothing there
    # [MQTT-3.3.2-7], and the server may now take fewer aliases, or none
    # ([MQTT-3.3.2-9]: Mosquitto answers DISCONNECT 0x94, at every
    # reconnect). It goes with its topic alone: a QoS 1/2 message always
    # carries its topic (props.client_publish), and topic and properties
    # are otherwise what was stored. Without an alias it goes as stored.
    # Returns False when there was none (the caller sends the record).
    from .wire import Reader, get_varint, varint_size
    from . import props as P, pkt

    st = s.store
    tx = s.tx
    s.flush()
    n = st.read(pid, 0, tx)  # the header fits in tx (publish() checked)
    i = 1 + varint_size(get_varint(tx, 1, n))
    tl = tx[i] << 8 | tx[i + 1]
    j = i + 2 + tl + 2  # after the topic and the packet id (QoS 1/2)
    r = Reader(tx, j, n)
    pr = P.decode(r, 3)
    if not pr or 0x23 not in pr:
        return False
    size = st.size(pid)
    del pr[0x23]
    b0 = tx[0]
    topic = bytes(tx[i + 2 : i + 2 + tl])
    off = r.pos  # where the payload starts in the record
    h = pkt.publish_header_into(tx, topic, (b0 >> 1) & 3, b0 & 1, dup, pid, size - off, 5,
                                P.encode(pr, 3) if pr else None)
    while off < size:  # one write when it fits (see Session.publish), else header and payload in parts
        k = st.read(pid, off, memoryview(tx)[h:]) if h < len(tx) else 0
        if not k and not h:
            raise OSError("store returned a short record for packet %d" % pid)
        s.out(tx, 0, h + k)
        off += k
        h = 0
    if h:
        s.out(tx, 0, h)
    s.last_tx = now
    return True
