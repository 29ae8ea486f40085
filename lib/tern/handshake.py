"""Connecting and authenticating, loaded for them and released after (_release): the CONNECT a
session sends, the CONNACK that answers it (refusal, the checks it must pass, the
server's properties taken; the session then resends what waits), and enhanced authentication
(MQTT 5 AUTH, while connecting and for a re-authentication; auth() says how the hook is called). A connected client keeps none of
this code. Functions of the session `s`, through its interface for helper modules (Session's
docstring).
"""

from .wire import const
from . import pkt
from .pkt import Packet

_CONNECT = const(1)
_CONNACK = const(2)
_AUTH = const(15)
_V5 = const(5)
_PROTOCOL_ERROR = const(0x82)
_CONNECTING = const(1)  # the session's state, the events that move it (Session._NEXT) ...
_E_CONNECT = const(0)
_E_ACCEPT = const(1)
_E_REFUSE = const(2)
_EV_CONNACK = const(1)  # ... and those it tells (on_event)
_EV_AUTH = const(7)
_P_AUTH_METHOD = const(0x15)
_P_SESSION_EXPIRY = const(0x11)
_P_ASSIGNED_ID = const(0x12)
_P_SERVER_KEEPALIVE = const(0x13)
_P_RECEIVE_MAX = const(0x21)
_P_ALIAS_MAX = const(0x22)
_P_MAX_QOS = const(0x24)
_P_RETAIN_OK = const(0x25)
_P_WILDCARD_OK = const(0x28)
_P_SUB_ID_OK = const(0x29)
_P_SHARED_OK = const(0x2A)


def _clear_in(s):
    # The inbound QoS 2 ids of a broker session that is gone, cleared and
    # durable now, not at the next packet: the broker's new session exists already.
    s.store.in_clear()
    s.store.commit()
    s.stale = False
    s.in2 = 0
    s.inids = s.store  # (tern.fault.InOverflow's ids go with it)


def connect(s, now):
    # Session.connect_packet's CONNECT, and the session CONNECTING.
    if s.stale:
        # A clear a CONNACK could not make durable (ENOSPC) is made so
        # before the next CONNECT leaves, or that raises: the flag is RAM
        # only, and after a power cut a session present 1 would keep the
        # old session's ids against the new one's messages.
        _clear_in(s)
    s.go(_E_CONNECT)
    c, u, pw, wt, wp, wq, wr, wprops, ka = s.conn
    s.keepalive = ka
    s.send_packet(Packet(
        _CONNECT, version=s.version, clean=c, keepalive=ka, client_id=s.client_id,
        props=s.connect_props, username=u, password=pw, will_topic=wt, will_payload=wp, will_qos=wq,
        will_retain=wr, will_props=wprops), now)


def _release():
    # Forget this module once its packets are read, and tern.props with it
    # (the CONNACK's properties are read): code a connected client need not
    # keep (a .mpy on the filesystem is loaded onto the heap; the next
    # connect, or the first property block, loads it again). Safe while a
    # call of it is still under way (a handler that reconnects from
    # EV_CONNACK): a function keeps its module's globals.
    import sys
    import tern

    sys.modules.pop(__name__, None)
    sys.modules.pop("tern.props", None)
    try:
        del tern.handshake  # pyright: ignore[reportAttributeAccessIssue]  (set by the import that loaded this module)
    except (AttributeError, KeyError):  # (released already, by a call nested in this one; MicroPython says KeyError)
        pass
    try:
        del tern.props  # pyright: ignore[reportAttributeAccessIssue]
    except (AttributeError, KeyError):  # (not loaded: a CONNACK without properties; MicroPython says KeyError)
        pass


def read(s, pos, end, now):
    # A CONNACK (the session is CONNECTING: Session._reads lets no other
    # through) or an AUTH at rx[pos:end]; this module is released after.
    # A CONNACK that accepts the connection (what it allows: limit, messages
    # in flight; aliases, outbound topic aliases) has tern.replay replay the
    # send ring.
    try:
        p = _read(s, pos, end, now)
        if p:
            import tern.replay  # (it releases itself after)

            tern.replay.accepted(s, p, now)
    except OSError:
        # A store that failed (or a send) under the CONNACK's work: the connection ends before
        # anything more is built from a ring replayed half-way (feed_n pumps in its finally); the
        # driver reconnects.
        s.connection_lost()
        raise
    finally:
        _release()


def _read(s, pos, end, now):
    rx = s.rx
    if rx[pos] >> 4 == _CONNACK and end - pos == 4 and rx[pos + 3] == 1 and s.version == _V5:
        # An MQTT 3.1.1 broker refuses an MQTT 5 CONNECT with its own
        # CONNACK, code 0x01 (unacceptable protocol version, 3.1.1
        # section 3.1.2.2): not a valid MQTT 5 CONNACK, but what to tell
        # the application (ConnectError: the broker does not support MQTT 5).
        s.go(_E_REFUSE)
        s.emit(_EV_CONNACK, False, Packet(_CONNACK, reason=1))
        return
    p = pkt.decode(s.rxmv[pos:end], s.version, len(rx))
    if p.type == _AUTH:
        auth(s, p, now)
        return None
    return connack(s, p, now)


