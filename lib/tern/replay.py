"""The outbox's cold half, loaded when it runs and released after it (as tern.handshake is): what
the send ring does at a CONNACK (resend in order, give back what the new server refuses, subscribe
again), after the store read its medium again (follow), and the SUBSCRIBE and UNSUBSCRIBE packets
it queues. A connected client that only publishes keeps none of this code. Functions of the
session `s`: the ring's other half, they use its fields (Session's docstring names them). A
boot's rebuild of the ring from the store is here too.

The ring's lifecycle. An entry of the send ring (a slot of Session._ring, the packet id, and of
Session._rflags, its flags) is in one of these states. Its kind (a PUBLISH at QoS 1 or 2: _QOS2; a
SUBSCRIBE or UNSUBSCRIBE: _CTRL) is set when it is pushed and changes only where a row says so.
tests/lib/test_ring_lifecycle.py reads these two tables and fails when the code writes a state or
makes a transition they do not list.

  state     kind  flags                        what it means
  free      any   -                            no entry (packet id 0)
  fresh     any   -                            stored, never sent
  fresh5    pub   _OLD                         MQTT 5, stored before this connection: sent without its Topic Alias
  waiting   any   _EVER                        sent on an earlier connection: goes again, with DUP
  waiting5  pub   _EVER _OLD                   the same, MQTT 5 (tern.v5.unaliased)
  sent      any   _SENT _EVER                  sent on this connection: its acknowledgement is awaited
  release   q2    _MARKED _EVER                PUBREC seen: its PUBREL is next to go
  released  q2    _MARKED _SENT _EVER          PUBREL sent on this connection: PUBCOMP awaited
  given     ctl   _GONE _SENT _CTRL            refused at a CONNACK, parked (nothing sends it) until the application is told
  told      ctl   _GONE _TOLD _SENT _CTRL      told: released next

  Transitions, one per line: from > to: what causes it [the function that writes it]
  free > fresh: publish() stores a QoS 1/2 message, subscribe()/unsubscribe() (or a resubscription)
    a SUBSCRIBE/UNSUBSCRIBE [publish _ctrl]
  free > sent: Session.pub1 (Client.publish at QoS 1) stores and sends it in one [pub1]
  fresh > sent: publish(): the only message waiting, sent at once [publish]
  fresh fresh5 waiting waiting5 > sent: the pump sends it (room in the window: an ack, a CONNACK) [_send_ring]
  release > released: the pump sends its PUBREL [_send_ring]
  sent > released: PUBREC accepting a QoS 2 message [_ack_any]
  sent > free: PUBACK; PUBREC refusing; SUBACK, UNSUBACK; an ack of the wrong type (given back 0x82,
    tern.fault.wrong_ack) [_on_ack _ack_any]
  released > free: PUBCOMP (or a PUBREC refusing) [_ack_any]
  free > waiting release: a boot finds its record in the store [boot]
  sent > waiting waiting5: CONNACK: resent with DUP (MQTT 5: without its Topic Alias) [_accepted]
  fresh > fresh fresh5: CONNACK [_accepted]
  waiting > waiting waiting5: CONNACK [_accepted]
  fresh5 > fresh5: CONNACK [_accepted]
  waiting5 > waiting5: CONNACK [_accepted]
  released release > release: CONNACK with our session: the PUBREL goes again [_accepted]
  released release > waiting waiting5: CONNACK without our session: published again [_accepted]
  fresh fresh5 waiting waiting5 sent release released > given: CONNACK: the new server's limits
    refuse it, or a SUBSCRIBE/UNSUBSCRIBE is superseded (its kind becomes ctl) [_accepted]
  given > told: the application told (EV_PUBLISHED, EV_SUBACK, EV_UNSUBACK) [_accepted]
  told > free: released once told, or at the next CONNACK [_accepted]
  given > waiting waiting5 release given: a CONNACK after one that failed before telling: looked
    at again from its record (sent before or not, it goes with DUP) [_accepted]
  fresh waiting sent given > free: CONNACK without our session: a superseded SUBSCRIBE released
    [_accepted]
  * > free: the store read its medium again (its epoch moved on) and holds no record of it; or
    the ring, rebuilt from its first slot, overwrites an entry before it is pushed again [_follow]
  free fresh fresh5 > fresh: the same, every entry re-derived from its record [_follow]
  free waiting waiting5 sent release released > waiting release: the same (a record the ring did
    not hold was sent before) [_follow]
  free given > given: the same [_follow]
  free told > told: the same [_follow]
"""

from .wire import const
from . import pkt
from .pkt import Packet

