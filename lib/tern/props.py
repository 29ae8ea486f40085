"""MQTT 5 properties: their wire types, which packets may carry them, and the
rules about repeats and values.

Properties travel as a dict {identifier: value}. User Property (0x26) is always
a list of (name, value) pairs; Subscription Identifier (0x0B) is a list in
PUBLISH (the server may send several) and an int in SUBSCRIBE. The table is
kept as 4 bytes per property so it costs little RAM on a board.

The names of the identifiers and wire types (props.USER_PROPERTY, TYPE_U16,
WILL...) live in tern/propids.py and are served from here on first use (the
module __getattr__ below): the device path only needs the numbers.
"""

from .wire import const, fail, put_varint, varint_size, utf8, get_varint, check_utf8

_PUBLISH = const(3)
_MALFORMED = const(0x81)
_PROTOCOL_ERROR = const(0x82)
_SUB_ID = const(0x0B)  # subscription identifier

# Flags on a table row's type byte (the wire type is its low 3 bits): the value
# rules whose breach the specification makes a Protocol Error.
_BOOL = const(0x10)  # must be 0 or 1
_NONZERO = const(0x20)  # must not be 0

# id, type | flags, where-mask (high byte, low byte); "where" bit 0 = will
# properties (WILL, pseudo packet 0), bit n = packet type n. Generated from
# the table in section 2.2.2.2 of the MQTT 5.0 specification;
# tests/lib/test_props.py restates that table and the value rules independently
# and checks this one against them.
_TABLE = (
    b"\x01\x11\x00\x09"  # payload format indicator (byte, 0/1): will, PUBLISH
    b"\x02\x03\x00\x09"  # message expiry interval
    b"\x03\x05\x00\x09"  # content type
    b"\x08\x05\x00\x09"  # response topic
    b"\x09\x06\x00\x09"  # correlation data
    b"\x0b\x24\x01\x08"  # subscription identifier (varint, not 0): PUBLISH, SUBSCRIBE
    b"\x11\x03\x40\x06"  # session expiry: CONNECT, CONNACK, DISCONNECT
    b"\x12\x05\x00\x04"  # assigned client identifier: CONNACK
    b"\x13\x02\x00\x04"  # server keep alive: CONNACK
    b"\x15\x05\x80\x06"  # authentication method: CONNECT, CONNACK, AUTH
    b"\x16\x06\x80\x06"  # authentication data
    b"\x17\x11\x00\x02"  # request problem information (0/1): CONNECT
    b"\x18\x03\x00\x01"  # will delay interval: will
    b"\x19\x11\x00\x02"  # request response information (0/1): CONNECT
    b"\x1a\x05\x00\x04"  # response information: CONNACK
    b"\x1c\x05\x40\x04"  # server reference: CONNACK, DISCONNECT
    b"\x1f\x05\xca\xf4"  # reason string: CONNACK, PUBACK..PUBCOMP, SUBACK, UNSUBACK, DISCONNECT, AUTH
    b"\x21\x22\x00\x06"  # receive maximum (not 0): CONNECT, CONNACK
    b"\x22\x02\x00\x06"  # topic alias maximum
    b"\x23\x22\x00\x08"  # topic alias (not 0): PUBLISH
    b"\x24\x11\x00\x04"  # maximum qos (0/1): CONNACK
    b"\x25\x11\x00\x04"  # retain available (0/1): CONNACK
    b"\x26\x07\xcf\xff"  # user property: everywhere but PINGREQ/PINGRESP
    b"\x27\x23\x00\x06"  # maximum packet size (not 0): CONNECT, CONNACK
    b"\x28\x11\x00\x04"  # wildcard subscription available (0/1): CONNACK
    b"\x29\x11\x00\x04"  # subscription identifier available
    b"\x2a\x11\x00\x04"  # shared subscription available
)

_LIMITS = (0, 0xFF, 0xFFFF, 0xFFFFFFFF, 268435455)  # by wire type byte..variable byte integer


def __getattr__(name):
    # The identifier and type names (see the module docstring).
    from . import propids

    return getattr(propids, name)


def _entry(pid):
    t = _TABLE
    i = 0
    n = len(t)
    while i < n:
        if t[i] == pid:
            return i
        i += 4
    return -1


def prop_type(pid):
    """The wire type of a property identifier, 0 when it is not one."""
    i = _entry(pid)
    return _TABLE[i + 1] & 7 if i >= 0 else 0


def allowed(pid, ptype):
    """May property pid appear in packet type ptype (WILL for will properties)?"""
    i = _entry(pid)
    return i >= 0 and (_TABLE[i + 2] << 8 | _TABLE[i + 3]) >> ptype & 1 == 1


