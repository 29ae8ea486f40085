"""The session's rare fault paths, imported on first use: a packet its connection's state does not
read (a PUBLISH before CONNACK, a second CONNACK), an acknowledgement of the wrong type from the
server, an inbound packet larger than the receive buffer, and inbound QoS 2 messages over the cap
of ids awaiting PUBREL or whose id the store could not record (Session._admit says why;
InOverflow keeps the ids of those taken all the same). Functions of the session (`s`), called
from where they were its methods.
"""

from .wire import const, MQTTError, fail
from . import pkt

_CONNACK = const(2)
_PUBLISH = const(3)
_PUBACK = const(4)
_PUBCOMP = const(7)
_V5 = const(5)
_PROTOCOL_ERROR = const(0x82)
_QOS2 = const(2)  # the session's ring flags
_CTRL = const(8)


def unexpected(s, t, pos, end, now):
    # A packet of type t that the session's state does not read (Session._READS).
    if t != _CONNACK:
        s.violation(_PROTOCOL_ERROR, "packet type %d before CONNACK" % t, now)
    p = pkt.decode(s.rxmv[pos:end], s.version, len(s.rx))
    s.violation(_PROTOCOL_ERROR, "unexpected %s (reason 0x%02X)" % ("CONNACK", p.reason), now)


def wrong_ack(s, t, pid, f, now):
    # An acknowledgement of the wrong type for what pid is (a PUBACK for
    # QoS 2, a PUBREC for QoS 1, a PUBCOMP before PUBREC, a SUBACK for an
    # UNSUBSCRIBE ...): a protocol violation, so the connection ends. A
    # PUBLISH was given back failed (EV_PUBLISHED 0x82, by the session) rather
    # than kept: sent again after the reconnect, it would meet the same answer
    # every time (a broker that acknowledges QoS 2 as QoS 1 does so for good).
    n = ("PUBACK", "PUBREC", "PUBREL", "PUBCOMP", "SUBSCRIBE", "SUBACK", "UNSUBSCRIBE", "UNSUBACK")
    if f & _CTRL:
        what = n[s.store.kind(pid) - _PUBACK]
    else:
        what = "QoS %d message" % (2 if f & _QOS2 else 1)
    s.violation(_PROTOCOL_ERROR, "protocol violation: the broker answered %s %d with %s%s%s" % (
        what, pid, n[t - _PUBACK],
        " (it does not do QoS 2: publish at QoS 1 to this broker)" if t == _PUBACK and f & _QOS2 else
        " before PUBREC" if t == _PUBCOMP and f & _QOS2 else "",
        "" if f & _CTRL else "; the message is given back failed (0x82)"), now)


def oversize(s, pos, end, size):
    # A packet larger than the receive buffer. MQTT 5 announced the
    # buffer as our Maximum Packet Size: the server broke it (0x95).
    # MQTT 3.1.x cannot say it, and a disconnect would not help: the
    # broker sends the message again after every reconnect and the client
    # would never get past it. So a PUBLISH is discarded as it streams in
    # and acknowledged (stats_dropped counts it). True once its packet id
    # is read (bytes to skip in s.skip); False: more bytes needed first.
    rx = s.rx
    b = rx[pos]
    if s.version != _V5 and b >> 4 == _PUBLISH:
        h = pos + 2
        while rx[h - 1] & 0x80:  # past the remaining length
            h += 1
        if h + 2 > end:
            return False
        q = b >> 1 & 3
        if q == 3:
            fail("QoS 3")  # as parse_publish says it of a packet that fits
        h += 2 + (rx[h] << 8 | rx[h + 1]) + (2 if q else 0)  # past the topic and packet id
        if h - pos <= len(rx):  # else a topic alone fills the buffer: 0x95 all the same
            if h > end:
                return False
            pid = rx[h - 2] << 8 | rx[h - 1] if q else 0
            if q and not pid:
                fail("packet id 0")
            s.skip = size
            s.skip_id = q << 16 | pid
            return True
    raise MQTTError(0x95, "packet of %d bytes over the receive buffer's %d" % (size, len(rx)))


