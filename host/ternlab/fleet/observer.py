"""The fleet's observer: the other side of the ledger. A Tern subscriber (persistent session, QoS 2)
records every telemetry copy the broker delivers (``observer/copies.jsonl``; the fleet writes them
out as ``received.jsonl``), and says on its console (``observer/observer.log``) what it could not read.

Why a process of its own, at idle CPU priority: it is handed every message at the moment a collector
is, so on a two-core machine its wakeup took the core the collector, the broker or the board's next
QoS 2 step was waiting for; the demo's QoS 1 p50 fell from 1.1 to 0.8 ms once it gave way. A thread
of the fleet's process cannot give way alone: at low priority it would hold the interpreter lock the
board relays and consoles need. It writes its rows to a file the fleet reads on its own tick (no
message wakes the fleet either), and flushes them every 50 ms and when it stops (SIGTERM: after
reading what the broker had already sent), so a row is never torn for the reader.

    main([NAME, HOST, PORT, TOPIC, FILE])      (prints "subscribed" when it has subscribed)

It ends on SIGTERM, or by itself when the process that started it is gone.
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

FLUSH_EVERY = 0.05


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

    name, host, port, topic, path = argv if argv is not None else sys.argv[1:]
    _give_way()
    out = open(path, "a")
    c = Client(name, server=host, port=int(port), version=5, clean=False, session_expiry=3600,
               backoff_min=0.05, backoff_max=0.5, keepalive=10)

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
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    parent = os.getppid()
    c.connect()
    c.subscribe(topic, 2)
    print("subscribed", flush=True)
    flushed = time.monotonic()
    while not stop and os.getppid() == parent:
        try:
            c.loop(20)
        except OSError:
            time.sleep(0.05)  # broker restarting: loop() reconnects with backoff
        if time.monotonic() - flushed >= FLUSH_EVERY:
            out.flush()
            flushed = time.monotonic()
    while stop:  # what the broker has already sent is read before we go: until 50 ms bring nothing
        n = got[0]
        try:
            c.loop(50)
        except OSError:
            break
        if got[0] == n:
            break
    out.flush()
    try:
        c.disconnect()
    except Exception:
        c.close()
    return 0


class Observer:
    """The observer process, seen from the fleet: start it, read what it got, stop it."""

    def __init__(self, name: str, host: str, port: int, out: Path, log: Path):
        self.name, self.host, self.port = name, host, port
        self.path = Path(out)
        self.log = Path(log)
        self.rows = []                 # (device, boot, seq, qos, topic, recv_ts) per copy received
        self.keys = defaultdict(set)   # device -> {(device, boot, seq, qos)}
        self.proc = None
        self._pos = 0
        self._lock = threading.Lock()

    def start(self, topic: str, timeout: float = 30.0) -> None:
        self.path.unlink(missing_ok=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "import sys; from ternlab.fleet.observer import main; sys.exit(main())", self.name, self.host, str(self.port), topic,
                 str(self.path)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        deadline = time.monotonic() + timeout
        while "subscribed" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the fleet's observer did not subscribe: {self.log.read_text()[-500:]}")
            time.sleep(0.02)

    def refresh(self) -> None:
        """Read the rows written since the last call (whole lines only)."""
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
                key = (r["device"], r["boot"], r["seq"], r["qos"])
                self.rows.append(key + (r["topic"], r["recv_ts"]))
                self.keys[r["device"]].add(key)

    def received(self, device: str) -> int:
        self.refresh()
        return len(self.keys.get(device, ()))

    def has(self, key) -> bool:
        self.refresh()
        return key in self.keys.get(key[0], ())

    def copies(self) -> list:
        self.refresh()
        return list(self.rows)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.refresh()

