"""The telemetry app: measure, publish through the durable outbox, obey commands, report on the console.

Each reading is published as the pipeline's payload {"d","b","s","q","t","r"} (see
host/ternlab/pipeline/schema.py): d the device id, b the boot counter, s a sequence number that
counts from 0 at each boot, one counter per QoS level, t the board's clock when it has one, r the
readings. The boot counter lives in the outbox store's meta and is incremented (durably) before the
first publish of a boot, so (d, b, s, q) names a reading for ever: the pipeline can tell a lost
reading from a reboot.

Console (one line per event, prefix hal.PREFIX, a JSON object; parsed by ternlab.app_events):
  boot       d, b, recovered (messages the store gave back), store, profile
  published  p (packet id, 0 for QoS 0), topic, m (the payload) -- printed only after publish()
             returned, i.e. once the message is durable in the outbox: the host's ledger
  acked      p, rc            dropped   q, err (a reading that was not accepted)
  connected  sp, pending      disconnected / connect_failed   err
  cmd, status, config, net, done, refused, sleep, reboot
"""

import gc
import json
from time import ticks_ms, ticks_diff, ticks_add, sleep_ms

import hal
from hal import say
from tern.client import Client, ConnectError


class _Client(Client):
    net = None  # hal.Net: no dialing without a link (a connect that cannot succeed costs power)

    def connect(self, timeout=None):
        if self.net and not self.net.link():
            raise OSError("no network link")  # loop() tries again after its backoff; step() waits for the link
        try:
            return Client.connect(self, timeout, False)  # retry off: each failed attempt is said here, loop() retries
        except OSError as e:  # ConnectError included: the broker said no
            m = str(e)
            if "ertificate" in m:  # TLS verification failed: name the key to look at
                say("connect_failed", err=m, key="host" if "CN" in m else "ca")
            elif "addrinfo" in m:  # the name does not resolve: "[addrinfo error -2]" alone named nothing
                say("connect_failed", err=m, key="host", host=self.server)
            else:
                say("connect_failed", err=m)
            raise


def _config(prof):
    # The checker runs once per boot: it is unloaded afterwards, so its tables and code leave the heap.
    import sys
    import tconfig

    cfg = tconfig.load(prof)
    dev = cfg["client_id"]
    if dev is None:  # an emulated board's own id (PROFILE-<8 hex>) reads well in logs; a chip's is bytes
        from binascii import hexlify

        u = hal.unique_id()
        dev = u.decode() if hal.emuboard and tconfig.id_ok(u.decode()) else "tern-" + hexlify(u).decode()
        cfg["client_id"] = dev
    tconfig.topics(cfg, dev)
    del sys.modules["tconfig"]
    return cfg


