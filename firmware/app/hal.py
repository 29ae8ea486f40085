"""Board differences for the telemetry app, in one place: the profile, the unique id, the outbox
store, the clock, the network, the watchdog, sensors, reset and sleep.

Everything else in the firmware is board-neutral. The emulated board (module `emuboard`, the
MicroPython unix port with an emulated NOR flash) and real boards (esp32, rp2) differ only here.
Console lines for the host start with PREFIX and carry one JSON object; the host's parser is
`ternlab.app_events` and uses the same prefix.
"""

import sys
import gc
import json
from time import ticks_ms, ticks_diff, ticks_add, sleep_ms, time, gmtime

# Imports stay at module level: a built-in module a file may extend (json, time, ...) imported inside
# a function is looked up on the filesystem first at every call (8 LittleFS lookups a console line).

PREFIX = "TERN "
SEP = (",", ":")
PLATFORM = sys.platform

try:
    import emuboard
except ImportError:
    emuboard = None

T0 = ticks_ms()


def say(ev, **kw):
    # One structured console line: the host turns these into its ledger.
    kw["ev"] = ev
    print(PREFIX + json.dumps(kw, separators=SEP))


def profile():
    """The board profile (boards/<name>/profile.json): from emuboard, else `profile.json` on the
    board's flash (copied by `tern deploy`), else a minimal one for this platform."""
    if emuboard:
        return emuboard.PROFILE
    try:
        with open("profile.json") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"name": PLATFORM, "flash": {"outbox": None}, "network": "wifi" if PLATFORM != "linux" else "none",
                "sensors": [{"name": "heap", "kind": "free_heap"}, {"name": "uptime", "kind": "uptime"}],
                "watchdog_ms": None}


def unique_id():
    if emuboard:
        return emuboard.unique_id()
    import machine

    try:
        return machine.unique_id()
    except AttributeError:  # the unix port outside the emulated board
        from binascii import unhexlify

        with open("/etc/machine-id") as f:
            return unhexlify(f.read(12))


def reset():
    if emuboard:
        emuboard.reset()  # the host restarts the process
    else:
        import machine

        machine.reset()
    while True:
        sleep_ms(100)


def _machine():
    # machine, or on the emulated board the shim that stands in for its WDT, deepsleep, reset_cause
    if emuboard:
        return emuboard
    import machine

    return machine


def deep_sleep(ms):
    """Sleep with everything off for ms (RAM is lost); the board boots again with reset cause
    "deepsleep". On the emulated board the process ends and the host boots it after ms. Never 0:
    older ESP32 firmware reads deepsleep(0) as "no timer" and would sleep for good."""
    _machine().deepsleep(ms if ms > 0 else 1)
    reset()  # a port whose deepsleep returns


def reset_cause():
    """Why this boot happened: "pwron", "hard", "wdt", "deepsleep", "soft" (MicroPython's
    machine.reset_cause() by name), the raw number for another, None where the port cannot tell."""
    m = _machine()
    try:
        c = m.reset_cause()
    except AttributeError:  # the unix port outside the emulated board
        return None
    for n in ("PWRON", "HARD", "WDT", "DEEPSLEEP", "SOFT"):
        if getattr(m, n + "_RESET", None) == c:
            return n.lower()
    return c


def open_store(prof):
    """The outbox: FlashStore on the profile's raw partition, else FileStore in `outbox/`."""
    part = None
    ob = prof.get("flash", {}).get("outbox")
    if ob:
        label = ob.get("label", "outbox")
        if emuboard:
            part = emuboard.partition(label)
        elif PLATFORM == "esp32":
            import esp32

            found = esp32.Partition.find(esp32.Partition.TYPE_DATA, label=label)
            part = found[0] if found else None
        elif PLATFORM == "rp2":
            import rp2

            part = rp2.Flash()  # the region the board's build reserves for the outbox
    if part is not None:
        from tern.flashstore import FlashStore

        return FlashStore(part), "flash"
    from tern.filestore import FileStore

    return FileStore("outbox"), "file"


def link(prof):
    """The byte stream MQTT goes over when the board reaches the network through a serial link
    (profile "network": "uart", a modem in transparent mode; the qemu board's link UART), else None:
    TCP through the board's own IP stack."""
    uart = getattr(emuboard, "uart", None)  # the qemu board's emuboard has one, the unix port's none
    if prof.get("network") == "uart" and uart:
        return uart()
    return None


