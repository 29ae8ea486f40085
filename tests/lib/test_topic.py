"""Topic names, filters, shared subscriptions and matching (lib/tern/topic.py),
on CPython and the MicroPython unix port alike."""

from check import MICROPYTHON, Rng, allocated_least, raises
from tern.topic import matches, matches_bytes, parse_shared, validate_filter, validate_name

# (filter, topic, matches?)
MATCH_TABLE = [
    # the spec's examples
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player2", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+", "sport", True),
    ("+", "sport/", False),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("+/tennis/#", "sport/tennis/player1", True),
    ("+/tennis/#", "sport/tennis", True),
    ("+/tennis/#", "sport/golf", False),
    # exact levels
    ("a/b", "a/b", True),
    ("a/b", "a/bc", False),
    ("a/bc", "a/b", False),
    ("a/b", "a", False),
    ("a", "a/b", False),
    ("a/b", "A/b", False),
    ("a/b", "a/b/", False),
    ("ünï/cødé", "ünï/cødé", True),
    ("ünï/+", "ünï/cødé", True),
    # empty levels are levels
    ("a/+/b", "a//b", True),
    ("a//b", "a//b", True),
    ("a//b", "a/b", False),
    ("a/+", "a/", True),
    ("+/a", "/a", True),
    ("/a", "a", False),
    ("a/+/+", "a//", True),
    ("a/+", "a//", False),
    ("+", "", True),
    ("/", "/", True),
    ("+/+", "/", True),
    ("+", "/", False),
    # '#'
    ("#", "a", True),
    ("#", "a/b/c", True),
    ("#", "/", True),
    ("a/#", "a", True),
    ("a/#", "a/", True),
    ("a/#", "a/b/c", True),
    ("a/#", "ab", False),
    ("a/#", "b/a", False),
    ("a/b/#", "a", False),
    ("+/#", "a", True),
    ("+/#", "a/b", True),
    ("a/+/#", "a", False),
    ("a/+/#", "a/b", True),
    ("a/+/c/#", "a/b/c", True),
    ("a/+/c/#", "a/b/d", False),
    # $-topics are not seen by filters that start with a wildcard
    ("#", "$SYS/x", False),
    ("#", "$SYS", False),
    ("+/x", "$SYS/x", False),
    ("+", "$SYS", False),
    ("+/#", "$SYS/x", False),
    ("$SYS/#", "$SYS/x", True),
    ("$SYS/#", "$SYS", True),
    ("$SYS/+", "$SYS/x", True),
    ("$SYS/x", "$SYS/x", True),
    ("a/#", "a/$x", True),
    ("+/+", "a/$x", True),
    ("#", "a$", True),
    # shared subscriptions match by their inner filter
    ("$share/g/sport/#", "sport/tennis", True),
    ("$share/g/sport/#", "sport", True),
    ("$share/g/+", "g", True),
    ("$share/g/+", "$share/g/x", False),
    ("$share/g/#", "$SYS/x", False),
    ("$share/g/$SYS/#", "$SYS/x", True),
    ("$share/grp/a/b", "a/b", True),
    ("$share/grp/a/b", "grp/a/b", False),
    ("$sharex/a", "$sharex/a", True),
]


def test_match_table():
    for flt, topic, want in MATCH_TABLE:
        assert matches(flt, topic) is want, (flt, topic, want)
        fb = flt.encode()
        tb = topic.encode()
        assert matches(fb, tb) is want, (fb, tb)
        assert matches_bytes(fb, tb, 0, len(tb)) is want, (fb, tb)


def test_matches_bytes_uses_only_its_window():
    buf = bytearray(b"a/b/c/d")
    mv = memoryview(buf)
    # the topic "b/c" sits in the middle of the buffer
    assert matches_bytes(b"b/c", buf, 2, 5)
    assert matches_bytes(b"b/c", mv, 2, 5)
    assert matches_bytes(b"b/+", buf, 2, 5)
    assert not matches_bytes(b"b/c/d", buf, 2, 5)
    assert not matches_bytes(b"b/+/+", buf, 2, 5)
    assert not matches_bytes(b"a/b/c", buf, 2, 5)
    assert matches_bytes(b"b/#", buf, 2, 3)  # topic "b"
    assert matches_bytes(b"+", buf, 2, 3)
    assert not matches_bytes(b"+", buf, 2, 4)  # topic "b/"
    assert matches_bytes(b"+", buf, 3, 3)  # the empty topic is one empty level
    # the $ rule looks at the window's first byte, not the buffer's
    sys_buf = b"x$SYS/y"
    assert not matches_bytes(b"#", sys_buf, 1, 7)
    assert matches_bytes(b"#", sys_buf, 0, 7)


