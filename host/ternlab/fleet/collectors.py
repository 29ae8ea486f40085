"""A fleet's collectors: `tern collect` processes on one shared subscription, and what they landed.

Why real processes: the point is to show the collector keeps "nothing lost" when it is SIGKILLed
mid-batch -- only a separate process can be killed like that, and only the real command (the one a
user runs) proves anything. Each collector keeps its client id across restarts, so the broker holds
its unacknowledged messages while it is down and sends them again when it is back.

`LandingIndex` reads the landing set incrementally with pyarrow: landing files appear atomically (a
temp name, then a rename), so a visible ``part-*.parquet`` is complete and is read once.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

_WAITING = re.compile(r"waiting (\d+)$")


class CollectorError(RuntimeError):
    """A collector did not start or stopped on its own; the message names it and quotes its log."""


class CollectorProc:
    """One `tern collect` process (and its restarts, same id). Output goes to ``log_path``."""

    def __init__(self, cid: str, landing: Path, log_path: Path, *, host: str, port: int, topic: str,
                 group: str, batch_time: float, tls=None):
        self.id = cid
        self.landing = Path(landing)
        self.log_path = Path(log_path)
        self.argv = [sys.executable, "-m", "ternlab.cli", "collect", str(self.landing), "--id", cid,
                     "--group", group, "-t", topic, "-h", host, "-p", str(port),
                     "--batch-time", f"{batch_time:g}", "--progress", "0.25",
                     *(tls.collect_args() if tls else [])]
        self.login = tls  # its password goes by the environment (fleet/login.py), never argv
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self.starts = 0
        self.kills = 0
        self.exit_codes: list[int] = []    # every exit: -9 for a SIGKILL, 0 for a clean stop
        self._lock = threading.Lock()
        self._reader = None
        self._log = None
        self._mark = 0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def launch(self) -> None:
        """Start the process (see ready() for when it has subscribed)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self._log is None:
            self._log = open(self.log_path, "a", buffering=1)
        with self._lock:
            self._mark = len(self.lines)
        env = dict(self.login.child_env() if self.login else os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env, start_new_session=True)
        self.starts += 1
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True,
                                        name=f"collector-{self.id}")
        self._reader.start()

    def ready(self) -> bool:
        """True once this run has subscribed; CollectorError if it exited first."""
        with self._lock:
            if any("subscribed to" in ln for ln in self.lines[self._mark:]):
                return True
        if self.proc.poll() is not None:
            self._reap()
            raise CollectorError(f"collector {self.id} exited with status {self.proc.returncode} before it "
                                 f"subscribed: " + self.tail(5))
        return False

    def wait_ready(self, timeout: float = 30.0) -> "CollectorProc":
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise CollectorError(f"collector {self.id} did not subscribe within {timeout:g} s: "
                                     + self.tail(5))
            time.sleep(0.02)
        return self

    def _read(self, proc) -> None:
        for line in proc.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))
            if self._log is not None:
                self._log.write(f"{time.time():.3f} {line}")

    def waiting(self) -> int | None:
        """Messages received and not yet written, per its latest progress line (None: no line yet)."""
        with self._lock:
            for ln in reversed(self.lines[-20:]):
                m = _WAITING.search(ln)
                if m:
                    return int(m.group(1))
        return None

    def kill(self) -> int | None:
        """SIGKILL (no flush, no goodbye); returns what its last progress line said was waiting."""
        waiting = self.waiting()
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
            self.kills += 1
        self._reap()
        return waiting

    def terminate(self, timeout: float = 30.0) -> int | None:
        """SIGTERM: it writes and acknowledges its batch, disconnects, exits 0. Returns the status."""
        if self.proc is None:
            return None
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self._reap()

    def _reap(self) -> int | None:
        if self.proc is None:
            return None
        code = self.proc.wait()
        if self._reader is not None:
            self._reader.join(5)
        if len(self.exit_codes) < self.starts:
            self.exit_codes.append(code)
        return code

    def close(self) -> None:
        self.terminate(10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def stats(self) -> dict:
        """The counters of each 'stopped' line it printed (one per run that ended cleanly)."""
        out = []
        with self._lock:
            lines = list(self.lines)
        for ln in lines:
            if ": stopped" in ln:
                out.append({k: _num(v) for k, v in re.findall(r"(\w+)=([\d.]+)", ln)})
        return {"runs": self.starts, "kills": self.kills, "exit_codes": list(self.exit_codes), "stopped": out}

    def tail(self, n: int = 10) -> str:
        with self._lock:
            return " | ".join(self.lines[-n:]) or "(no output)"


def _num(v: str):
    return float(v) if "." in v else int(v)


class LandingIndex:
    """What the collectors have landed so far: every copy's (device, boot, seq, qos) and collector.

    refresh() reads only files it has not read before (landing files are immutable once visible)."""

    COLUMNS = ["device", "boot", "seq", "qos", "collector"]

    def __init__(self, root: Path):
        self.root = Path(root)
        self.copies: Counter = Counter()       # (device, boot, seq, qos) -> copies landed
        self.by_collector: Counter = Counter()
        self.by_device: Counter = Counter()    # distinct messages per device
        self.rows = 0
        self._read: set[str] = set()

    def refresh(self) -> int:
        """Read new landing files; returns how many rows they held."""
        import pyarrow.parquet as pq

        new = 0
        for path in sorted(self.root.glob("date=*/hour=*/part-*.parquet")):
            key = str(path)
            if key in self._read:
                continue
            t = pq.read_table(path, columns=self.COLUMNS).to_pydict()
            self._read.add(key)
            for d, b, s, q, c in zip(t["device"], t["boot"], t["seq"], t["qos"], t["collector"]):
                k = (d, b, s, q)
                if k not in self.copies:
                    self.by_device[d] += 1
                self.copies[k] += 1
                self.by_collector[c] += 1
            new += len(t["device"])
        self.rows += new
        return new

    def has(self, key) -> bool:
        return key in self.copies

    def files(self) -> int:
        return len(self._read)
