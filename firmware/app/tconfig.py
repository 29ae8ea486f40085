"""The telemetry app's configuration: `config.json` on the board's flash, checked key by key.

A bad value never stops the device: each problem is printed as one console line naming the key, what
was wrong and the safe default used instead, and the app runs on. Passwords are never echoed. See
firmware/app/config.example.json and docs/app.md for the keys.
"""

import gc
import json
from hal import say
from tern.client import BACKOFF_MIN_MS, BACKOFF_MAX_MS

FILE = "config.json"
_ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:"

# key, default, kind, low, high. Kinds: i int in [low, high], b bool, s str (None allowed when the
# default is None), h a host name or address (no port, no URL), t topic, q QoS (an int or a non-empty list of them, cycled per reading),
# l list of str or None.
SPEC = (
    ("host", None, "h", 0, 0),
    ("tls", False, "b", 0, 0),
    ("port", 1883, "i", 1, 65535),
    ("ca", None, "s", 0, 0),
    ("insecure", False, "b", 0, 0),
    ("user", None, "s", 0, 0),
    ("password", None, "s", 0, 0),
    ("client_id", None, "s", 0, 0),
    ("version", 5, "i", 3, 5),
    ("keepalive", 60, "i", 0, 65535),
    ("session_expiry", 604800, "i", 0, 4294967295),
    ("topic", "tern/{id}/telemetry", "t", 0, 0),
    ("status_topic", "tern/{id}/status", "t", 0, 0),
    ("cmd_topic", "tern/{id}/cmd", "t", 0, 0),
    ("qos", 1, "q", 0, 2),
    ("interval_ms", 5000, "i", 10, 86400000),
    ("readings", None, "l", 0, 0),
    ("count", 0, "i", 0, 2147483647),
    ("window", 8, "i", 1, 65535),
    ("max_pending", 256, "i", 2, 65535),
    ("rx_size", 4096, "i", 256, 1048576),
    ("tx_size", 512, "i", 64, 65535),
    ("backoff_min_ms", BACKOFF_MIN_MS, "i", 10, 3600000),  # (the library's defaults: tern.client)
    ("backoff_max_ms", BACKOFF_MAX_MS, "i", 10, 3600000),
    ("wifi_ssid", None, "s", 0, 0),
    ("wifi_password", None, "s", 0, 0),
    ("deep_sleep", False, "b", 0, 0),
)
_SECRET = ("password", "wifi_password")
# A tls or ca that was given but is unusable fails closed: TLS, verified against no CA (every handshake
# fails and says so), never a plain or unverified connection that would carry the credentials.
_CLOSED = {"tls": True, "ca": ""}


def _int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _check(v, d, kind, lo, hi):
    # None when v is acceptable, else what it should have been
    if kind == "i":
        return None if _int(v) and lo <= v <= hi else "an integer in %d..%d" % (lo, hi)
    if kind == "b":
        return None if isinstance(v, bool) else "true or false"
    if kind == "s":
        return None if isinstance(v, str) and v or (v is None and d is None) else "a non-empty string"
    if kind == "h":
        return _host(v)
    if kind == "t":
        ok = isinstance(v, str) and v and not ("#" in v or "+" in v or '"' in v or "\\" in v)
        return None if ok else "a topic name without wildcards or quotes"
    if kind == "q":
        ok = _int(v) and 0 <= v <= 2 or isinstance(v, list) and v and all(_int(x) and 0 <= x <= 2 for x in v)
        return None if ok else "0, 1, 2 or a non-empty list of them"
    ok = v is None or isinstance(v, list) and all(isinstance(x, str) for x in v)
    return None if ok else "a list of sensor names"


def _host(v):
    # A name or an address, as getaddrinfo takes it: "127.0.0.1:18831" failed only at the first connect,
    # as "[addrinfo error -2]", with nothing naming the key.
    w = "a host name or address"
    if v is None:
        return None
    if not isinstance(v, str) or not v:
        return w
    if "://" in v:
        return w + ", not a URL: the port goes in `port`, TLS in `tls`"
    if v.count(":") == 1 or v[0] == "[":
        return w + " without a port: put the port in `port`"
    for c in v:
        if not (c.isalpha() or c.isdigit() or c in "-._:"):
            return w + " (letters, digits, - . _ and the colons of an IPv6 address)"
    return None


def id_ok(cid):
    return len(cid) <= 64 and all(c in _ID_CHARS for c in cid)


def _bad(key, want, got, using):
    if key in _SECRET:
        say("config", key=key, err="must be " + want, using="(default)")
    else:
        say("config", key=key, err="must be " + want, got=got, using=using)