def test_matches_bytes_wants_a_bytes_filter():
    e = raises(TypeError, matches_bytes, "a/+", b"a/b", 0, 3)
    assert "bytes" in str(e)


def _ref_match(flt, topic):
    """Level-by-level reference: split both on '/' and compare levels."""
    fl = flt.split("/")
    if flt.startswith("$share/"):
        fl = fl[2:]
    tl = topic.split("/")
    if topic.startswith("$") and fl[0] in ("+", "#"):
        return False
    for i, level in enumerate(fl):
        if level == "#":
            return True
        if i >= len(tl) or (level != "+" and level != tl[i]):
            return False
    return len(fl) == len(tl)


def test_random_filters_agree_with_level_reference():
    rng = Rng(1883)
    flevels = ("a", "b", "", "+", "ab", "$a")
    tlevels = ("a", "b", "", "ab", "$a", "ba")
    hits = 0
    for _ in range(3000):
        fl = [flevels[rng.below(len(flevels))] for _ in range(1 + rng.below(4))]
        if rng.below(3) == 0:
            fl.append("#")
        flt = "/".join(fl)
        if flt and rng.below(8) == 0:
            flt = "$share/g/" + flt
        tl = [tlevels[rng.below(len(tlevels))] for _ in range(1 + rng.below(5))]
        topic = "/".join(tl)
        if not flt or not topic:
            continue
        validate_filter(flt)
        validate_name(topic)
        want = _ref_match(flt, topic)
        hits += want
        assert matches(flt, topic) is want, (flt, topic, want)
    assert 100 < hits < 2900, hits  # the table exercises both outcomes


VALID_NAMES = ["a", "/", "//", "sport/tennis/player1", "$SYS/broker/load", "ünï/cødé", " ", "a b/c", "$share/g/x"]

# (name, words the error must contain)
INVALID_NAMES = [
    ("", "empty"),
    ("a/+", "wildcard"),
    ("+", "wildcard"),
    ("a/#", "wildcard"),
    ("sport#", "wildcard"),
    ("a\x00b", "U+0000"),
    (b"a\x00", "U+0000"),
    (b"\xff", "UTF-8"),
    (b"a/\xc3", "UTF-8"),  # truncated
    (b"\xc0\xaf", "UTF-8"),  # overlong '/'
    (b"\xed\xa0\x80", "UTF-8"),  # surrogate
]


def test_validate_name_accepts_and_returns_utf8():
    for name in VALID_NAMES:
        assert validate_name(name) == name.encode(), name
        assert validate_name(name.encode()) == name.encode(), name
    assert validate_name(bytearray(b"a/b")) == b"a/b"


def test_validate_name_rejects_with_reason():
    for name, why in INVALID_NAMES:
        e = raises(ValueError, validate_name, name)
        msg = str(e)
        assert why in msg, (name, msg)
        assert "topic name" in msg and repr(name) in msg, (name, msg)
    assert str(raises(ValueError, validate_name, "a/+")) == "topic name 'a/+' contains a wildcard ('+' or '#')"


def test_lone_surrogate_is_not_utf8():
    # CPython refuses to encode it; MicroPython encodes it as ED A0 80. Both reject it.
    e = raises(ValueError, validate_name, "a\ud800")
    assert "UTF-8" in str(e), str(e)


def test_wrong_type_is_a_type_error():
    for bad in (None, 5, ["a"]):
        e = raises(TypeError, validate_name, bad)
        assert "topic name" in str(e) and "str or bytes" in str(e)
        e = raises(TypeError, validate_filter, bad)
        assert "topic filter" in str(e)


def test_length_limit_counts_utf8_bytes():
    assert len(validate_name("a" * 65535)) == 65535
    assert len(validate_filter("a/" * 32766 + "+/#")) == 65535
    for long_one in ("a" * 65536, "é" * 32768, b"b" * 65536):
        e = raises(ValueError, validate_name, long_one)
        msg = str(e)
        assert "65535" in msg and "65536" in msg, msg
        assert len(msg) < 400, len(msg)  # the topic is cut short in the message
    assert "65535" in str(raises(ValueError, validate_filter, "a" * 65536))
    assert len(validate_name("é" * 32767 + "a")) == 65535