_PUBLISH = const(3)
_SUBSCRIBE = const(8)
_SUBACK = const(9)
_UNSUBSCRIBE = const(10)
_V5 = const(5)
_PROTOCOL_ERROR = const(0x82)
_CONNECTED = const(2)  # the session's state
_EV_CONNACK = const(1)  # the events it tells (on_event)
_EV_PUBLISHED = const(2)
_EV_SUBACK = const(3)
_EV_UNSUBACK = const(4)
_EV_RESTORED = const(6)  # a = messages resent after a reconnect, b = the broker lost the session (no driver reads it)
_P_SUB_ID = const(0x0B)
_P_USER = const(0x26)
_P_MAX_PACKET = const(0x27)
_SENT = const(1)  # the ring's flags (Session's)
_QOS2 = const(2)
_MARKED = const(4)
_CTRL = const(8)
_EVER = const(16)
_OLD = const(32)
_GONE = const(64)
_TOLD = const(128)


def _release():
    # Forget this module once its work is done (see tern.handshake._release, the same for the
    # same reasons: a call of it still under way keeps its globals).
    import sys
    import tern

    sys.modules.pop(__name__, None)
    try:
        del tern.replay  # pyright: ignore[reportAttributeAccessIssue]
    except (AttributeError, KeyError):  # (released already, by a call nested in this one; MicroPython says KeyError)
        pass


def boot(s, max_pending):
    # Session.__init__: the send ring rebuilt from what the store recovered (after a reboot). It
    # holds max_pending entries, or what the store holds when that is more (max_pending lowered
    # between boots): refusing to start would refuse at every boot, with the messages never sent.
    try:
        from array import array

        st = s.store
        st.open()
        s._last_pid = st.last_pid()
        pids = st.pending()
        cap = max_pending if max_pending > len(pids) else len(pids)
        st.reserve(cap)
        s._ring = array("H", bytes(2 * cap))  # zeroed, without a list of cap items
        s._rflags = bytearray(cap)
        s._cap = cap  # (len() is a global lookup and a call: too dear for every message on MicroPython)
        for pid in pids:
            s._push(pid, _stored_flags(s, pid, None))
        if st.seen != st.epoch:  # (the ring says what the store holds: see follow)
            st.seen = st.epoch
        s.stats_recovered = s._n
    finally:
        _release()


def stored_flags(s, pid, b):
    try:
        return _stored_flags(s, pid, b)
    finally:
        _release()


def _stored_flags(s, pid, b):
    # A stored packet's ring flags, from its record (at a boot, for one parked, given, and in
    # _follow, which reads its first byte into b, not the transmit buffer: a packet may wait there)
    st = s.store
    f = _EVER
    if st.kind(pid) != _PUBLISH:
        return f | _CTRL
    if b is None:
        b = s.tx
    st.read(pid, 0, b)
    if (b[0] >> 1) & 3 == 2:
        f |= _QOS2
    if st.marked(pid):
        f |= _MARKED
    return f


def accepted(s, p, now):
    # A CONNACK accepted the connection (tern.handshake took its properties: p): the ring replayed,
    # then the application told.
    try:
        _accepted(s, p, now)
    finally:
        _release()


def follow(s):
    # Session._settle: the store read its medium again after a failure.
    try:
        _follow(s)
    finally:
        _release()


def send_late(s, now):
    # What waits for room or for a connection (Session._late): SUBSCRIBE, UNSUBSCRIBE.
    try:
        _send_late(s, now)
    finally:
        _release()


def subscribe(s, flt, qos, now, handler, no_local, retain_as_published, retain_handling, sub_id, user_props):
    try:
        return _subscribe(s, flt, qos, now, handler, no_local, retain_as_published, retain_handling, sub_id,
                          user_props)
    finally:
        _release()


def unsubscribe(s, flt, now, user_props):
    try:
        return _unsubscribe(s, flt, now, user_props)
    finally:
        _release()


def answered(s, t, pid, reason, now):
    # Session._ack_any: a SUBACK or UNSUBACK (t) for the SUBSCRIBE/UNSUBSCRIBE pid, with its list
    # of reason codes. One filter a packet, so one reason code ([MQTT-3.8.4-6], [MQTT-3.11.3-2];
    # UNSUBACK before MQTT 5: none), and never more than the QoS asked for.
    try:
        q = -1
        for e in s.subs:
            if e.pid == pid:
                q = e.opts & 3
                sub = e
        if len(reason) != (1 if t == _SUBACK or s.version == _V5 else 0) or (
                t == _SUBACK and q >= 0 and reason[0] < 0x80 and reason[0] > q):
            s.violation(_PROTOCOL_ERROR, "%s %d does not answer its request: %r" % (
                "SUBACK" if t == _SUBACK else "UNSUBACK", pid, reason), now)
        if q >= 0:
            sub.pid = 0  # answered (before send_late may hand the identifier to another)
    finally:
        _release()


