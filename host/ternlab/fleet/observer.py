"""The fleet's observer: the other side of the ledger. A Tern subscriber (persistent session, QoS 2)
records every telemetry copy the broker delivers (``observer/copies.jsonl``; the fleet writes them
out as ``received.jsonl``), and says on its console (``observer/observer.log``) what it could not read.

Why a shared subscription in a group of its own (``$share/<name>/<topic>``), made after the
collectors': alone in its group it still gets every message, and Mosquitto 2.0 hands a message to
the shared groups in the order they were made (plain subscriptions come after them), so the
collectors, whose latency the demo reports, get it first. Measured in the demo, the collectors' p50
came out lower by 0.05-0.15 ms than with a plain subscription (docs/demo.md), for a reason the order
does not explain (a plain subscription was already served after them); it is kept for the measurement.
Mosquitto forgets a persistent session's shared subscriptions when it restarts: the fleet holds the
boards back and tells the observer to subscribe again (SIGUSR1, ``Observer.subscribe_again``) once the
collectors have.

Why a process of its own, at idle CPU priority: it is handed every message at the moment a collector
is, so on a two-core machine its wakeup took the core the collector, the broker or the board's next
QoS 2 step was waiting for (docs/demo.md). A thread of the fleet's process cannot give way alone: at
low priority it would hold the interpreter lock the board relays and consoles need. It writes each
row to a file as it gets it, and the fleet reads that file on its own tick (whole lines only), so no
message wakes the fleet either. On a busy machine it lags (its `recv_ts` is when it read the copy);
what it has not read by the end waits in its session on the broker.

    main([NAME, HOST, PORT, FILTER, FILE, FLEET_PID])     (prints "subscribed" when it has subscribed,
                                                           "subscribed again" after each SIGUSR1)

It ends on SIGTERM (after reading what the broker had already sent, for up to DRAIN seconds), or by
itself when the fleet's process is gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from ..pipeline.judge import message_key

DRAIN = 3.0  # seconds a stopping observer reads on at most (the fleet kills it after 5)


def _give_way() -> None:
    """Run only on a core nothing else wants (SCHED_IDLE; nice 19 where there is no such policy)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.nice(19)
        except OSError:
            pass


def main(argv=None) -> int:
    from tern.client import Client

    from ..pipeline.schema import parse_payload

    from ..mqttcli.redact import env_password
    from .login import BrokerLogin

    name, host, port, topic, path, parent, *login = argv if argv is not None else sys.argv[1:]
    _give_way()
    out = open(path, "a", buffering=1)  # a row reaches the file as it is written: a kill loses none
    cafile, user = (login + ["", ""])[:2]  # TLS and user from argv, the password from the environment
    kw = BrokerLogin(cafile or None, user or None, env_password()).client_kwargs()
    c = Client(name, server=host, port=int(port), version=5, clean=False, session_expiry=3600,
               backoff_min=0.05, backoff_max=0.5, keepalive=60, receive_max=1024, **kw)
    # keepalive 60 s: behind on a busy machine, its PINGRESP waits in the socket behind the copies it
    # has not read yet; at 10 s a 50-board fleet on a loaded host dropped the connection. Receive
    # Maximum 1024 (the client holds up to four times as many QoS 2 ids): at the default 32 it deferred
    # ~1,000 QoS 2 copies of a 50-board burst and reconnected, and the run counted thousands of copies
    # as lost that the broker had sent it (docs/fleet.md)

    got = [0]

    def on_message(m):
        ts = time.time()
        got[0] += 1
        try:
            p = parse_payload(bytes(m.payload))
        except ValueError as e:
            print(f"not a telemetry payload on {m.topic}: {e}", flush=True)
            return
        out.write(json.dumps({"device": p["device"], "boot": p["boot"], "seq": p["seq"], "qos": p["qos"],
                              "topic": m.topic, "recv_ts": ts}) + "\n")

    c.on_message = on_message
    stop = []
    again = []  # SIGUSR1: the broker restarted and forgot the shared subscription
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGUSR1, lambda *_: again.append(1))
    parent = int(parent)  # the fleet's pid, from the fleet: read here it could already be init's
    c.connect()
    c.subscribe(topic, 2)
    print("subscribed", flush=True)
    while not stop and os.getppid() == parent:
        try:
            if again and c.connected:
                codes = c.subscribe(topic, 2)
                if codes and codes[0] < 0x80:
                    again.clear()
                    print("subscribed again", flush=True)
                else:
                    print(f"subscribing again was refused: {codes}", flush=True)
                    time.sleep(0.1)
            c.loop(20)
        except OSError:
            time.sleep(0.05)  # broker restarting: loop() reconnects with backoff
    until = time.monotonic() + DRAIN
    while stop and time.monotonic() < until:  # what the broker already sent: until 50 ms bring nothing
        n = got[0]
        try:
            c.loop(50)
        except OSError:
            break
        if got[0] == n:
            break
    out.close()
    ss = c.session  # what the client did not deliver: a trail when copies are missing (docs/fleet.md)
    print(f"copies {got[0]}; client dropped {getattr(ss, 'stats_dropped', '?')}, deferred "
          f"{getattr(ss, 'stats_deferred', '?')}, resent {getattr(ss, 'stats_resent', '?')}", flush=True)
    try:
        c.disconnect()
    except Exception:
        c.close()
    return 0


