"""The numbers copied between modules agree (issue 19 item 4).

For RAM, lib/tern repeats small `const()` tables instead of importing them: a
const() name with a leading underscore is folded into the bytecode and costs
no module global, an imported one costs a dict entry and a lookup. So
packet types, protocol versions, reason codes, session states and events,
and MQTT 5 property ids are written in several modules. This test reads the
sources (on both runtimes: MicroPython folds `_NAME = const(...)` away, so only
the text has them) and checks that every name defined in more than one module,
with or without its leading underscore, has one value everywhere, and that the
property ids some modules keep under short names equal tern/propids.py's.
"""

import os

import tern.wire

# Reading a module's text takes a string of its size (session.py: 68 KB) out of a heap the earlier
# reads fragmented: 1 MB (the default) failed to find one.
MP_HEAPSIZE = "2m"

LIB = tern.wire.__file__.rpartition("/")[0]

# Short names modules use for MQTT 5 property ids -> tern/propids.py's name.
PROPERTY_ALIASES = {
    "P_SUB_ID": "SUBSCRIPTION_IDENTIFIER",
    "SUB_ID": "SUBSCRIPTION_IDENTIFIER",
    "P_SESSION_EXPIRY": "SESSION_EXPIRY_INTERVAL",
    "P_ASSIGNED_ID": "ASSIGNED_CLIENT_IDENTIFIER",
    "P_SERVER_KEEPALIVE": "SERVER_KEEP_ALIVE",
    "P_AUTH_METHOD": "AUTHENTICATION_METHOD",
    "P_RECEIVE_MAX": "RECEIVE_MAXIMUM",
    "P_ALIAS_MAX": "TOPIC_ALIAS_MAXIMUM",
    "P_ALIAS": "TOPIC_ALIAS",
    "P_MAX_QOS": "MAXIMUM_QOS",
    "P_RETAIN_OK": "RETAIN_AVAILABLE",
    "P_USER": "USER_PROPERTY",
    "P_MAX_PACKET": "MAXIMUM_PACKET_SIZE",
    "P_WILDCARD_OK": "WILDCARD_SUBSCRIPTION_AVAILABLE",
    "P_SUB_ID_OK": "SUBSCRIPTION_IDENTIFIER_AVAILABLE",
    "P_SHARED_OK": "SHARED_SUBSCRIPTION_AVAILABLE",
}


def _is_name(s):
    return s and s.lstrip("_") and all(c.isupper() or c.isdigit() or c == "_" for c in s) and not s[0].isdigit()


def module_constants(text):
    """{NAME: value} of a module's top-level `NAME = const(literal)` lines
    (and, for a module of plain names such as propids, `NAME = literal`)."""
    out = {}
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line or line[0] in " \t#" or " = " not in line:
            continue
        name, _, rhs = line.partition(" = ")
        if not _is_name(name):
            continue
        rhs = rhs.split("  #")[0].strip()
        if rhs.startswith("const("):
            while rhs.count("(") > rhs.count(")") and i < len(lines):  # a value over several lines
                rhs += lines[i].split("  #")[0].strip()
                i += 1
            rhs = rhs[6:-1]
        try:
            v = eval(rhs)
        except Exception:
            continue  # not a literal (a tuple of names, a call): not a copied constant
        if isinstance(v, (int, bytes)):
            out[name] = v
    return out


def all_constants():
    """{module file name: {NAME: value}} for every module of lib/tern."""
    out = {}
    for f in sorted(os.listdir(LIB)):
        if f.endswith(".py"):
            with open(LIB + "/" + f) as fh:
                out[f] = module_constants(fh.read())
    return out


def test_the_reader_finds_the_tables():
    # The parser must see what it checks: wire's packet types, session's
    # events, handshake's property ids, client's folded copies, pkt's reason-code bytes.
    c = all_constants()
    assert c["wire.py"]["PINGRESP"] == 13 and c["wire.py"]["VARINT_MAX"] == 268435455
    assert c["events.py"]["EV_LOST"] == 8 and c["session.py"]["_EV_LOST"] == 8 and c["handshake.py"]["_P_SHARED_OK"] == 0x2A
    assert c["client.py"]["_EV_LOST"] == 8 and c["client.py"]["_WOULD_BLOCK"] == -1
    assert c["pkt.py"]["_AUTH_RC"] == b"\x00\x18\x19" and len(c["pkt.py"]["_DISCONNECT_RC"]) > 20
    assert c["propids.py"]["SHARED_SUBSCRIPTION_AVAILABLE"] == 0x2A
    assert module_constants("_A = const(\n    0x10\n)\nB = const(b'x')  # c\n  _C = const(1)\n") == {"_A": 16, "B": b"x"}


def test_constants_copied_between_modules_agree():
    seen = {}  # name without its leading underscore -> (value, module)
    bad = []
    for mod, consts in all_constants().items():
        for name, v in consts.items():
            key = name.lstrip("_")
            key = PROPERTY_ALIASES.get(key, key)
            if key in seen and seen[key][0] != v:
                bad.append("%s: %s = %r, %s has %r" % (key, mod, v, seen[key][1], seen[key][0]))
            seen.setdefault(key, (v, mod))
    assert not bad, "\n".join(bad)


def test_every_short_property_id_name_is_checked():
    # A new _P_ name in a module must be added to PROPERTY_ALIASES, or the
    # test above would compare it with nothing.
    missing = []
    for mod, consts in all_constants().items():
        for name in consts:
            key = name.lstrip("_")
            if key.startswith("P_") and key not in PROPERTY_ALIASES:
                missing.append(mod + ": " + name)
    assert not missing, missing
    ids = all_constants()["propids.py"]
    for short, full in PROPERTY_ALIASES.items():
        assert full in ids, full