def connack(s, p, now):
    if p.reason:
        s.go(_E_REFUSE)
        s.emit(_EV_CONNACK, False, p)
        return None
    sp = p.session_present
    if sp and s.conn[0]:  # [MQTT-3.2.2-1] (3.1.1), [MQTT-3.2.2-2] and -4 (5.0)
        s.violation(_PROTOCOL_ERROR, "session present after a clean start", now)
    props = p.props or {}
    m = s.version == _V5 and s.connect_props and s.connect_props.get(_P_AUTH_METHOD)
    if m and props.get(_P_AUTH_METHOD) != m:  # [MQTT-4.12.0-5]
        s.violation(_PROTOCOL_ERROR, "CONNACK without the CONNECT's authentication method", now)
    s.go(_E_ACCEPT)
    s.session_present = sp
    s.server = props
    g = props.get
    s.max_qos = g(_P_MAX_QOS, 2)
    s.retain_ok = g(_P_RETAIN_OK, 1) == 1
    s.sid_ok = g(_P_SUB_ID_OK, 1) == 1
    s.wildcard_ok = g(_P_WILDCARD_OK, 1) == 1
    s.shared_ok = g(_P_SHARED_OK, 1) == 1
    s.client_id = g(_P_ASSIGNED_ID, s.client_id)
    s.keepalive = g(_P_SERVER_KEEPALIVE, s.keepalive)
    # Does the broker's session end with this connection (tern.fault.over_cap)? MQTT 5: the
    # session expiry in effect is 0 (the CONNACK's, else the CONNECT's), or it starts clean (the next CONNECT will too).
    x = props.get(_P_SESSION_EXPIRY, (s.connect_props or {}).get(_P_SESSION_EXPIRY, 0))
    s.ephemeral = (not x or s.conn[0]) if s.version == _V5 else s.conn[0]  # (a clean start is never resumed)
    if not sp:
        # The broker has no session for us: inbound QoS 2 ids are gone.
        s.stale = True  # until the clear is durable: after a failure (ENOSPC) it is retried before the next CONNECT
    if s.stale:
        _clear_in(s)
    r = g(_P_RECEIVE_MAX, 65535)
    c = g(_P_ALIAS_MAX, 0)
    p.limit = r if r < s.window else s.window
    p.aliases = c if c < s.outbound_aliases else s.outbound_aliases
    return p


def auth(s, p, now):
    # Enhanced authentication: a challenge (0x18) while connecting or
    # re-authenticating, or success (0) at the end of a re-authentication.
    # The hook (Session's auth=): auth(reason, props) -> props. Put the Authentication Method (and
    # any initial data) in connect_props; each AUTH the server sends (reason 0x18, continue) calls
    # the hook with its reason and properties, and what it returns goes back in an AUTH packet (the
    # method is added when missing). It is also called with reason 0 when a re-authentication
    # (`reauthenticate`) succeeds. A hook that raises ends the connection (DISCONNECT 0x80) and its
    # exception reaches the driver as MQTTError 0x80 naming it. A refusal arrives as a CONNACK
    # reason code (the driver raises ConnectError) or, during re-authentication, as a server
    # DISCONNECT.
    r = p.reason
    cp = s.connect_props
    m = cp and cp.get(_P_AUTH_METHOD)
    if not (s.auth and m and (s.state == _CONNECTING or s.reauthing)) or r == 0x19 or (
            r == 0 and not s.reauthing) or not p.props or p.props.get(_P_AUTH_METHOD) != m:
        # (the method is that of the CONNECT, in every AUTH: 3.15.2.2.2)
        s.violation(_PROTOCOL_ERROR, "unexpected %s (reason 0x%02X)" % ("AUTH", r), now)
    try:
        out = s.auth(r, p.props)
    except Exception as e:
        s.violation(0x80, "authentication hook failed: %r" % e, now)
    if r:
        out = dict(out) if out else {}
        if _P_AUTH_METHOD not in out:
            out[_P_AUTH_METHOD] = m
        s.send_packet(Packet(_AUTH, reason=0x18, props=out), now)
    else:
        s.reauthing = False
        s.emit(_EV_AUTH, 0, p)


def reauthenticate(s, now, props):
    # Session.reauthenticate (its docstring says what it does; it checks the
    # connection); released after, as after read().
    try:
        _reauthenticate(s, now, props)
    finally:
        _release()


def _reauthenticate(s, now, props):
    cp = s.connect_props
    m = cp and cp.get(_P_AUTH_METHOD)
    if not m or not s.auth:
        raise ValueError("re-authentication needs auth= and an Authentication Method (0x15) in connect_props")
    out = dict(props) if props else {}
    out[_P_AUTH_METHOD] = m
    s.reauthing = True
    s.send_packet(Packet(_AUTH, reason=0x19, props=out), now)
