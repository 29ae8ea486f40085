"""`make interop`: Tern against brokers other than Mosquitto, each feature beside a baseline peer.

Over 600 lines because the matrix is one table of features run against every broker and peer, and
each feature's Tern side and peer side are read best beside each other; the strict broker's cells
(its log read per cell) joined them.
Brokers (each started here on 127.0.0.1 only, in a scratch folder): Mosquitto (Debian), RabbitMQ with
its MQTT plugin and ejabberd's mod_mqtt (Debian), aedes (npm, under build/interop/node_modules) and
amqtt (PyPI, in .venv-interop). For every broker and protocol version each feature runs with Tern's
library on CPython, and with a peer that is not Tern: paho-mqtt for the library features, MQTT.js
for the round trip, mosquitto_pub/mosquitto_sub for the `tern pub`/`tern sub` round trip. A feature
that fails for Tern and for the peer is the broker's limit, not Tern's; one that fails for Tern alone is
a Tern failure, unless Tern closed the connection over a protocol violation the peer let pass.
MicroPython runs the library's round trip as a feature of its own.

`python tools/interop/matrix.py --write docs/interop.md` (what `make interop` runs; `--only NAME` for one
broker). Importing this module needs nothing beyond the main venv: brokers, node and amqtt are looked
for when run() starts them. It is not part of `make test`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from ternlab.brokers.mosquitto import free_port
from brokers import BROKERS  # tools/interop/brokers.py: this script's folder is first on sys.path, BUILD, HERE, ROOT, _Erlang

T = 5.0  # seconds: the bound on every wait of a feature


# ----------------------------------------------------------------------------- clients


def _uid(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:8])


class Tern:
    """Tern's blocking client, recording what reaches each handler."""

    peer = "Tern"

    def __init__(self, port, v, user, cid=None, clean=True, will=None):
        from tern.client import Client

        kw = dict(version=v, connect_timeout=T, reconnect=False, clean=clean, username=user,
                  password=b"x" if user else None)
        if will:
            kw.update(will_topic=will[0], will_payload=will[1], will_qos=1)
        if not clean and v == 5:
            kw["session_expiry"] = 300
        self.c = Client(cid or _uid("tern"), "127.0.0.1", port, **kw)
        self.got = []
        self.c.on_message = self._on("D")

    def _on(self, name):
        return lambda m: self.got.append((name, m.topic, bytes(m.payload), m.qos, bool(m.retain), list(
            m.sub_ids[: m.n_sub_ids])))

    def connect(self):
        self.c.connect()

    def subscribe(self, flt, qos, name=None, sub_id=None):
        kw = {"sub_id": sub_id} if sub_id else {}
        r = self.c.subscribe(flt, qos, handler=self._on(name) if name else None, timeout=T, **kw)
        if r and r[0] >= 0x80:
            raise RuntimeError("SUBACK refused %s: 0x%02X" % (flt, r[0]))
        return r

    def publish(self, topic, payload, qos, retain=False):
        pid = self.c.publish(topic, payload, qos=qos, retain=retain, timeout=T)
        if qos:
            self.c.wait_published(pid, T)
            if self.c.last_error is not None and not self.c.connected:
                raise self.c.last_error

    def pump(self):
        self.c.loop(10)

    def drop(self):
        self.c.close()

    def close(self):
        try:
            self.c.disconnect(linger_ms=300)
        except Exception:
            self.c.close()


