"""Topic names, topic filters, shared subscriptions and matching (MQTT 3.1 to 5.0).

Validation is for user input and raises ValueError naming the topic and the
problem; it returns the UTF-8 bytes so callers encode once. Matching has one
algorithm, `matches_bytes`, which walks the filter and the topic byte by byte
so the receive path can dispatch on the topic in its buffer without decoding
or allocating anything.
"""

from .wire import const, MQTTError, check_utf8

_SLASH = const(0x2F)
_PLUS = const(0x2B)
_HASH = const(0x23)
_DOLLAR = const(0x24)
_SHARE = const(b"$share/")


def _bad(what, topic, problem):
    t = topic[:60]
    return ValueError("%s %r%s %s" % (what, t, "..." if len(t) < len(topic) else "", problem))


def _utf8(topic, what):
    """The topic as bytes, with the rules every name and filter shares checked."""
    if not isinstance(topic, (str, bytes, bytearray)):
        raise TypeError("%s must be str or bytes, not %s" % (what, type(topic).__name__))
    if not topic:
        raise _bad(what, topic, "is empty")
    try:
        b = topic.encode() if isinstance(topic, str) else bytes(topic)
        if len(b) > 65535:
            raise _bad(what, topic, "is longer than 65535 bytes (%d)" % len(b))
        check_utf8(b, 0, len(b))
    except (UnicodeError, MQTTError) as e:  # CPython: lone surrogates; "malformed packet: <problem>"
        d = e.args[-1].split(": ")[-1]  # "invalid UTF-8", the U+0000 MQTT forbids, or CPython's reason
        raise _bad(what, topic, "is not valid UTF-8" + ("" if d == "invalid UTF-8" else " (%s)" % d))
    return b


def validate_name(topic):
    """Check a topic name to publish to; return its UTF-8 bytes."""
    b = _utf8(topic, "topic name")
    if b"+" in b or b"#" in b:
        raise _bad("topic name", topic, "contains a wildcard ('+' or '#')")
    return b


def validate_filter(flt):
    """Check a subscription filter (shared or not); return its UTF-8 bytes.

    A shared one, `$share/{name}/{filter}`, needs a name without wildcards
    and a filter after it; in any filter each wildcard fills a whole level
    and '#' only the last one."""
    what = "topic filter"
    b = _utf8(flt, what)
    i = 0
    n = len(b)
    if b == b"$share" or b.startswith(_SHARE):
        what = "shared subscription"
        k = b.find(b"/", 7)
        if k < 0:
            k = n
        if k <= 7:
            raise _bad(what, flt, "has no share name")
        if b.find(b"+", 7, k) >= 0 or b.find(b"#", 7, k) >= 0:
            raise _bad(what, flt, "has a wildcard in its share name")
        i = k + 1
        if i >= n:
            raise _bad(what, flt, "has no topic filter after the share name")
    while i < n:
        c = b[i]
        if c == _PLUS or c == _HASH:
            if (i and b[i - 1] != _SLASH) or (i + 1 < n and b[i + 1] != _SLASH):
                raise _bad(what, flt, "has '%s' that is not a whole level" % chr(c))
            if c == _HASH and i + 1 < n:
                raise _bad(what, flt, "has '#' that is not the last level")
        i += 1
    return b


def parse_shared(flt):
    """(share_name, inner_filter) of a valid `$share/{name}/{filter}`, each the
    type of flt; None for a valid filter that is not shared."""
    b = validate_filter(flt)
    if not b.startswith(_SHARE):
        return None
    k = b.find(b"/", 7)
    if isinstance(flt, str):
        return str(b[7:k], "utf-8"), str(b[k + 1 :], "utf-8")
    return b[7:k], b[k + 1 :]


def matches(flt, topic):
    """Whether a topic name matches a filter; either may be str or bytes."""
    if isinstance(flt, str):
        flt = flt.encode()
    if isinstance(topic, str):
        topic = topic.encode()
    return matches_bytes(flt, topic, 0, len(topic))


def matches_bytes(flt, buf, start, end):
    """Whether the topic in buf[start:end] matches the bytes filter flt.

    Allocates nothing on MicroPython: one walk over both, byte by byte. The
    filter is assumed valid (see validate_filter); a shared filter matches by
    its inner filter.
    """
    if isinstance(flt, str):
        raise TypeError("matches_bytes needs the filter as bytes")
    n = len(flt)
    f = 0
    if flt.startswith(_SHARE):
        f = flt.find(b"/", 7) + 1
    # A filter starting with a wildcard does not see $-topics ($SYS/...).
    if start < end and buf[start] == _DOLLAR and f < n and (flt[f] == _PLUS or flt[f] == _HASH):
        return False
    t = start
    while f < n:
        c = flt[f]
        if c == _HASH:
            return True
        if c == _PLUS:
            while t < end and buf[t] != _SLASH:
                t += 1
        elif t < end and buf[t] == c:
            t += 1
        else:
            # 'a/#' also matches its parent 'a'.
            return t == end and f + 2 == n and c == _SLASH and flt[f + 1] == _HASH
        f += 1
    return t == end
