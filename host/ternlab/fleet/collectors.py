"""A fleet's collectors: `tern collect` processes on one shared subscription, and what they landed.

Why real processes: the point is to show the collector keeps "nothing lost" when it is SIGKILLed
mid-batch -- only a separate process can be killed like that, and only the real command (the one a
user runs) proves anything. Each collector keeps its client id across restarts, so the broker holds
its unacknowledged messages while it is down and sends them again when it is back.

What they landed is read back by the judge of delivery (``pipeline.judge.LandingIndex``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

_WAITING = re.compile(r"waiting (\d+)$")
_PROGRESS = re.compile(r"landed (\d+) \(.*quarantined (\d+), files \d+, waiting (\d+)")


class CollectorError(RuntimeError):
    """A collector did not start or stopped on its own; the message names it and quotes its log."""


class CollectorProc:
    """One `tern collect` process (and its restarts, same id): the fleet's collectors and the collector's
    own tests (tests/host/devices/collecting.py) run it through this class. Output lines are kept, and
    written to ``log_path`` when one is given. ``topic``/``group``/``batch_time`` left None keep the
    command's defaults; ``extra`` are more of its arguments, ``wrap`` a command prefix (a private mount
    namespace, say); ``env``/``preexec_fn`` go to the process."""

    def __init__(self, cid: str, landing: Path, log_path: Path | None = None, *, host: str, port: int,
                 topic: str | None = None, group: str | None = None, batch_time: float | None = None,
                 progress: float = 0.25, extra=(), wrap=(), env=None, preexec_fn=None):
        self.id = cid
        self.landing = Path(landing)
        self.log_path = Path(log_path) if log_path is not None else None
        self.argv = [*wrap, sys.executable, "-m", "ternlab.cli", "collect", str(self.landing), "--id", cid,
                     "-h", host, "-p", str(port), "--progress", f"{progress:g}"]
        for flag, value in (("--group", group), ("-t", topic)):
            if value is not None:
                self.argv += [flag, value]
        if batch_time is not None:
            self.argv += ["--batch-time", f"{batch_time:g}"]
        self.argv += [str(a) for a in extra]
        self.env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
        self.preexec_fn = preexec_fn
        self.at = 0  # the line number of wait_for's latest match
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
        if self.log_path is not None and self._log is None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "a", buffering=1)
        with self._lock:
            self._mark = len(self.lines)
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=self.env, preexec_fn=self.preexec_fn, start_new_session=True)
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

    def wait_for(self, pattern: str, timeout: float = 20.0, after: int = 0) -> re.Match:
        """The first output line from line number ``after`` on matching ``pattern`` (its number is left
        in ``self.at``); CollectorError, quoting the output, when none comes before the timeout or the
        process ended without one."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = after
        while True:
            with self._lock:
                lines = list(self.lines)
            for i, line in enumerate(lines[seen:], seen):
                m = rx.search(line)
                if m:
                    self.at = i
                    return m
            seen = len(lines)
            ended = self.proc.poll() is not None and not self._reader.is_alive()
            if time.monotonic() > deadline or (ended and seen == len(self.lines)):
                raise CollectorError(f"collector {self.id}: no line matching {pattern!r}; output:\n"
                                     + "\n".join(lines[-30:]))
            time.sleep(0.02)

    def progress(self) -> tuple | None:
        """(landed, quarantined, waiting) from the newest progress line, or None."""
        with self._lock:
            lines = list(self.lines)
        for line in reversed(lines):
            m = _PROGRESS.search(line)
            if m:
                return tuple(int(x) for x in m.groups())
        return None

    def summary(self) -> dict:
        """The counters of the newest 'stopped' line (CollectorError when it printed none)."""
        stopped = self.stats()["stopped"]
        if not stopped:
            raise CollectorError(f"collector {self.id} printed no summary: " + self.tail(30))
        return stopped[-1]

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