class Paho:
    """paho-mqtt, the baseline peer for the library features."""

    peer = "paho-mqtt"

    def __init__(self, port, v, user, cid=None, clean=True, will=None):
        import paho.mqtt.client as mqtt

        self.m = mqtt
        self.v = v
        proto = {3: mqtt.MQTTv31, 4: mqtt.MQTTv311, 5: mqtt.MQTTv5}[v]
        kw = {} if v == 5 else {"clean_session": clean}
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid or _uid("paho"), protocol=proto, **kw)
        if user:
            self.c.username_pw_set(user, "x")
        if will:
            self.c.will_set(will[0], will[1], 1)
        self.clean = clean
        self.port = port
        self.got = []
        self.subs = {}  # sub id -> name (MQTT 5), else filter -> name
        self.acks = {}
        self.ready = threading.Event()
        self.rc = None
        self.c.on_connect = self._conn
        self.c.on_message = self._msg
        self.c.on_subscribe = lambda c, u, mid, codes, p: self.acks.__setitem__(mid, codes)

    def _conn(self, c, u, flags, rc, props):
        self.rc = rc
        self.ready.set()

    def _msg(self, c, u, m):
        ids = list(getattr(m.properties, "SubscriptionIdentifier", []) or []) if self.v == 5 else []
        self.got.append(("D", m.topic, m.payload, m.qos, bool(m.retain), ids))

    def connect(self):
        kw = {}
        if self.v == 5:
            from paho.mqtt.properties import Properties
            from paho.mqtt.packettypes import PacketTypes

            p = Properties(PacketTypes.CONNECT)
            if not self.clean:
                p.SessionExpiryInterval = 300
            kw = {"clean_start": self.clean, "properties": p}
        self.c.connect("127.0.0.1", self.port, **kw)
        self.c.loop_start()
        if not self.ready.wait(T):
            raise OSError("no CONNACK")
        if getattr(self.rc, "is_failure", self.rc != 0):
            raise OSError("refused: %s" % self.rc)

    def subscribe(self, flt, qos, name=None, sub_id=None):
        kw = {}
        if sub_id and self.v == 5:
            from paho.mqtt.properties import Properties
            from paho.mqtt.packettypes import PacketTypes

            p = Properties(PacketTypes.SUBSCRIBE)
            p.SubscriptionIdentifier = sub_id
            kw["properties"] = p
        _, mid = self.c.subscribe(flt, qos, **kw)
        _wait(lambda: mid in self.acks, "SUBACK")
        codes = self.acks[mid]
        if codes and getattr(codes[0], "is_failure", False):
            raise RuntimeError("SUBACK refused %s: %s" % (flt, codes[0]))

    def publish(self, topic, payload, qos, retain=False):
        info = self.c.publish(topic, payload, qos, retain)
        info.wait_for_publish(T)
        if not info.is_published():
            raise OSError("no acknowledgement for QoS %d within %g s" % (qos, T))

    def pump(self):
        time.sleep(0.01)

    def drop(self):
        self.c.loop_stop()
        self.c.socket().close() if self.c.socket() else None

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()


def _wait(cond, what, t=T, pump=()):
    end = time.monotonic() + t
    while not cond():
        if time.monotonic() > end:
            raise OSError("timed out waiting for " + what)
        for p in pump:
            p.pump()
        if not pump:
            time.sleep(0.01)


# ----------------------------------------------------------------------------- features


def f_connect(kind, port, v, user):
    a = kind(port, v, user)
    a.connect()
    a.close()
    return "connected"


def f_fallback(port, v, user):
    """Client(version=(5, 4)): MQTT 5, or 3.1.1 when the broker turns MQTT 5 down."""
    from tern.client import Client

    c = Client(_uid("tern"), "127.0.0.1", port, version=(5, 4), connect_timeout=T, reconnect=False, username=user,
               password=b"x" if user else None)
    c.connect()
    c.disconnect(linger_ms=300)
    return "connected as MQTT %s" % _vname(c.session.version)


def f_roundtrip(kind, port, v, user):
    """Subscribe at QoS 2, publish QoS 0, 1 and 2: each arrives once at its own QoS."""
    base = _uid("ix/rt")
    a = kind(port, v, user)
    a.connect()
    try:
        a.subscribe(base + "/#", 2)
        for q in (0, 1, 2):
            a.publish("%s/%d" % (base, q), b"q%d" % q, q)
        _wait(lambda: len(a.got) >= 3, "3 messages", pump=[a])
        time.sleep(0.3)
        a.pump()
        got = sorted((m[2], m[3]) for m in a.got)
        if got != [(b"q0", 0), (b"q1", 1), (b"q2", 2)]:
            raise AssertionError("received (payload, QoS) %s" % got)
        return "QoS 0/1/2 each once at its QoS"
    finally:
        a.close()