class Observer:
    """The observer process, seen from the fleet: start it, read what it got, stop it."""

    def __init__(self, name: str, host: str, port: int, out: Path, log: Path, tls=None):
        self.name, self.host, self.port = name, host, port
        self.login = tls  # a fleet.login.BrokerLogin, or None: plain MQTT without a user
        self.path = Path(out)
        self.log = Path(log)
        self.rows = []                 # (device, boot, qos, seq, topic, recv_ts) per copy received: the message key first
        self.keys = defaultdict(set)   # device -> {message key}
        self.proc = None
        self._pos = 0
        self._lock = threading.Lock()

    def start(self, topic: str, timeout: float = 30.0) -> None:
        """Subscribe (in a group of its own) to topic; start it after the collectors have subscribed."""
        self.path.unlink(missing_ok=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        code = "import sys; from ternlab.fleet.observer import main; sys.exit(main())"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, self.name, self.host, str(self.port), f"$share/{self.name}/{topic}",
                 str(self.path), str(os.getpid()),
                 *((self.login.cafile or "", self.login.user or "") if self.login else ())],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env=dict(self.login.child_env() if self.login else os.environ, PYTHONUNBUFFERED="1"))
        deadline = time.monotonic() + timeout
        while "subscribed" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the fleet's observer did not subscribe: {self.log.read_text()[-500:]}")
            time.sleep(0.02)

    def subscribe_again(self, timeout: float = 15.0) -> bool:
        """After a broker restart: subscribe again (SIGUSR1), and wait until it has; False on timeout."""
        n = self.log.read_text().count("subscribed again")
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while self.log.read_text().count("subscribed again") == n:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def refresh(self) -> None:
        """Take the rows written since the last call (whole lines only). The fleet calls it once per
        tick; received(), has() and copies() answer from what it took."""
        with self._lock:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self._pos)
                    chunk = f.read()
            except FileNotFoundError:
                return
            end = chunk.rfind(b"\n") + 1
            self._pos += end
            for line in chunk[:end].splitlines():
                r = json.loads(line)
                key = message_key(r)
                self.rows.append(key + (r["topic"], r["recv_ts"]))
                self.keys[r["device"]].add(key)

    def received(self, device: str) -> int:
        return len(self.keys.get(device, ()))

    def has(self, key) -> bool:
        return key in self.keys.get(key[0], ())

    def copies(self) -> list:
        return list(self.rows)

    def stop(self) -> str | None:
        """SIGTERM, then take its last rows. Returns why its copies may be incomplete, or None."""
        trouble = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(DRAIN + 2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                trouble = "the observer did not stop on SIGTERM and was killed"
        if trouble is None and self.proc is not None and self.proc.returncode not in (0, None):
            trouble = f"the observer exited with status {self.proc.returncode} (see observer/observer.log)"
        self.refresh()
        return trouble