def _bad(pid, what, code):
    # One error for every property rule: code 0 = the caller asked to send it
    # (ValueError: their mistake), else the peer sent it (MQTTError with code).
    msg = "property 0x%02X %s" % (pid, what)
    if not code:
        raise ValueError(msg)
    fail(msg, code)


def _find(pid, ptype, code):
    # pid's row in _TABLE; unknown or not allowed in ptype is an error (see _bad).
    i = _entry(pid)
    if not allowed(pid, ptype):
        _bad(pid, "is not allowed in packet type %d" % ptype if i >= 0 else "is unknown", code)
    return i


def _walk(buf, p, end, ptype, out, m, ids):
    # Check the properties in buf[p:end] for packet type ptype. With a dict
    # out, store their values in it (decode); without, pick out what a PUBLISH
    # needs into m and ids (scan_publish), allocating nothing.
    seen = 0  # one bit per table row; 27 rows, so a small int even on 32-bit boards
    while p < end:
        pid = get_varint(buf, p, end)
        if pid < 0:
            break
        i = _find(pid, ptype, _MALFORMED)
        p += 1  # every known identifier is below 0x80: one byte
        t = _TABLE[i + 1]
        k = t & 7
        q = p  # moves to the end of the value
        v = 0
        if k == 4:  # variable byte integer
            v = get_varint(buf, p, end)
            if v < 0:
                break
            q += varint_size(v)
        elif k < 4:  # one, two or four bytes
            q += 1 << k >> 1
        else:  # UTF-8 string, binary data, or a pair of strings
            j = 2 if k == 7 else 1
            while j:
                if q + 2 > end:
                    break
                s = q + 2
                q = s + (buf[q] << 8 | buf[q + 1])
                if q > end:
                    break
                if k != 6:
                    check_utf8(buf, s, q)
                j -= 1
            if j:
                break
        if q > end:
            break
        if k < 3 or k == 3 and out is not None:
            # Not a four-byte value on the PUBLISH path: it can be a long int
            # (an allocation) on a 32-bit board, and only the expiry is one.
            while p < q:
                v = v << 8 | buf[p]
                p += 1
        if t & _BOOL and v > 1 or t & _NONZERO and not v:
            _bad(pid, "must not be 0" if t & _NONZERO else "must be 0 or 1", _PROTOCOL_ERROR)
        many = k == 7 or pid == _SUB_ID and ptype == _PUBLISH
        j = 1 << (i >> 2)
        if seen & j and not many:
            _bad(pid, "may appear only once", _PROTOCOL_ERROR)
        seen |= j
        if out is None:
            if pid == 0x01:
                m.pfi = v
            elif pid == 0x23:
                m.alias = v
            elif pid == _SUB_ID:
                j = m.n_sub_ids
                if j < len(ids):
                    ids[j] = v
                m.n_sub_ids = j + 1
        else:
            if k > 4:
                j = p + 2 + (buf[p] << 8 | buf[p + 1])  # end of the first string
                v = bytes(buf[p + 2 : j])
                if k != 6:
                    v = str(v, "utf-8")
                if k == 7:
                    v = (v, str(bytes(buf[j + 2 : q]), "utf-8"))
            if many:
                out.setdefault(pid, []).append(v)
            else:
                out[pid] = v
        p = q
    if p < end:  # stopped early: a property runs past the block
        fail("truncated")


def decode(r, ptype):
    """Read a property block (length then properties) from Reader r.

    Returns a dict, or None when the block is empty (the common case costs
    nothing).
    """
    n = get_varint(r.buf, r.pos, r.end)
    if n < 0:
        fail("truncated")
    r.pos += varint_size(n)
    p = r.need(n)  # a property may not run past its block
    r.pos = p + n
    if not n:
        return None
    out = {}
    _walk(r.buf, p, p + n, ptype, out, None, None)
    return out


