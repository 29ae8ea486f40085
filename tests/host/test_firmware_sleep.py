"""Deep sleep and the watchdog, on emulated boards against a real Mosquitto.

The emulated board's watchdog is enforced by the host (ternlab.boards.emulated: the relay that owns
the device process times the feeds and kills and reboots the process when one is late), and its deep
sleep ends the process and boots it again later (firmware/emulated/unix/emuboard.py). `board.freeze()` is
fault injection: it stops the device process where it is, an app that hangs.
"""

import json
import time

import pytest

from ternlab.boards import BoardError, load_profile
from ternlab.boards.emulated import EmulatedBoard
from firmwarekit import Device, Watcher, check_delivery, send


def events(board, since=0):
    return [x for x in board.log.lines[since:] if x.kind == "event"]


def wait_event(board, text, timeout, since=0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for i, x in enumerate(board.log.lines[since:]):
            if x.kind == "event" and text in x.text:
                return since + i, x
        time.sleep(0.02)
    tail = "\n".join(x.text for x in board.log.lines[-20:])
    raise AssertionError(f"no {text!r} event within {timeout} s; console tail:\n{tail}")


def delivered(watch, ledger, timeout=15):
    want = {(r["device"], r["boot"], r["qos"], r["seq"]) for r in ledger if r["qos"]}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not want <= set(watch.keys()):
        time.sleep(0.05)
    return watch.keys()


# ----------------------------------------------------------------- the emulated board itself

STAGES = """
import emuboard, time
try:
    n = int(open("stage").read())
except OSError:
    n = 0
with open("stage", "w") as f:
    f.write(str(n + 1))
print("stage", n, "cause", emuboard.reset_cause())
if n == 0:
    w = emuboard.WDT(timeout=400)
    for i in range(8):  # fed for twice its timeout: no reset
        time.sleep_ms(100)
        w.feed()
    print("busy loop")
    while True:
        pass
elif n == 1:
    w = emuboard.WDT(timeout=400)
    print("blocking call")
    time.sleep(60)
elif n == 2:
    w = emuboard.WDT(timeout=1500)
    print("to the REPL with the dog running")
elif n == 3:
    print("idle after a soft reboot")
    time.sleep(60)
elif n == 4:
    emuboard.reset()
elif n == 5:
    emuboard.deepsleep(300)
elif n == 6:
    emuboard.deepsleep()
else:
    print("done")
"""


def test_emulated_watchdog_and_deep_sleep_behave_like_the_hardware(tmp_path):
    """A started watchdog resets the board out of a busy loop, a blocking call and, since nothing can
    stop it, the REPL after a soft reboot; each boot reads why it happened through reset_cause()
    (the ESP32 port's numbers); deep sleep ends the process for its time, or until a power cycle."""
    b = EmulatedBoard("unix-emulated", workdir=tmp_path / "board", board_id="wdt-1")
    try:
        b.write_file("main.py", STAGES)
        b.power_cycle()
        b.wait_for(r"^stage 2 cause 3$", timeout=10)  # busy loop, then blocking call: both bitten
        assert b.reset_cause == "wdt"
        b.wait_for(r"^to the REPL", timeout=5)
        b.soft_reset()  # Ctrl-D at the REPL: a new process, and the dog of stage 2 still counts
        b.wait_for(r"^stage 3 cause 5$", timeout=5)
        b.wait_for(r"^stage 4 cause 3$", timeout=5)  # nobody fed it after the soft reboot
        b.wait_for(r"^stage 5 cause 2$", timeout=5)  # machine.reset()
        b.wait_for(r"^stage 6 cause 4$", timeout=5)  # woke from deepsleep(300)
        deadline = time.monotonic() + 5
        while not b.asleep and time.monotonic() < deadline:
            time.sleep(0.02)
        assert b.asleep and b.is_on  # deepsleep() without a time: asleep until a power cycle
        with pytest.raises(BoardError, match="deep sleep"):
            b.exec("print(1)")
        time.sleep(0.5)
        assert b.asleep
        b.power_cycle()
        b.wait_for(r"^stage 7 cause 1$", timeout=5)
        b.wait_for(r"^done$", timeout=5)
        ev = [x.text for x in events(b)]
        assert [t for t in ev if t.startswith("watchdog reset")] == ["watchdog reset (not fed for 400 ms)"] * 2 + [
            "watchdog reset (not fed for 1500 ms)"], ev
        lines = b.log.lines
        feed_end = next(x.mono for x in lines if x.text == "busy loop")
        bite = next(x.mono for x in lines if x.kind == "event" and x.text.startswith("watchdog reset"))
        assert 0.3 <= bite - feed_end <= 2.0, (feed_end, bite)  # fed until "busy loop": bitten ~400 ms later
        slept = next(x.mono for x in lines if x.kind == "event" and x.text == "deep sleep (300 ms)")
        woke = next(x.mono for x in lines if x.text == "stage 6 cause 4")
        assert woke - slept >= 0.3, (slept, woke)
    finally:
        b.close()


# ------------------------------------------------------------------------------- the firmware


def test_deep_sleep_between_readings_loses_nothing_across_a_network_cut(tmp_path, broker, chaos):
    """deep_sleep: one reading per boot, then the board sleeps until the next one is due; each wake is a
    boot with the deep-sleep cause and the next boot counter from the store. Readings taken while the
    broker is unreachable for several sleep cycles wait in the outbox and all arrive afterwards. The
    watchdog runs too, shorter than the interval: the app feeds it while it waits for the outbox to
    drain (offline, the whole interval), so it never bites."""
    prof = load_profile("unix-emulated")
    prof["watchdog_ms"] = 1200
    cfg = {"host": chaos.address[0], "port": chaos.address[1], "client_id": "dev-1", "interval_ms": 1500,
           "qos": 1, "deep_sleep": True, "backoff_min_ms": 50, "backoff_max_ms": 200}
    watch = Watcher(broker.address)
    dev = Device(tmp_path, cfg, profile=prof)
    try:
        b = dev.board
        b.power_cycle()
        log = dev.until(lambda t: t.counts["boot"] >= 2 and t.counts["acked"] >= 2, 20, "two sleep cycles online")
        chaos.refuse_connections(1000)  # the link is down: every connection is closed at once
        chaos.cut_now()
        first_off = log.counts["boot"] + 1
        dev.until(lambda t: t.counts["boot"] >= first_off + 2 and t.counts["sleep"] >= first_off + 2, 30,
                  "sleep cycles while offline")
        chaos.clear_rules()
        log = dev.until(lambda t: any(e["pending"] >= 3 for e in t.of("connected")), 30,
                        "a connect with the readings queued offline")
        n = log.counts["boot"]
        log = dev.until(lambda t: t.counts["boot"] >= n + 1 and t.counts["sleep"] >= n + 1, 30, "one more cycle")
        ledger = list(log.ledger)
        keys = delivered(watch, ledger)

        assert check_delivery(ledger, keys) == len(ledger) >= 6
        boots = log.of("boot")
        assert [e["b"] for e in boots] == list(range(len(boots))), "the boot counter must go on from the store"
        assert [e["cause"] for e in boots] == ["pwron"] + ["deepsleep"] * (len(boots) - 1), boots
        # one reading per boot, and each boot but the last ended in a deep sleep the host timed
        assert sorted((r["boot"], r["seq"]) for r in ledger) == [(i, 0) for i in range(len(ledger))]
        offline = [e for e in log.of("sleep") if e["pending"] > 0]
        assert len(offline) >= 3, log.of("sleep")  # several cycles slept with readings still queued
        assert max(e["pending"] for e in offline) >= 3
        lines = b.log.lines
        sleeps = [x for x in lines if x.kind == "event" and x.text.startswith("deep sleep (")]
        assert len(sleeps) >= len(boots) - 1
        for s in sleeps:  # the process was gone for the time asked: the next boot came no sooner
            ms = int(s.text.split("(")[1].split()[0])
            nxt = next((x for x in lines if x.mono > s.mono and x.kind == "out" and '"ev":"boot"' in x.text), None)
            assert nxt is None or nxt.mono - s.mono >= ms / 1000 - 0.01, (s, nxt)
        assert not any("watchdog reset" in x.text for x in events(b)), "the watchdog bit a sleeping app"
        assert not dev.tracebacks and not log.counts["crash"]
    finally:
        watch.close()
        dev.close()


def test_watchdog_resets_a_hung_app_and_spares_a_healthy_one(tmp_path, broker):
    """A profile with a 1.5 s watchdog: the app feeds it through many intervals and is never reset;
    frozen mid-run (fault injection), the board is reset by the watchdog, boots with the watchdog
    cause and carries on, and every QoS >= 1 reading it accepted arrives."""
    wd = 1500
    prof = load_profile("unix-emulated")
    prof["watchdog_ms"] = wd
    cfg = {"host": broker.host, "port": broker.port, "client_id": "dev-1", "interval_ms": 50, "qos": [1, 2]}
    watch = Watcher(broker.address)
    dev = Device(tmp_path, cfg, profile=prof)
    try:
        b = dev.board
        b.power_cycle()
        dev.until(lambda t: t.counts["published"] >= 1, 15, "the first reading")
        wait_event(b, "watchdog started (1500 ms)", 5)
        t0 = time.monotonic()
        log = dev.until(lambda t: time.monotonic() - t0 > 3 * wd / 1000, 15, "three watchdog periods")
        assert log.boots == [0] and not any("watchdog reset" in x.text for x in events(b)), "a healthy app was reset"
        assert len(log.ledger) >= 30, len(log.ledger)

        mark = len(b.log.lines)
        b.freeze()  # the app hangs wherever it is: no output, no feed, no Ctrl-C
        i, frozen = wait_event(b, "frozen (fault injection", 1, since=mark)
        _, bite = wait_event(b, "watchdog reset (not fed for 1500 ms)", wd / 1000 + 5, since=i)
        # its last feed came at most ~0.5 s before the freeze: the dog bites ~1-1.5 s after it, not sooner
        assert bite.mono - frozen.mono >= 0.5, "reset sooner than the watchdog allows"
        n = len(log.ledger)
        log = dev.until(lambda t: t.counts["boot"] >= 2 and len(t.ledger) >= n + 20, 20, "readings after the reset")
        boots = log.of("boot")
        assert [(e["b"], e["cause"]) for e in boots] == [(0, "pwron"), (1, "wdt")], boots
        assert b.reset_cause == "wdt"
        ledger = list(log.ledger)
        assert check_delivery(ledger, delivered(watch, ledger)) == len(ledger)
        assert not dev.tracebacks and not log.counts["crash"]
    finally:
        watch.close()
        dev.close()


def statuses(watch):
    return [json.loads(p) for _, p, _ in list(watch.got)]


def test_deep_sleep_publishes_the_status_and_keeps_the_interval_command(tmp_path, broker):
    """deep_sleep: each boot publishes its "online" status (retained, QoS 1) before it sleeps, as after
    every connect (it used to go straight from the reading to sleep, so the retained status only ever
    said offline). An interval command outlives the sleeps: it reaches the sleeping board at its next
    connect (QoS 2, persistent session), and that boot and every wake after it sleep for the new
    interval, not config.json's (it used to live in RAM, which deep sleep loses)."""
    cfg = {"host": broker.host, "port": broker.port, "client_id": "dev-1", "interval_ms": 800, "qos": 1,
           "deep_sleep": True}
    st = Watcher(broker.address, flt="tern/dev-1/status", cid="status-watch")
    dev = Device(tmp_path, cfg)
    try:
        dev.board.power_cycle()
        dev.until(lambda t: t.counts["sleep"] >= 2, 20, "two sleep cycles")
        send(broker.address, "tern/dev-1/cmd/interval", b"2200")  # asleep or not, the session gets it
        log = dev.until(lambda t: any(e.get("ms") == 2200 for e in t.of("cmd")), 20, "the command after a wake")
        n = log.counts["boot"]
        log = dev.until(lambda t: t.counts["boot"] >= n + 2 and t.counts["sleep"] >= n + 2, 30,
                        "two wakes after the command")
        per_boot, sleeps = {}, {}  # boot -> its events in order; boot -> the ms it slept
        for e in log.events:
            if e["ev"] == "boot":
                b = e["b"]
            if e["ev"] in ("boot", "status", "sleep"):
                per_boot.setdefault(b, []).append(e["ev"] if e["ev"] != "status" or e.get("sent") else "status-err")
            if e["ev"] == "sleep":
                sleeps[b] = e["ms"]
            if e["ev"] == "cmd":
                took = b  # the boot that received the command
        assert len(sleeps) >= n + 2, per_boot
        for b in sleeps:  # connected, so the status went out (into the outbox) before the sleep
            assert per_boot[b] == ["boot", "status", "sleep"], (b, per_boot[b])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not set(sleeps) <= {s.get("b") for s in statuses(st)}:
            time.sleep(0.05)
        online = {s["b"]: s["interval_ms"] for s in statuses(st) if s.get("online")}
        assert set(sleeps) <= set(online), (sorted(sleeps), statuses(st))
        # before the command config.json's interval; from the boot that took it on, the command's
        assert all(online[b] == 800 for b in online if b < took), online
        assert all(online[b] == 2200 for b in online if b > took), online
        assert all(sleeps[b] <= 800 for b in sleeps if b < took), sleeps
        assert all(1000 <= sleeps[b] <= 2200 for b in sleeps if b >= took), sleeps
        assert [e["cause"] for e in log.of("boot")] == ["pwron"] + ["deepsleep"] * (len(log.of("boot")) - 1)
        assert not dev.tracebacks and not log.counts["crash"]
    finally:
        st.close()
        dev.close()


def newer_format_outbox(board):
    """Make the board's outbox partition hold a sector header of a newer FlashStore format (what a
    downgrade from newer firmware leaves): FlashStore refuses to open it rather than erase it, so the
    app raises at boot, a real crash for main.py to handle."""
    import zlib

    sh = bytearray(b"\xff" * 32)
    sh[0:4] = b"TnF1"
    sh[4] = 99
    sh[24:28] = (zlib.crc32(bytes(sh[0:24])) & 0xFFFFFFFF).to_bytes(4, "little")
    with open(board.image, "r+b") as f:
        f.seek(board.fs_blocks * board.profile["flash"]["block_size"])
        f.write(sh)


def test_crash_waits_30_s_feeding_the_watchdog_then_resets(tmp_path):
    """main.py after a crash: the crash line, 30 s with the watchdog fed (1.5 s here; the Pico W's is 8 s
    at most), then machine.reset(). The watchdog used to bite 1.5 s after the crash: a boot loop at
    the watchdog's pace instead of the 30 s the docs promise."""
    prof = load_profile("unix-emulated")
    prof["watchdog_ms"] = 1500
    dev = Device(tmp_path, {"client_id": "dev-1", "interval_ms": 1000}, profile=prof)
    try:
        b = dev.board
        b.power_off()
        newer_format_outbox(b)
        b.power_on()
        b.wait_for(r'"ev": ?"crash".*format 99', timeout=15)
        crash = next(x for x in b.log.lines if x.kind == "out" and "crash" in x.text)
        wait_event(b, "watchdog started (1500 ms)", 1)
        i, reset = wait_event(b, "reset (", 40)
        assert reset.text == "reset (machine.reset)", [x.text for x in events(b)]
        assert 29.5 <= reset.mono - crash.mono <= 33, reset.mono - crash.mono
        b.wait_for(r'"ev": ?"crash"', timeout=15, since=i)  # the next boot meets the same flash
        assert b.reset_cause == "hard"
        assert not [x.text for x in events(b) if "watchdog reset" in x.text]
    finally:
        dev.close()