VALID_FILTERS = [
    "#",
    "+",
    "+/+",
    "/+",
    "+/",
    "/",
    "a//b",
    "sport/tennis/#",
    "sport/tennis/player1",
    "sport/+/player1",
    "+/tennis/#",
    "$SYS/#",
    "ünï/+/#",
    "$share/g/#",
    "$share/g/+/x",
    "$share/g//",
    "$share/gr$up.1/a/b",
    "$share/g/$share/h/x",
    "$sharex/y",
    "a/$share",
]

INVALID_FILTERS = [
    ("", "empty"),
    ("sport/tennis#", "'#' that is not a whole level"),
    ("#a", "'#' that is not a whole level"),
    ("##", "'#' that is not a whole level"),
    ("sport/tennis/#/ranking", "'#' that is not the last level"),
    ("#/", "'#' that is not the last level"),
    ("sport+", "'+' that is not a whole level"),
    ("+a", "'+' that is not a whole level"),
    ("a/+b/c", "'+' that is not a whole level"),
    ("a/b+/c", "'+' that is not a whole level"),
    ("++", "'+' that is not a whole level"),
    ("a\x00/#", "U+0000"),
    (b"a/\xfe/#", "UTF-8"),
]

INVALID_SHARED = [
    ("$share", "no share name"),
    ("$share/", "no share name"),
    ("$share//a", "no share name"),
    ("$share/g", "no topic filter"),
    ("$share/g/", "no topic filter"),
    ("$share/g+/a", "wildcard in its share name"),
    ("$share/+/a", "wildcard in its share name"),
    ("$share/#/a", "wildcard in its share name"),
    ("$share/#", "wildcard in its share name"),
    ("$share/g/a#", "'#' that is not a whole level"),
    ("$share/g/#/a", "'#' that is not the last level"),
    ("$share/g/a+", "'+' that is not a whole level"),
]


def test_validate_filter_accepts_and_returns_utf8():
    for flt in VALID_FILTERS:
        assert validate_filter(flt) == flt.encode(), flt
        assert validate_filter(flt.encode()) == flt.encode(), flt


def test_validate_filter_rejects_with_reason():
    for flt, why in INVALID_FILTERS:
        msg = str(raises(ValueError, validate_filter, flt))
        assert why in msg and "topic filter" in msg and repr(flt) in msg, (flt, msg)


def test_shared_subscription_rejects_with_reason():
    for flt, why in INVALID_SHARED:
        for f in (flt, flt.encode()):
            msg = str(raises(ValueError, validate_filter, f))
            assert why in msg and "shared subscription" in msg and repr(f) in msg, (f, msg)
            msg2 = str(raises(ValueError, parse_shared, f))
            assert msg2 == msg, (msg, msg2)


def test_parse_shared():
    assert parse_shared("$share/g/a/#") == ("g", "a/#")
    assert parse_shared(b"$share/g/a/#") == (b"g", b"a/#")
    assert parse_shared("$share/grüppe/+") == ("grüppe", "+")
    assert parse_shared("$share/g//") == ("g", "/")
    assert parse_shared("$share/g/$share/h/x") == ("g", "$share/h/x")
    assert parse_shared("$share/col.lectors/tern/+/telemetry") == ("col.lectors", "tern/+/telemetry")
    for plain in ("a/b", "#", "$sharex/y", "$SYS/#", "a/$share/g/x"):
        assert parse_shared(plain) is None, plain
    # a non-shared filter is validated too
    assert "'#' that is not the last level" in str(raises(ValueError, parse_shared, "a/#/b"))


def test_matches_bytes_allocates_nothing():
    short = bytearray(b"a/b/c/d/e")
    long = bytearray(b"a/b/c/" + b"x/" * 2497)  # 5000 bytes, '#' swallows the tail
    assert len(long) == 5000
    assert matches_bytes(b"a/+/c/#", short, 0, len(short))
    assert matches_bytes(b"a/+/c/#", long, 0, len(long))
    walk = bytearray(b"z" * 4998 + b"/q")  # '+' walks the whole first level
    assert matches_bytes(b"+/q", walk, 0, len(walk))
    sizes = []
    for flt, buf in (
        (b"a/+/c/#", short),
        (b"a/+/c/#", long),
        (b"+/q", walk),
        (b"$share/g/a/+/c/#", long),
        (b"#", bytearray(b"$SYS/x")),
        (b"a/+/c/d", long),
    ):
        n = len(buf)
        sizes.append(allocated_least(lambda: matches_bytes(flt, buf, 0, n)))
    if MICROPYTHON:
        assert sizes == [0] * len(sizes), sizes
    else:
        # tracemalloc peak: a few int objects at most, not sized by the topic
        assert max(sizes) < 400, sizes
        assert abs(sizes[2] - sizes[0]) < 300, sizes