def f_retained(kind, port, v, user):
    t = _uid("ix/ret")
    a = kind(port, v, user)
    a.connect()
    a.publish(t, b"kept", 1, retain=True)
    a.close()
    b = kind(port, v, user)
    b.connect()
    try:
        b.subscribe(t, 1)
        _wait(lambda: b.got, "the retained message", pump=[b])
        m = b.got[0]
        if (m[2], m[4]) != (b"kept", True):
            raise AssertionError("got %r" % (m[:5],))
        return "retained message, retain flag set"
    finally:
        b.publish(t, b"", 1, retain=True)
        b.close()


def f_will(kind, port, v, user):
    t = _uid("ix/will")
    w = kind(port, v, user)
    w.connect()
    try:
        w.subscribe(t, 1)
        d = kind(port, v, user, will=(t, b"gone"))
        d.connect()
        d.drop()  # no DISCONNECT: the broker publishes the will
        _wait(lambda: w.got, "the will", pump=[w])
        return "will published on a dropped connection"
    finally:
        w.close()


def f_session(kind, port, v, user):
    """A persistent session: a QoS 1 message published while the subscriber is away reaches it."""
    t = _uid("ix/sess")
    cid = _uid("sess")
    s = kind(port, v, user, cid=cid, clean=False)
    s.connect()
    s.subscribe(t, 1)
    s.close()
    p = kind(port, v, user)
    p.connect()
    p.publish(t, b"queued", 1)
    p.close()
    s = kind(port, v, user, cid=cid, clean=False)
    s.connect()
    try:
        _wait(lambda: s.got, "the queued message", pump=[s])
        return "queued QoS 1 message delivered on resume"
    finally:
        s.close()


def f_shared(kind, port, v, user):
    t = _uid("ix/sh")
    subs = [kind(port, v, user) for _ in range(2)]
    for s in subs:
        s.connect()
        s.subscribe("$share/g/%s/#" % t, 1)
    p = kind(port, v, user)
    p.connect()
    try:
        for i in range(10):
            p.publish("%s/%d" % (t, i), b"%d" % i, 1)
        _wait(lambda: sum(len(s.got) for s in subs) >= 10, "10 messages", pump=subs)
        time.sleep(0.3)
        for s in subs:
            s.pump()
        got = sorted(m[2] for s in subs for m in s.got)
        if got != sorted(b"%d" % i for i in range(10)):
            raise AssertionError("the group received %d messages: %s" % (len(got), got))
        return "each message once across the group (%d + %d)" % tuple(len(s.got) for s in subs)
    finally:
        p.close()
        for s in subs:
            s.close()


def f_sub_ids(kind, port, v, user):
    """Overlapping filters with identifiers: Tern calls each handler once; the peer must at least see
    both identifiers."""
    t = _uid("ix/sid")
    a = kind(port, v, user)
    a.connect()
    try:
        a.subscribe(t + "/#", 1, "X", sub_id=1)
        a.subscribe(t + "/b", 1, "Y", sub_id=2)
        a.publish(t + "/b", b"m", 1)
        _wait(lambda: a.got, "the message", pump=[a])
        time.sleep(0.5)
        a.pump()
        copies = len([m for m in a.got if m[0] in ("X", "D")]) if kind is Paho else None
        ids = sorted(i for m in a.got for i in m[5])
        if kind is Paho:
            if sorted(set(ids)) != [1, 2]:
                raise AssertionError("identifiers received: %s" % ids)
            return "%d cop%s, identifiers %s" % (copies, "y" if copies == 1 else "ies", ids)
        names = sorted(m[0] for m in a.got)
        if names != ["X", "Y"]:
            raise AssertionError("handlers called: %s (identifiers %s)" % (names, ids))
        return "each handler once (%d cop%s)" % (len(set(map(tuple, (m[5] for m in a.got)))),
                                                 "y" if len(a.got) == 1 else "ies")
    finally:
        a.close()