_EPOCH = 946684800 if gmtime(0)[0] == 2000 else 0  # embedded ports count from 2000


def epoch():
    """Seconds since 1970 when the board knows the time, else None (no clock set yet)."""
    t = time() + _EPOCH
    return t if t > 1600000000 else None


# ------------------------------------------------------------------ watchdog

class _NoDog:
    def feed(self):
        pass


dog = _NoDog()  # the watchdog once started: main.py feeds it while it waits after a crash


def watchdog(prof):
    """machine.WDT with the profile's `watchdog_ms` (the emulated board's stands in for it: the host
    resets the process when a feed is late), else a dog that does nothing. Once started it cannot be
    stopped; feed() it at least every watchdog_ms."""
    global dog
    ms = prof.get("watchdog_ms")
    if ms:
        dog = _machine().WDT(timeout=ms)
    return dog


# ------------------------------------------------------------------- network

class Net:
    """Wi-Fi station bring-up with retry and exponential backoff; nothing to do without a radio.
    poll() never blocks: the app keeps measuring (and queueing) while the network is down. The
    backoff is the library's policy (tern.client.backoff_ms) with the app's backoff_min_ms and
    backoff_max_ms, never under ASSOC_MS: the time a station takes to associate (a connect() called
    again sooner would cut the one under way short)."""

    ASSOC_MS = 1000

    def __init__(self, prof, ssid, password, backoff_min_ms, backoff_max_ms):
        self.wlan = None
        self.up = prof.get("network", "none") != "wifi"
        if not self.up:
            import network

            self.wlan = network.WLAN(network.STA_IF)
            self.wlan.active(True)
            self.ssid = ssid
            self.pw = password
            self.lo = backoff_min_ms
            self.hi = backoff_max_ms
            self.n = 0  # failed attempts since the link was last up
            self.delay = self.ASSOC_MS
            self.t = ticks_ms()
            self.attempt = False
            if not ssid:
                say("net", ok=False, err="no wifi_ssid in config")

    def poll(self):
        w = self.wlan
        if w is None:
            return True
        was = self.up
        self.up = w.isconnected()
        if self.up:
            if not was:
                say("net", ok=True, ip=w.ifconfig()[0])
                self.n = 0
                self.delay = self.ASSOC_MS
            return True
        if was:
            say("net", ok=False, err="link lost")
        if self.ssid and ticks_diff(ticks_ms(), self.t) >= 0:
            if self.attempt:
                say("net", ok=False, err="no link after %d ms" % self.delay, status=w.status())
                from tern.client import backoff_ms

                self.n += 1
                self.delay = max(self.ASSOC_MS, backoff_ms(self.n, self.lo, self.hi))
            w.connect(self.ssid, self.pw)
            self.attempt = True
            self.t = ticks_add(ticks_ms(), self.delay)
        return False

    def link(self):
        """Whether the link is up now (no retry, no console line: safe anywhere, e.g. before a dial)."""
        return self.wlan is None or self.wlan.isconnected()

    def rssi(self):
        return self.wlan.status("rssi") if self.wlan and self.up else None


# ------------------------------------------------------------------- sensors

def _synthetic(name, k):
    # Deterministic: a sawtooth per sensor name over the reading index.
    return 20 + ((k * 7 + len(name) * 13) % 100) / 10


def read_sensors(sensors, names, k, net):
    """{name: value} for the profile's sensors whose names are in `names` (None: all)."""
    r = {}
    for s in sensors:
        n = s["name"]
        if names is not None and n not in names:
            continue
        kind = s["kind"]
        v = None
        if kind == "synthetic":
            v = _synthetic(n, k)
        elif kind == "free_heap":
            v = gc.mem_free()
        elif kind == "uptime":
            v = ticks_diff(ticks_ms(), T0) / 1000
        elif kind == "rssi":
            v = net.rssi()
        elif kind == "mcu_temp":
            if PLATFORM == "esp32":
                import esp32

                t = getattr(esp32, "mcu_temperature", None)  # S2, S3, C3, C6: degrees C
                v = t() if t else (esp32.raw_temperature() - 32) / 1.8  # the first ESP32: degrees F
            else:  # rp2: ADC channel 4, the on-die sensor
                from machine import ADC

                v = 27 - (ADC(4).read_u16() * 3.3 / 65535 - 0.706) / 0.001721
        elif kind == "adc":
            from machine import ADC, Pin

            v = ADC(Pin(s["pin"])).read_u16()
        if v is not None:
            r[n] = v
    return r