def over_cap(s, pid, rec, now):
    # Session._admit at the cap (Session._in_cap: four times receive_max, at least 128) of inbound
    # QoS 2 ids awaiting PUBREL that the store holds. No cap on the session's side can hold what
    # Mosquitto 2.0.11 sends: with messages queued for the client it sends the whole queue (up to
    # max_queued_messages, 1,000 by default) before the first PUBREL of all but the first window,
    # whatever Receive Maximum was announced (MQTT 5) and whether or not we send PUBREC (its quota
    # does not hold: tests/lib/test_qos2_burst.py). Not reading on would wait for ever for those
    # PUBRELs, and refusing (0x93) throws away a clean session's queue; so:
    # - a session that ends with the connection (ephemeral: MQTT 3.1.x clean session, MQTT 5
    #   session expiry 0), or one whose store is RAM (MemoryStore) anyway, takes the message: its
    #   id goes in a RAM bitmap of the whole id space (InOverflow, bounded by construction). That
    #   is as durable as needed: the broker's session, the only one that could resend it, ends
    #   with the connection; or the store's ids go with a reboot too;
    # - a persistent session on a durable store defers it: neither delivered nor acknowledged,
    #   and once the ids taken are released the session reconnects (Session._ack_any: redeliver)
    #   so that the broker sends it again (each reconnect takes another cap's worth). Its id in
    #   RAM alone would not do: after a power cut, a resend whose PUBREC was lost would be
    #   delivered twice.
    # Under manual acknowledgement (rec false: the id is recorded by the app's ack(), once the message
    # is safe) it is deferred too: a bit set at arrival would answer the broker's resend of a message
    # the app never acknowledged, after a reconnect, without delivering it.
    # True: taken (recorded); False: not taken.
    if rec and (s.ephemeral or not getattr(s.store, "durable", False)):
        return _take(s, pid, now)
    s.stats_deferred += 1
    s.deferred += 1
    return False


def _take(s, pid, now):
    # An inbound id the store does not hold, kept in the bitmap (see over_cap: whose).
    o = s.inids
    if o is s.store:
        try:
            o = s.inids = InOverflow(s.store)
        except MemoryError:  # (8 KiB at once, on a board's heap)
            s.violation(0x93, "no memory for more than %d QoS 2 ids awaiting PUBREL" % s.in2, now)
    o.bits[pid >> 3] |= 1 << (pid & 7)
    s.in2 += 1
    return True


class InOverflow:
    """The inbound QoS 2 ids over what the store holds (see over_cap: which sessions keep them): a
    bitmap of all 65,536 ids (8 KiB, allocated once, at the first overflow of a connection, and
    dropped when the broker's session ends: tern.handshake), in front of the store's ids. The
    session looks ids up here (Session.inids) while it is in place."""

    def __init__(self, store):
        self.store = store
        self.bits = bytearray(8192)

    def in_has(self, pid):
        return self.bits[pid >> 3] >> (pid & 7) & 1 or self.store.in_has(pid)

    def in_release(self, pid):
        b = self.bits
        m = 1 << (pid & 7)
        if b[pid >> 3] & m:
            b[pid >> 3] &= 255 ^ m
        else:
            self.store.in_release(pid)


def unrecorded(s, pid, e, now):
    # Session._admit: the store could not record an inbound QoS 2 id (OSError e: ENOSPC, a failed
    # write; the store then holds no id, lib/tern/store.py). The message is deferred as one over
    # the cap is: not delivered, not acknowledged, and the session reconnects so that the broker
    # sends it again, once the ids taken are released (their PUBRELs free the room an inbound id
    # is given), or at once when none are: never a wait for an unrelated disconnect while the
    # broker's window fills. When the store's state is unknown (its id may have landed: then the
    # message is lost, never delivered twice, as after a power cut in that write), the error goes
    # on: the connection ends, and the driver keeps it as the reason.
    # An ephemeral session (see over_cap) keeps the id in RAM instead: deferred, its message would
    # be lost with the broker's session at the reconnect. (A MemoryStore never fails.)
    from .logrec import OutboxUnknown

    if isinstance(e, OutboxUnknown):
        raise e
    if s.ephemeral:
        return _take(s, pid, now)
    s.stats_deferred += 1
    s.deferred += 1
    if not s.in2:
        redeliver(s, now)
    return False


def redeliver(s, now):
    # The ids taken are all released and messages were deferred: reconnect
    # (DISCONNECT, normal: no will; the driver reconnects) so that the broker
    # sends them again.
    n = s.deferred
    s.disconnect(now)
    raise OSError("%d QoS 2 messages over Receive Maximum left for the broker to resend: reconnecting" % n)