def _no_will(port, v, user, stop):
    """stop(base) has clients with a will on base/<n> connect and disconnect cleanly: on DISCONNECT the
    broker must discard the will (MQTT 3.1.1 and 5.0 section 3.14.4). A paho-mqtt client watches base/#."""
    base = _uid("ix/nowill")
    w = Paho(port, v, user)
    w.connect()
    try:
        w.subscribe(base + "/#", 1)
        detail = stop(base)
        time.sleep(1.0)  # a will goes out when its connection ends
        if w.got:
            raise AssertionError("will published after a clean disconnect: %s" % sorted(m[1] for m in w.got))
        return detail
    finally:
        w.close()


def _will_kw(v, user, topic):
    return dict(version=v, username=user, password=b"x" if user else None, reconnect=False, will_topic=topic,
                will_payload=b"gone", will_qos=1)


def _stop_tern(base, port, v, user):
    import asyncio

    from tern import aio
    from tern.client import Client

    for i in range(3):
        c = Client(_uid("tw"), "127.0.0.1", port, connect_timeout=T, **_will_kw(v, user, "%s/%d" % (base, i)))
        c.connect()
        c.disconnect()

    async def one(i):
        c = aio.Client(_uid("tw"), "127.0.0.1", port, connect_timeout=T, **_will_kw(v, user, "%s/%d" % (base, i)))
        await c.connect()
        await c.disconnect()

    for i in range(3, 6):
        asyncio.run(one(i))
    return "no will after 3 blocking + 3 asyncio clean disconnects"


def _stop_paho(base, port, v, user):
    for i in range(6):
        c = Paho(port, v, user, will=("%s/%d" % (base, i), b"gone"))
        c.connect()
        c.close()
    return "no will after 6 clean disconnects"


def _stop_micropython(base, port, v, user):
    return _run_micropython("mp_will.py", port, v, user, base)


def _stop_cli(base, port, v, user, tern_cli):
    vv = {3: "31", 4: "311", 5: "5"}[v]
    pub = [str(Path(sys.executable).with_name("tern")), "pub"] if tern_cli else ["mosquitto_pub"]
    auth = ["-u", user, "-P", "x"] if user else []
    for i in range(3):
        r = subprocess.run(pub + ["-h", "127.0.0.1", "-p", str(port), "-V", vv, "-q", "1", "-t", base + "-msg",
                                  "-m", "m", "--will-topic", "%s/%d" % (base, i), "--will-payload", "gone",
                                  "--will-qos", "1", "-i", _uid("pw")] + auth, capture_output=True, text=True,
                           timeout=20)
        if r.returncode:
            raise AssertionError("pub exit %d: %s" % (r.returncode, r.stderr.strip()[-200:]))
    return "no will after 3 runs"


def _node_roundtrip(port, v, user):
    shutil.copy(HERE / "mqttjs_roundtrip.mjs", BUILD / "mqttjs_roundtrip.mjs")
    r = subprocess.run(["node", "mqttjs_roundtrip.mjs", str(port), str(v), user or "", _uid("ix/js")], cwd=BUILD,
                       capture_output=True, text=True, timeout=30)
    out = (r.stdout.strip().splitlines() or [""])[-1]
    if r.returncode or not out.startswith("ok"):
        raise AssertionError((out or r.stderr.strip()[-300:]))
    return out[3:] or "ok"


def _micropython_roundtrip(port, v, user):
    return _run_micropython("mp_roundtrip.py", port, v, user, _uid("ix/mp"))


