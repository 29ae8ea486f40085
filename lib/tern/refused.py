"""Refusals, imported on first use: a publish() call the drivers refuse (positional(): umqtt's
publish(t, m, True)), and what they do when a connection attempt fails (a connect that
succeeds never loads it): the text of a broker's refusal (ConnectError), and the version
fallback of `version=(5, 4)` with the session's switch to an older version (also made at start
for a store whose broker took the older one last time, and for MQTT 3.1).
"""


def describe(reason, version):
    """(message, permanent) of ConnectError for a CONNACK refusal code."""
    # Names for the refusals a user most often has to act on.
    w = {4: "bad user name or password", 5: "not authorized", 0x86: "bad user name or password",
         0x87: "not authorized", 0x8A: "banned", 0x8C: "bad authentication method"}.get(reason)
    if reason == 1 or reason == 0x84:  # unacceptable / unsupported protocol version
        w = "the broker does not support MQTT %s" % ("3.1.1" if version == 4 else "3.1" if version == 3 else "5")
    # Refusals a retry with the same settings cannot fix: protocol version
    # (1, 0x84), bad or unknown identity (2, 4, 5, 0x85, 0x86, 0x87, 0x8A,
    # 0x8C), a CONNECT or will the server does not take (0x95, 0x99, 0x9A,
    # 0x9B). Bytes: less memory than a tuple.
    return ("connection refused by the broker: reason 0x%02X%s" % (reason, " (%s)" % w if w else ""),
            reason in b"\x01\x02\x04\x05\x84\x85\x86\x87\x8a\x8c\x95\x99\x9a\x9b")


def fallback(d, reason, refusal):
    """After a failed connect of driver d: reason is the CONNACK's refusal code, -1
    when the broker never answered an MQTT 5 CONNECT (amqtt, when it
    carries properties) or closed the connection before a CONNACK (RabbitMQ
    3.10's answer to MQTT 5), 0 for another error. True when the next version
    of `version=(5, 4)` is to be tried now (the broker does not support this
    one, and nothing is stored pending in this one's encoding); remembered in
    the store's meta "version" (a durable store: across reboots too). A
    refusal not tried again raises refusal (ConnectError)."""
    s = d.session
    vs = d._versions
    if not (reason == 1 or reason == 0x84 or reason < 0 and s.version == 5) or s.version == vs[-1] or s.pending():
        if reason > 0:
            raise refusal(reason, s.version)
        return False
    v = vs[vs.index(s.version) + 1]
    set_version(s, v)
    s.store.set_meta("version", str(v).encode())
    return True


def set_version(s, v):
    """Make session s speak MQTT 3.1.1 (4) or 3.1 (3) from its next CONNECT on,
    for a driver falling back from MQTT 5: what only MQTT 5 has (CONNECT
    properties, subscription options beyond QoS) is dropped; dispatch
    goes by topic.
    Stored packets keep the encoding they were stored with.
    MQTT 3.1 needs a client id of 1-23 characters: an empty one gets a
    random one, but not for a persistent session (clean=False), which a
    restart could never resume; the broker refuses the empty id instead
    (identifier rejected)."""
    s.version = v
    s.connect_props = None
    for x in s.subs:
        x.opts &= 3
    if v == 3 and not s.client_id and s.conn[0]:
        import random

        s.client_id = "tern_%08x" % random.getrandbits(32)


def positional(extra):
    """publish() got arguments after the payload: umqtt's publish(topic, msg, retain, qos). Tern's
    qos and retain are keywords (a positional True would be QoS 1, silently): refused, nothing stored."""
    raise TypeError("publish() takes qos and retain as keywords, got %d more positional argument%s: "
                    "publish(topic, msg, retain=True, qos=1) (umqtt's publish(t, m, True) means retain=True)"
                    % (len(extra), "s" if len(extra) > 1 else ""))