def _accepted(s, p, now):
    # What the CONNACK allows on this connection (messages in flight, outbound topic aliases;
    # aliases both ways start afresh), the send ring replayed, then the application told.
    s._limit = p.limit
    s._oalias_cap = p.aliases
    s.in_aliases = s._oalias = None
    sp = s.session_present
    # Without a session on the broker (clean start, expiry, or it forgot; tern.handshake cleared
    # the inbound QoS 2 ids): accepted messages still go out; a QoS 2 message whose PUBREC was seen
    # is published again, since the broker no longer holds it (at least once rather than lost);
    # the broker's copies of our subscriptions are gone.
    lost = not sp and s._n > 0
    # Replay the ring in its original order (and without a session on the broker, forget the
    # PUBRECs seen) before the application hears of the connection: what it publishes from
    # EV_CONNACK then goes after the resends, once.
    s._inflight = 0
    s._unsent = s._uctl = 0
    # A packet stored before this CONNACK said what the server takes (offline, or for another
    # server) that breaks its Maximum Packet Size, Maximum QoS or Retain Available would only get
    # the connection closed, again after every reconnect, with everything behind it waiting: a
    # PUBLISH is given back refused (EV_PUBLISHED 0x95, 0x9B, 0x9A), as a PUBACK refusing it would,
    # a SUBSCRIBE or UNSUBSCRIBE over the maximum [MQTT-3.1.2-24] as its SUBACK or UNSUBACK would
    # (EV_SUBACK / EV_UNSUBACK [0x95]; the subscription stays registered, as after a refusing
    # SUBACK). Its Topic Alias Maximum and Receive Maximum cannot refuse one: an MQTT 5 PUBLISH
    # from before this connection goes without its Topic Alias (_OLD), and the window is capped by
    # the Receive Maximum (_limit).
    mx = s.server.get(_P_MAX_PACKET, 0)
    chk = mx or s.max_qos < 2 or not s.retain_ok
    old = _OLD if s.version == _V5 else 0
    refused = []  # pid << 12 | packet type << 8 | reason
    st = s.store
    ring = s._ring
    flags = s._rflags
    cap = s._cap
    # Without a session on the broker every registered subscription goes again (below): a
    # SUBSCRIBE still pending for one of them is resent as it is, any other stored SUBSCRIBE or
    # UNSUBSCRIBE (of a filter replaced or dropped since, or from before a reboot) is superseded
    # and released, so none piles up when a broker closes the connection instead of answering.
    keep = [e.pid for e in s.subs if e.pid] if not sp else None
    i = s._head
    for _ in range(s._n):
        pid = ring[i]
        if pid:
            f = flags[i] & ~_SENT
            if f & _GONE:  # given back at an earlier CONNACK that failed (ENOSPC) before its release
                if f & _TOLD:
                    s._free(i)
                    i = (i + 1) % cap
                    continue
                f = _stored_flags(s, pid, None)  # not told: looked at again
            if f & _MARKED and not sp:
                st.unmark(pid)
                f &= ~_MARKED
            r = 0
            k = _PUBLISH
            if f & _CTRL:
                k = st.kind(pid)
                if keep is not None and pid not in keep:
                    if k != _UNSUBSCRIBE:
                        s._free(i)  # (nobody waits for a superseded SUBSCRIBE)
                        i = (i + 1) % cap
                        continue
                    r = 0x11  # "no subscription existed", to whoever waits
                elif mx and st.size(pid) > mx:
                    r = 0x95
            elif chk and not f & _MARKED:
                st.read(pid, 0, s.tx)
                b = s.tx[0]
                r = 0x95 if mx and st.size(pid) > mx else 0x9B if (b >> 1) & 3 > s.max_qos else (
                    0x9A if b & 1 and not s.retain_ok else 0)
            if r:
                # Released only once the application was told (below): a power cut in between
                # tells it again after the reboot, rather than never. Parked meanwhile as a control
                # packet in flight: nothing sends it.
                flags[i] = _SENT | _CTRL | _GONE
                refused.append(pid << 12 | k << 8 | r)
            else:
                if not f & (_MARKED | _CTRL):
                    f |= old
                flags[i] = f
                s._unsent += 1
                if f & _CTRL:
                    s._uctl += 1
        i = (i + 1) % cap
    resent = s._unsent
    # Subscriptions go (again) to a broker without our session, and, to one that kept it, those
    # made or dropped while offline: one SUBSCRIBE each, as each may carry its own identifier.
    if not sp:
        for e in s.subs:
            e.late = not e.pid
        s._gone = []
    for r in refused:
        k = r >> 8 & 15
        pid = r >> 12
        if k == _PUBLISH:
            s.emit(_EV_PUBLISHED, pid, r & 255)
        else:
            for e in s.subs:
                if e.pid == pid:
                    e.pid = 0  # answered: not resent, subscribed again after a session is lost
            s.emit(_EV_SUBACK if k == _SUBSCRIBE else _EV_UNSUBACK, pid, [r & 255])
        i = s._find(pid)
        if i >= 0:
            flags[i] |= _TOLD
    for r in refused:  # (all told first: a release that fails, ENOSPC, leaves only told ones parked)
        i = s._find(r >> 12)
        if i >= 0:
            s._free(i)
    _send_late(s, now)
    s._pump(now)
    if s.state == _CONNECTED:  # not when a resend found the connection dead
        s.emit(_EV_CONNACK, sp, p)
    if resent or lost:
        s.stats_resent += resent
        s.emit(_EV_RESTORED, resent, lost)