def _run_micropython(script, port, v, user, topic):
    exe = Path(sys.executable).with_name("micropython")
    env = dict(os.environ, MICROPYPATH=".frozen:" + str(ROOT / "lib"))  # .frozen: asyncio
    r = subprocess.run([str(exe), str(HERE / script), str(port), str(v), user or "", topic],
                       env=env, capture_output=True, text=True, timeout=60)
    out = (r.stdout.strip().splitlines() or [""])[-1]
    if not out.startswith("ok"):
        raise AssertionError(out or r.stderr.strip()[-300:])
    return out[3:]


def _cli_roundtrip(port, v, user, tern_cli):
    """A QoS 1 message from the publisher tool to the subscriber tool (tern, or mosquitto's)."""
    t = _uid("ix/cli")
    vv = {3: "31", 4: "311", 5: "5"}[v]
    auth = ["-u", user, "-P", "x"] if user else []
    if tern_cli:
        sub = [str(Path(sys.executable).with_name("tern")), "sub"]
        pub = [str(Path(sys.executable).with_name("tern")), "pub"]
    else:
        sub, pub = ["mosquitto_sub"], ["mosquitto_pub"]
    common = ["-h", "127.0.0.1", "-p", str(port), "-V", vv, "-q", "1"] + auth
    s = subprocess.Popen(sub + common + ["-t", t, "-C", "1", "-W", "10", "-i", _uid("s")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)  # subscribed by then (no handshake to wait on from outside)
    p = subprocess.run(pub + common + ["-t", t, "-m", "cli-msg", "-i", _uid("p")], capture_output=True, text=True,
                       timeout=20)
    try:
        out, err = s.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        s.kill()
        out, err = s.communicate()
    if p.returncode:
        raise AssertionError("pub exit %d: %s" % (p.returncode, p.stderr.strip()[-200:]))
    if out.strip() != "cli-msg":
        raise AssertionError("sub exit %s: %r %s" % (s.returncode, out.strip(), err.strip()[-200:]))
    return "QoS 1 pub -> sub"


FEATURES = (
    # (name, versions it applies to, Tern's run, the peer's run, the peer's name)
    ("connect", (3, 4, 5), lambda p, v, u: f_connect(Tern, p, v, u), lambda p, v, u: f_connect(Paho, p, v, u),
     "paho-mqtt"),
    ("version=(5, 4) fallback", (5,), f_fallback, lambda p, v, u: f_connect(Paho, p, 4, u), "paho-mqtt 3.1.1"),
    ("QoS 0/1/2 round trip", (3, 4, 5), lambda p, v, u: f_roundtrip(Tern, p, v, u),
     lambda p, v, u: f_roundtrip(Paho, p, v, u), "paho-mqtt"),
    ("QoS 0/1/2 round trip, second peer", (4, 5), lambda p, v, u: f_roundtrip(Tern, p, v, u), _node_roundtrip,
     "MQTT.js"),
    ("MicroPython round trip", (4, 5), _micropython_roundtrip, lambda p, v, u: f_roundtrip(Paho, p, v, u),
     "paho-mqtt"),
    ("retained", (4, 5), lambda p, v, u: f_retained(Tern, p, v, u), lambda p, v, u: f_retained(Paho, p, v, u),
     "paho-mqtt"),
    ("will", (4, 5), lambda p, v, u: f_will(Tern, p, v, u), lambda p, v, u: f_will(Paho, p, v, u), "paho-mqtt"),
    ("no will after a clean disconnect", (4, 5), lambda p, v, u: _no_will(p, v, u, lambda b: _stop_tern(b, p, v, u)),
     lambda p, v, u: _no_will(p, v, u, lambda b: _stop_paho(b, p, v, u)), "paho-mqtt"),
    ("no will after a clean disconnect, MicroPython", (4, 5),
     lambda p, v, u: _no_will(p, v, u, lambda b: _stop_micropython(b, p, v, u)),
     lambda p, v, u: _no_will(p, v, u, lambda b: _stop_paho(b, p, v, u)), "paho-mqtt"),
    ("persistent session", (4, 5), lambda p, v, u: f_session(Tern, p, v, u), lambda p, v, u: f_session(Paho, p, v, u),
     "paho-mqtt"),
    ("shared subscription", (5,), lambda p, v, u: f_shared(Tern, p, v, u), lambda p, v, u: f_shared(Paho, p, v, u),
     "paho-mqtt"),
    ("subscription identifiers", (5,), lambda p, v, u: f_sub_ids(Tern, p, v, u),
     lambda p, v, u: f_sub_ids(Paho, p, v, u), "paho-mqtt"),
    ("tern pub / tern sub", (4, 5), lambda p, v, u: _cli_roundtrip(p, v, u, True),
     lambda p, v, u: _cli_roundtrip(p, v, u, False), "mosquitto_pub/sub"),
    ("tern pub: no will after a clean disconnect", (4, 5),
     lambda p, v, u: _no_will(p, v, u, lambda b: _stop_cli(b, p, v, u, True)),
     lambda p, v, u: _no_will(p, v, u, lambda b: _stop_cli(b, p, v, u, False)), "mosquitto_pub"),
)


# Rows still run for a version no client could connect with: what the fallback and the command do then.
ALWAYS = ("version=(5, 4) fallback", "tern pub / tern sub")


def _attempt(fn, port, v, user):
    try:
        return True, fn(port, v, user)
    except BaseException as e:  # noqa: BLE001 - every failure is a result here
        if isinstance(e, KeyboardInterrupt):
            raise
        text = ("%s: %s" % (type(e).__name__, e)).replace("\n", " ").replace("|", "/")
        return False, text[:300]


STRICT = "the strict broker logged a violation: "


def verdict(tern, peer):
    """One cell: (ok, detail) of Tern and of the peer -> text."""
    (tok, tdet), (pok, pdet) = tern, peer
    if tdet.startswith(STRICT):  # Tern broke a rule: whatever the peer did
        return "**TERN FAILS**: %s (peer: %s)" % (tdet, "passes" if pok else pdet)
    if tok:
        if "cop" in tdet or "as MQTT" in tdet:  # how the broker sent identifiers, which version it took
            return "ok: %s (peer: %s)" % (tdet, pdet)
        return "ok" if pok else "ok (peer: %s)" % pdet
    if "protocol violation" in tdet or "does not support MQTT" in tdet or tdet.startswith("broker fault"):
        return "broker: %s (peer: %s)" % (tdet, pdet if not pok else "passes")
    if not pok:
        return "broker limit: %s (peer: %s)" % (tdet, pdet)
    return "**TERN FAILS**: %s (peer passes)" % tdet


def _judged(b, fn, port, v, user):
    """_attempt, failed when the broker logged a violation meanwhile (the strict broker: b.violations)."""
    mark = b.mark() if hasattr(b, "violations") else None
    ok, det = _attempt(fn, port, v, user)
    if mark is not None:
        bad, faults = b.violations(mark)
        if bad:
            return False, (STRICT + "; ".join(bad)).replace("|", "/")[:300]
        if faults and not ok:
            return False, ("broker fault: the broker raised %s; %s" % ("; ".join(faults), det)).replace("|", "/")[:300]
    return ok, det


def run_broker(cls, work: Path, say=print, features=None) -> dict:
    b = cls(work)
    res = {"broker": cls.name, "version": "", "cells": {}, "error": None}
    absent = getattr(cls, "absent", lambda: None)()
    if absent:
        say("%-9s %s" % (cls.name, absent))
        res["error"] = absent
        return res
    try:
        res["version"] = b.version_text()
        b.start()
    except Exception as e:  # noqa: BLE001
        res["error"] = str(e)
        return res
    down = set()  # versions neither Tern nor the peer could connect with: only the rows about that run
    try:
        for name, vs, tf, pf, peer in FEATURES:
            if features and not any(f in name for f in features):
                continue
            for v in cls.versions:
                if v not in vs:
                    continue
                if v in down and name not in ALWAYS:
                    cell = "not run: no connection"
                    res["cells"]["%s|%d" % (name, v)] = {"cell": cell}
                    continue
                t = _judged(b, tf, b.port, v, cls.username)
                p = _judged(b, pf, b.port, v, cls.username)
                if name == "connect" and not t[0] and not p[0]:
                    down.add(v)
                cell = verdict(t, p)
                res["cells"]["%s|%d" % (name, v)] = {"tern": t, "peer": p, "peer_name": peer, "cell": cell}
                say("%-9s MQTT %s  %-34s %s" % (cls.name, _vname(v), name, cell[:150]))
    finally:
        b.stop()
    if hasattr(b, "statements"):
        res["statements"] = b.statements()
    return res


def _vname(v):
    return {3: "3.1", 4: "3.1.1", 5: "5"}[v]


def render(results, seconds) -> str:
    lines = ["<!-- written by `make interop` (python tools/interop/matrix.py --write docs/interop.md) -->",
             "## Matrix (generated)", "",
             "Run on %s in %.0f s. Each cell: Tern's result against the peer's (paho-mqtt; MQTT.js for the second "
             "round trip; mosquitto_pub/sub for the command line). `broker limit`: the peer fails too. "
             "`broker:`: Tern refused what the broker did (a protocol violation or no MQTT 5)." % (
                 time.strftime("%Y-%m-%d"), seconds), ""]
    for r in results:
        lines.append("### %s %s" % (r["broker"], r["version"]))
        lines.append("")
        if r["error"]:
            lines += ["Could not run here: " + r["error"].replace("\n", " ")[:600], ""]
            continue
        vs = sorted({int(k.split("|")[1]) for k in r["cells"]})
        lines.append("| feature | " + " | ".join("MQTT " + _vname(v) for v in vs) + " |")
        lines.append("|---|" + "---|" * len(vs))
        for name, fvs, _, _, peer in FEATURES:
            row = [r["cells"].get("%s|%d" % (name, v), {}).get("cell", "n/a") for v in vs]
            if all(c == "n/a" for c in row):
                continue
            lines.append("| %s (peer: %s) | %s |" % (name, peer, " | ".join(row)))
        lines.append("")
        if r.get("statements"):
            lines += ["Normative statements this broker's log names (each checked at least once in this run, for "
                      "Tern's clients or the peers; a violation would fail the cell): " +
                      ", ".join(r["statements"]) + ".", ""]
    return "\n".join(lines) + "\n"


MARK = "<!-- written by `make interop`"


def write(doc: Path, text: str) -> None:
    """Replace the generated part of doc (from MARK on) and keep what is written above it."""
    old = doc.read_text() if doc.exists() else "# Interoperability\n\n"
    head = old.split(MARK, 1)[0]
    doc.write_text(head.rstrip("\n") + "\n\n" + text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/interop/matrix.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", type=Path, help="the document whose generated matrix to replace")
    ap.add_argument("--only", action="append", help="broker name (repeatable)")
    ap.add_argument("--feature", action="append", help="run only the features whose name contains this (repeatable)")
    a = ap.parse_args(argv)
    start = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="tern-interop-") as tmp:
        _Erlang.epmd = free_port()
        epmd = subprocess.Popen(["epmd", "-address", "127.0.0.1", "-port", str(_Erlang.epmd)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if shutil.which("epmd") else None
        try:
            for cls in BROKERS:
                if a.only and cls.name not in a.only:
                    continue
                work = Path(tmp) / cls.name
                work.mkdir()
                results.append(run_broker(cls, work, features=a.feature))
        finally:
            if epmd is not None:
                epmd.terminate()
                epmd.wait(10)
    text = render(results, time.monotonic() - start)
    if a.write:
        write(a.write, text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