def load(prof=None, path=FILE):
    """The configuration as a dict with every key of SPEC; problems are reported, never raised.
    prof: the board profile. Its `defaults` (e.g. smaller buffers on a small heap) are used in place
    of SPEC's for the keys they name (config.json still overrides them); `readings` must name its
    `sensors`."""
    prof = prof or {}
    defaults = prof.get("defaults")
    sensors = [s["name"] for s in prof.get("sensors", ())]
    raw = {}
    try:
        with open(path) as f:
            raw = json.load(f)
        if not isinstance(raw, dict):
            say("config", err="%s must hold a JSON object, not %s" % (path, type(raw).__name__))
            raw = {}
    except OSError:
        say("config", err="%s not found: every key takes its default" % path)
    except ValueError as e:
        say("config", err="%s is not valid JSON (%s): every key takes its default" % (path, e))
    cfg = {}
    dflt = {}
    for key, d, kind, lo, hi in SPEC:
        if key == "port" and cfg["tls"]:
            d = 8883
        if defaults and key in defaults:
            d = defaults[key]
        if key in raw:
            v = raw[key]
            want = _check(v, d, kind, lo, hi)
            if want:
                d = _CLOSED.get(key, d)
                _bad(key, want, v, d)
                v = d
        else:
            v = d
        cfg[key] = v
        dflt[key] = d
    for key in raw:
        if key not in cfg:
            say("config", key=key, err="unknown key, ignored")
    # The client's buffers (allocated at boot: rx_size, tx_size, 3 bytes per max_pending) get at most a
    # quarter of the profile's heap (or of this heap, for a profile without heap_bytes), the largest
    # going back to its default first: more raised MemoryError in Session.__init__ at every boot.
    cap = prof.get("heap_bytes") or gc.mem_free() + gc.mem_alloc()
    cap //= 4
    per = {"rx_size": 1, "tx_size": 1, "max_pending": 3}
    while cap:
        big = {k: cfg[k] * per[k] for k in per if cfg[k] != dflt[k]}
        if not big or sum(cfg[k] * per[k] for k in per) <= cap:
            break
        k = ""
        for n in big:  # the largest (max's key= overloads are not in the boards' stubs)
            if not k or big[n] > big[k]:
                k = n
        _bad(k, "at most %d bytes with the other buffers (rx_size + tx_size + 3 x max_pending: a quarter "
             "of the heap)" % cap, cfg[k], dflt[k])
        cfg[k] = dflt[k]
    if cfg["backoff_max_ms"] < cfg["backoff_min_ms"]:
        _bad("backoff_max_ms", "at least backoff_min_ms", cfg["backoff_max_ms"], cfg["backoff_min_ms"])
        cfg["backoff_max_ms"] = cfg["backoff_min_ms"]
    cid = cfg["client_id"]
    if cid is not None and not id_ok(cid):
        _bad("client_id", "at most 64 of A-Z a-z 0-9 - _ . :", cid, None)
        cfg["client_id"] = None
    if cfg["host"] is None:
        say("config", key="host", err="%s: no broker to connect to, readings stay in the outbox"
            % ("missing" if raw.get("host") is None else "unusable"))
    if cfg["password"] and not cfg["user"] and cfg["version"] < 5:
        say("config", key="user", err="missing: MQTT 3.1 and 3.1.1 send a password only with a user name; password not sent")
        cfg["password"] = None
    for n in cfg["readings"] or ():
        if n not in sensors:
            say("config", key="readings", err="no such sensor on this board, ignored", got=n, sensors=sensors)
    if cfg["tls"] and cfg["ca"] is None:
        if cfg["insecure"]:
            say("config", key="insecure", err="true: TLS without a CA, the server is not verified")
        else:  # fail closed: TLS verified against no CA
            say("config", key="ca", err="missing: no TLS connection until it names the CA file (or insecure is true)")
            cfg["ca"] = ""
    elif cfg["ca"] == "" and cfg["tls"]:
        say("config", key="ca", err="unusable: no TLS connection until it names the CA file")
    if cfg["ca"] and not cfg["tls"]:
        say("config", key="ca", err="ignored: tls is false, the connection is not encrypted")
    return cfg


def topics(cfg, dev):
    """Resolve the {id} placeholder of the topic keys. A topic the client would refuse (not valid
    UTF-8 for MQTT, U+0000 included; longer than the transmit buffer takes) is reported and replaced
    by the default: the first publish or subscribe would raise, and the device would boot-loop."""
    from tern.topic import validate_name

    for k, d, kind, lo, hi in SPEC:
        if kind == "t":
            v = cfg[k].replace("{id}", dev)
            try:
                if len(validate_name(v)) > cfg["tx_size"] - 10 and k != "cmd_topic":  # published to
                    raise ValueError("is longer than tx_size - 10 bytes")
            except ValueError as e:
                say("config", key=k, err=str(e), using=d)
                v = d.replace("{id}", dev)
            cfg[k] = v