def _follow(s):
    # The ring re-derived from what the store holds after a storage failure (flags from the
    # records: QoS 2, PUBREC seen; sent on some connection as the ring said, else a record it did
    # not hold, which was); a SUBSCRIBE no longer stored is sent again. When anything differs on a
    # live connection, its packets were built from what the store no longer says: the connection
    # ends (OSError; the drivers reconnect, and the CONNACK replays the ring).
    st = s.store
    st.seen = st.epoch
    old = {}
    order = []
    i = s._head
    for _ in range(s._n):
        p = s._ring[i]
        if p:
            old[p] = s._rflags[i]
            order.append(p)
        i = (i + 1) % s._cap
    pids = st.pending()
    same = pids == order
    b = bytearray(1)
    for p in pids:
        if not same:
            break
        f = _stored_flags(s, p, b)
        o = old[p]
        same = o & _GONE or (f ^ o) & (_QOS2 | _MARKED | _CTRL) == 0
    if same:
        return
    if len(pids) > s._cap:
        from array import array

        s._cap = len(pids)
        s._ring = array("H", bytes(2 * s._cap))
        s._rflags = bytearray(s._cap)
    s._head = s._n = s._unsent = s._uctl = 0
    for p in pids:
        f = _stored_flags(s, p, b)
        o = old.get(p)
        if o is not None:
            f = o if o & _GONE else f & ~_EVER | o & _EVER
        s._push(p, f)
    for e in s.subs:
        if e.pid and e.pid not in pids:
            e.pid = 0
            e.late = s._late = True
    if s.state == _CONNECTED:
        s.connection_lost()
        raise OSError("the store read its medium again after a failure: reconnecting, to resend what it holds")


def _filter(flt):
    # A filter checked, as str (given as bytes too).
    from .topic import validate_filter

    b = validate_filter(flt)
    return flt if isinstance(flt, str) else b.decode()


def _subscribe(s, flt, qos, now, handler, no_local, retain_as_published, retain_handling, sub_id, user_props):
    # Session.subscribe (its docstring says what it does).
    from .topic import parse_shared

    flt = _filter(flt)
    auto = False
    if qos < 0 or qos > 2:
        raise ValueError("QoS must be 0, 1 or 2")
    if retain_handling not in (0, 1, 2):
        raise ValueError("retain handling must be 0, 1 or 2")
    shared = parse_shared(flt)
    match = (shared[1] if shared else flt).encode()
    if no_local or sub_id or not (s.shared_ok and s.wildcard_ok):
        from .v5 import check_sub

        check_sub(s, flt, shared, match, no_local, sub_id)
    if sub_id is None and s.version == _V5 and s.sid_ok:
        # Every subscription gets an identifier (see Session._on_publish): the next one no current
        # subscription holds.
        sub_id = s._next_sid
        while any(e.sid == sub_id for e in s.subs):
            sub_id += 1
        s._next_sid = sub_id + 1
        auto = True
    opts = qos
    if s.version == _V5:  # the other options exist only in MQTT 5
        opts |= (4 if no_local else 0) | (8 if retain_as_published else 0) | retain_handling << 4
    _fits(s, _SUBSCRIBE, (flt, opts), user_props, sub_id)
    _unsubscribe(s, flt, now, 0)  # a filter subscribed again replaces its entry
    # A subscription is a record of its fields (a Packet used as one: no class of its own to load):
    # filter (str), opts as sent, match (the filter topics are matched against: bytes, the inner
    # filter of a $share), handler, sid, and user_props, sent again with every resubscription.
    # pid: its SUBSCRIBE while pending (0 otherwise); late: not sent yet.
    e = Packet(_SUBSCRIBE, filter=flt, opts=opts, match=match, handler=handler, sid=sub_id,
               auto=auto, user_props=user_props, late=True)
    s.subs.append(e)
    _send_late(s, now)
    return e.pid