def encode(props, ptype):
    """The property block (length prefix included) as bytes.

    What the caller asks to send is checked: known, allowed in ptype, the right
    type, in range, and not a value the peer would have to treat as a Protocol
    Error. ValueError, not MQTTError: it is the caller's mistake, not the
    network's. Written in identifier order: MicroPython's dict order is not
    insertion order, and the same packet must give the same bytes on both runtimes.
    """
    out = bytearray()
    for pid in sorted(props or ()):
        i = _find(pid, ptype, 0)
        t = _TABLE[i + 1]
        k = t & 7
        v = props[pid]
        if not isinstance(v, list):
            v = [v]
        elif not (k == 7 or pid == _SUB_ID and (ptype == _PUBLISH or len(v) == 1)):
            _bad(pid, "may appear only once", 0)
        for x in v:
            out.append(pid)  # every known identifier is below 0x80: one byte
            if k <= 4:
                # (MicroPython stores 300 into a bytearray as 44 without
                # complaint, so the range is checked here, not left to a buffer.)
                if not isinstance(x, int) or x < 0 or x > _LIMITS[k]:
                    _bad(pid, "needs an int in 0..%d, not %r" % (_LIMITS[k], x), 0)
                if t & _BOOL and x > 1 or t & _NONZERO and not x:
                    _bad(pid, "must not be 0" if t & _NONZERO else "must be 0 or 1", 0)
                if k == 4:
                    b = bytearray(4)
                    out += b[: put_varint(b, 0, x)]
                else:
                    out += x.to_bytes(1 << k >> 1, "big")
                continue
            d = (x,)
            if k == 7:  # a pair; anything else is refused just below, by its None
                d = x if isinstance(x, (tuple, list)) and len(x) == 2 else (None,)
            for y in d:
                if not isinstance(y, (bytes, bytearray, memoryview) if k == 6 else str):
                    _bad(pid, "needs %s, not %r" % (("a str", "bytes", "a (str, str) pair")[k - 5], x), 0)
                y = bytes(y) if k == 6 else utf8(y)
                if len(y) > 65535:
                    _bad(pid, "is longer than 65535 bytes", 0)
                out += len(y).to_bytes(2, "big")
                out += y
    b = bytearray(4)
    return bytes(b[: put_varint(b, 0, len(out))]) + out


def of_message(m):
    """Message.properties: the properties of the PUBLISH in m (checked by
    scan_publish when it arrived; not empty) as a dict."""
    out = {}
    _walk(m.buf, m.props_start, m.props_end, _PUBLISH, out, None, None)
    return out


def scan_publish(m, buf, sub_ids):
    """Check a PUBLISH's properties in place and pick out what the session
    needs: m.alias (0 = none), m.n_sub_ids with the identifiers stored into the
    preallocated sequence sub_ids (extra ones beyond its length are counted
    but not stored), m.pfi (payload format indicator). Allocates nothing."""
    m.alias = m.n_sub_ids = m.pfi = 0
    _walk(buf, m.props_start, m.props_end, _PUBLISH, None, m, sub_ids)
    if m.topic_start == m.topic_end and not m.alias:
        fail("empty topic without a topic alias", _PROTOCOL_ERROR)


# What a client must not send, beyond what encode() checks for any sender:
# only a server puts a subscription identifier in a PUBLISH [MQTT-3.3.4-6], a
# response topic is a topic name, payload format 1 promises UTF-8 (3.3.2.3.2),
# a topic alias is 1..the server's Topic Alias Maximum [MQTT-3.3.2-9] and
# means something only on the connection that set it.
def client_publish(props, payload, qos, topic, alias_max):
    if _SUB_ID in props:
        _bad(_SUB_ID, "is put in a PUBLISH by the server only", 0)
    rt = props.get(0x08)
    if rt is not None:
        from .topic import validate_name

        validate_name(rt)
    if props.get(0x01) == 1:
        try:
            check_utf8(payload, 0, len(payload))
        except Exception:
            _bad(0x01, "is 1 but the payload is not valid UTF-8", 0)
    a = props.get(0x23)
    if a is not None:
        if not (isinstance(a, int) and 0 < a <= alias_max):
            _bad(0x23, "%r: the server takes 1..%d (CONNACK Topic Alias Maximum)" % (a, alias_max), 0)
        if qos and not topic:
            raise ValueError("a QoS 1/2 message may go again on another connection: give its topic, not an alias alone")


# DISCONNECT reason codes a client may send ([MQTT-3.14.2-1], 3.14.2.1)
_CLIENT_DISCONNECT = b"\x00\x04\x80\x81\x82\x83\x90\x93\x94\x95\x96\x97\x98\x99"


def client_disconnect(reason, props, connect_props):
    if reason not in _CLIENT_DISCONNECT:
        raise ValueError("DISCONNECT reason code 0x%02X is not one a client sends" % reason)
    if props and props.get(0x11) and not (connect_props and connect_props.get(0x11)):
        # 3.14.2.2.2: a session that was to end with the connection cannot be kept at DISCONNECT
        _bad(0x11, "cannot be set at DISCONNECT after a CONNECT with session expiry 0", 0)