class App:
    def __init__(self):
        prof = self.prof = hal.profile()
        self.wdt = hal.watchdog(prof)
        cfg = self.cfg = _config(prof)
        dev = self.dev = cfg["client_id"]
        self.net = hal.Net(prof, cfg["wifi_ssid"], cfg["wifi_password"], cfg["backoff_min_ms"], cfg["backoff_max_ms"])
        store, kind = hal.open_store(prof)
        if kind == "flash":
            # Recovered here, before the client takes its buffers, into an index sized once for max_pending
            # (a FlashStore.open() is not repeated by the session): a scan that had to grow its index in a
            # heap the client already split raised MemoryError at every boot over a full outbox.
            store.reserve(cfg["max_pending"])
            gc.collect()
            store.open()
        v = cfg["version"]
        wd = prof.get("watchdog_ms")
        ssl = None
        if cfg["tls"]:
            ssl = self._tls()
        c = self.c = _Client(
            dev, server=cfg["host"] or "", port=cfg["port"], version=v, keepalive=cfg["keepalive"],
            clean=False, store=store, ssl=ssl, reconnect=cfg["host"] is not None,
            backoff_min=cfg["backoff_min_ms"] / 1000, backoff_max=cfg["backoff_max_ms"] / 1000,
            connect_timeout=max(1, min(10, wd // 2000)) if wd else 10, window=cfg["window"],
            max_pending=cfg["max_pending"], rx_size=cfg["rx_size"], tx_size=cfg["tx_size"],
            session_expiry=cfg["session_expiry"] if v == 5 else None,
            username=cfg["user"], password=cfg["password"], will_topic=cfg["status_topic"],
            will_payload=json.dumps({"d": dev, "online": False}), will_qos=1, will_retain=True, stream=hal.link(prof))
        # The boot counter: durable before anything of this boot is published.
        b = store.meta("boot")
        self.boot = 0 if b is None else int(b) + 1
        store.set_meta("boot", str(self.boot).encode())
        self.store = store
        self.seq = [0, 0, 0]
        q = cfg["qos"]
        self.qos = q if isinstance(q, list) else [q]
        self.k = 0
        self.lw = 1 << 30
        # The interval command's value sticks (store meta "interval": b"<config.json's> <the command's>",
        # one record: a power cut leaves the old pair or the new one) while config.json still says what it
        # said when the command came; an edited interval_ms wins, and the override is dropped for good.
        iv = cfg["interval_ms"]
        m = store.meta("interval")
        if m:
            m = m.split()
            if int(m[0]) == iv:
                iv = int(m[1])
            else:
                store.set_meta("interval", b"")
        self.interval = iv
        self.qtopic = json.dumps(cfg["topic"])
        self.read_now = self.status_due = self.reboot = False
        self.retry_at = 0
        c.net = self.net
        c.on_connect = self._connected
        c.on_disconnect = self._disconnected
        c.on_published = self._acked
        base = cfg["cmd_topic"] + "/"
        # QoS 2: a command is delivered once even across a reboot (the reboot command cannot loop);
        # retain_handling 2: a retained command is not replayed on subscribe.
        for name, h in (("interval", self._cmd_interval), ("read", self._cmd_read),
                        ("reboot", self._cmd_reboot), ("status", self._cmd_status)):
            c.subscribe(base + name, 2, handler=h, retain_handling=2)
        say("boot", d=dev, b=self.boot, recovered=c.session.stats_recovered, store=kind,
            profile=prof.get("name"), heap=gc.mem_free(), cause=hal.reset_cause())

    def _tls(self):
        # tern.tls verifies (a bare MicroPython SSLContext would not) and reads the CA as PEM or DER.
        # A CA that cannot be loaded still means verification: every handshake fails (closed, not open).
        import ssl

        ca = self.cfg["ca"]
        if ca:
            from tern.tls import context

            try:
                return context(ca=ca)
            except (OSError, ValueError) as e:
                say("config", key="ca", err="cannot load %s: %s" % (ca, e))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        # None: "insecure": true (tconfig said so); "": no usable ca, verified against none (fails)
        ctx.verify_mode = ssl.CERT_NONE if ca is None else ssl.CERT_REQUIRED
        return ctx

    # ------------------------------------------------------------ callbacks

    def _connected(self, sp, rc):
        say("connected", sp=bool(sp), pending=self.store.count())
        self.status_due = True

    def _disconnected(self, err):
        say("disconnected", err=str(err))

    def _acked(self, pid, rc):
        say("acked", p=pid, rc=rc)

    def _cmd_interval(self, m):
        if m.retain:
            return
        try:
            ms = int(bytes(m.payload))
            if not 10 <= ms <= 86400000:
                raise ValueError
        except ValueError:
            say("cmd", cmd="interval", err="payload must be milliseconds 10..86400000")
            return
        self.store.set_meta("interval", ("%d %d" % (self.cfg["interval_ms"], ms)).encode())  # durable first
        self.interval = ms
        self.nxt = ticks_add(ticks_ms(), ms)  # the new interval starts now
        say("cmd", cmd="interval", ms=ms)

    def _cmd_read(self, m):
        if not m.retain:
            self.read_now = True
            say("cmd", cmd="read")

    def _cmd_reboot(self, m):
        if not m.retain:
            self.reboot = True
            say("cmd", cmd="reboot")

    def _cmd_status(self, m):
        if not m.retain:
            self.status_due = True
            say("cmd", cmd="status")

    # ------------------------------------------------------------ work

    def reading(self):
        """Measure and publish one reading; the ledger line follows only an accepted publish."""
        q = self.qos[self.k % len(self.qos)]
        gc.collect()  # a small heap stays unfragmented; free_heap reads what is really free
        f = gc.mem_free()
        if f < self.lw:
            self.lw = f  # free heap's low-water mark after a collection: reported with "done" and "status"
        r = hal.read_sensors(self.prof.get("sensors", ()), self.cfg["readings"], self.k, self.net)
        self.k += 1
        s = self.seq[q]
        c = self.c
        if q and c.session.outbox_full():
            say("dropped", q=q, err="outbox full", pending=self.store.count())
            return
        payload = json.dumps({"d": self.dev, "b": self.boot, "s": s, "q": q, "t": hal.epoch(), "r": r}, separators=hal.SEP)
        try:
            pid = c.publish(self.cfg["topic"], payload, qos=q)
        except (OSError, ValueError) as e:  # QoS 0 offline, a full partition; what the CONNACK forbids
            say("dropped", q=q, err=str(e))
            return
        self.seq[q] = s + 1
        print('%s{"ev":"published","p":%d,"topic":%s,"m":%s}' % (hal.PREFIX, pid, self.qtopic, payload))

    def status(self):
        self.status_due = False
        body = json.dumps({"d": self.dev, "online": True, "b": self.boot, "n": self.k,
                           "pending": self.store.count(), "interval_ms": self.interval,
                           "heap": gc.mem_free(), "lw": self.lw, "up": ticks_diff(ticks_ms(), hal.T0) // 1000}, separators=hal.SEP)
        try:
            self.c.publish(self.cfg["status_topic"], body, qos=1, retain=True)
        except (OSError, ValueError) as e:  # ValueError: the server takes no retained messages
            say("status", err=str(e))
            return
        say("status", sent=True)

    def step(self, wait):
        """Let the client work for up to `wait` ms: receive, keepalive, reconnect with backoff."""
        c = self.c
        if self.cfg["host"] is None or not self.net.poll():
            sleep_ms(wait)
            return
        if not c.reconnect:
            if ticks_diff(ticks_ms(), self.retry_at) < 0:
                sleep_ms(wait)
                return
            c.reconnect = True
        try:
            c.loop(wait)
        except ConnectError as e:
            # a refusal that retrying soon cannot fix (credentials, client id): try again in a minute
            say("refused", rc=e.reason, err=str(e))
            self.retry_at = ticks_add(ticks_ms(), 60000)

    def _offline(self):
        # MQTT 5: DISCONNECT 0x04 makes the broker publish the will (offline) now; otherwise drop the link.
        c = self.c
        if c.connected and self.cfg["version"] == 5:
            c.disconnect(4)
        else:
            c.close()

    def run(self):
        cfg = self.cfg
        n = cfg["count"]
        self.step(0)  # connect first: the first reading can then go out at once
        self.nxt = ticks_ms()
        while True:
            self.wdt.feed()
            now = ticks_ms()
            if (self.read_now or ticks_diff(now, self.nxt) >= 0) and (not n or self.k < n):
                if not self.read_now:
                    nxt = ticks_add(self.nxt, self.interval)
                    if ticks_diff(nxt, now) < 0:  # fell behind: do not burst to catch up
                        nxt = ticks_add(now, self.interval)
                    self.nxt = nxt
                self.read_now = False
                self.reading()
                if n and self.k == n:
                    say("done", n=n, seq=self.seq, pending=self.store.count(), lw=self.lw)
                if cfg["deep_sleep"]:
                    self.sleep()
            if self.status_due and self.c.connected:
                self.status()
            if self.reboot:
                say("reboot", pending=self.store.count())
                self._offline()
                hal.reset()
            wait = ticks_diff(self.nxt, ticks_ms())
            self.step(500 if wait > 500 or n and self.k >= n else wait if wait > 0 else 0)

    def sleep(self):
        """Deep sleep until the next reading is due: the status of this boot's connect is published first
        (QoS 1, into the outbox), then the outbox gets the time left (at most 5 s, feeding the watchdog)
        to drain, then the board powers down for the rest. Whatever is still pending is in the store and
        goes out after the wake-up (a new boot). The time left is read after the drain: an interval
        command that arrived meanwhile sets it."""
        t = ticks_ms()
        while True:
            if self.status_due and self.c.connected:
                self.status()
            ms = ticks_diff(self.nxt, ticks_ms())
            if not self.store.count() or ms <= 0 or ticks_diff(ticks_ms(), t) >= 5000:
                break
            self.wdt.feed()
            self.step(50)
        if ms < 0:
            ms = 0
        say("sleep", ms=ms, pending=self.store.count())
        self._offline()
        self.store.close()
        hal.deep_sleep(ms)


def main():
    App().run()