def _unsubscribe(s, flt, now, user_props):
    # Session.unsubscribe (user_props=0: only forget; subscribe() replacing an entry).
    flt = _filter(flt)
    if user_props != 0:
        _fits(s, _UNSUBSCRIBE, flt, user_props, None)
    for e in s.subs:
        if e.filter == flt:
            s.subs.remove(e)
            break
    if flt in s._gone:
        s._gone.remove(flt)
    if user_props == 0:
        return 0
    pid = 0
    if s.state == _CONNECTED and s._n < s._cap:
        pid = _ctrl(s, _UNSUBSCRIBE, flt, user_props, None, now)
        if pid < 0:  # (not after _fits above: the same server's maximum)
            return 0
    if not pid:
        s._gone.append(flt)
        s._late = True
    return pid


def _send_late(s, now):
    # Send the subscriptions and unsubscriptions that wait (made offline, or all of them for a
    # broker without our session) while the ring has room: they take ring slots as messages do,
    # and a full ring (an outbox full of messages at reconnect) keeps them waiting for the next
    # acknowledgement instead of overwriting a live entry.
    s._late = True
    if s.state != _CONNECTED:
        return
    cap = s._cap
    for e in s.subs:
        if e.late:
            if s._n >= cap:
                return
            p = _ctrl(s, _SUBSCRIBE, (e.filter, e.opts), e.user_props, e.sid, now)
            if not p:
                return
            e.pid = p if p > 0 else 0
            e.late = False
    g = s._gone
    while g and s._n < cap:
        if not _ctrl(s, _UNSUBSCRIBE, g[0], None, None, now):
            return
        g.pop(0)
    if not g:
        s._late = False


def _ctrl_packet(s, t, topic, user_props, sid, pid):
    props = {}
    if sid and s.version == _V5 and s.sid_ok:
        props[_P_SUB_ID] = sid
    if user_props:
        props[_P_USER] = list(user_props)
    return pkt.encode(Packet(t, pid=pid, topics=[topic], props=props or None), s.version)


def _fits(s, t, topic, user_props, sid):
    # ValueError when the server's Maximum Packet Size (MQTT 5 CONNACK) is below this
    # SUBSCRIBE/UNSUBSCRIBE [MQTT-3.1.2-24]; checked before anything is registered. (One registered
    # offline, before a CONNACK said the maximum, is given back at that CONNACK: see _ctrl.)
    mx = s.server.get(_P_MAX_PACKET)
    if mx:
        n = len(_ctrl_packet(s, t, topic, user_props, sid, 1))
        if n > mx:
            raise ValueError("%s of %d bytes is over the server's maximum packet size %d"
                             % ("SUBSCRIBE" if t == _SUBSCRIBE else "UNSUBSCRIBE", n, mx))


def _ctrl(s, t, topic, user_props, sid, now):
    # SUBSCRIBE or UNSUBSCRIBE of one filter: stored, queued in the ring like a QoS 1 message
    # (outside the window), resent until acknowledged. The caller made sure the ring has room; a
    # store without room (ENOSPC) makes it wait like a full ring: 0 is returned, nothing is queued;
    # -1: refused (over the server's Maximum Packet Size), EV_SUBACK / EV_UNSUBACK told so.
    pid = s._alloc_pid()
    b = _ctrl_packet(s, t, topic, user_props, sid, pid)
    mx = s.server.get(_P_MAX_PACKET)
    if mx and len(b) > mx:
        # Made offline, before this CONNACK said the maximum: sent, it would only get the
        # connection closed, at every reconnect [MQTT-3.1.2-24]. Given back as a refusing
        # SUBACK/UNSUBACK would be, not stored.
        s.emit(_EV_SUBACK if t == _SUBSCRIBE else _EV_UNSUBACK, pid, [0x95])
        return -1
    try:
        s.store.append(t, pid, b, b"")
    except OSError as e:
        if e.args[0] != 28:  # ENOSPC
            raise
        return 0
    s._push(pid, _CTRL)
    s._pump(now)
    return pid
