"""The reference broker: Eclipse Mosquitto 2.x started from a generated config,
bound to 127.0.0.1 only, stopped, killed or restarted on demand."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

INSTALL_HINT = "sudo apt-get update && sudo apt-get install -y mosquitto"


class BrokerError(RuntimeError):
    """Mosquitto is missing or would not start; the message says what to do."""


def mosquitto_path() -> str:
    for cand in (shutil.which("mosquitto"), "/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise BrokerError("mosquitto is not installed. Install it with: " + INSTALL_HINT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(host: str, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.02)
    return False


class Broker:
    """One Mosquitto process on a free loopback port.

    persistence: keep sessions and queued messages across restarts (saved on
    every change, so even `kill()` loses nothing the broker had accepted).
    extra: further mosquitto.conf lines (limits, listeners).
    """

    host = "127.0.0.1"

    def __init__(self, workdir: str | os.PathLike | None = None, *, port: int | None = None,
                 persistence: bool = False, max_inflight_messages: int | None = None,
                 max_queued_messages: int | None = None, message_size_limit: int | None = None,
                 extra: list[str] | None = None):
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="tern-broker-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.persistence = persistence
        self.limits = {
            "max_inflight_messages": max_inflight_messages,
            "max_queued_messages": max_queued_messages,
            "message_size_limit": message_size_limit,
        }
        self.extra = list(extra or [])
        self.proc: subprocess.Popen | None = None
        self.conf_path = self.workdir / "mosquitto.conf"
        self.log_path = self.workdir / "mosquitto.log"

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def config(self) -> str:
        lines = [
            f"listener {self.port} {self.host}",
            "allow_anonymous true",
            f"log_dest file {self.log_path}",
            "log_type all",
            "connection_messages true",
            "log_timestamp_format %Y-%m-%dT%H:%M:%S",
        ]
        if os.geteuid() == 0:
            lines.append("user root")  # otherwise mosquitto drops to a user who cannot write here
        if self.persistence:
            lines += [
                "persistence true",
                f"persistence_location {self.workdir}/",
                "autosave_on_changes true",
                "autosave_interval 1",
            ]
        else:
            lines.append("persistence false")
        for key, value in self.limits.items():
            if value is not None:
                lines.append(f"{key} {value}")
        lines += self.extra
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 10.0) -> "Broker":
        if self.proc and self.proc.poll() is None:
            return self
        self.conf_path.write_text(self.config())
        self.proc = subprocess.Popen(
            [mosquitto_path(), "-c", str(self.conf_path)],
            stdout=subprocess.DEVNULL, stderr=open(self.workdir / "stderr.log", "ab"),
        )
        if not wait_port(self.host, self.port, timeout) or self.proc.poll() is not None:
            self.kill()
            raise BrokerError(f"mosquitto did not start on {self.host}:{self.port}:\n{self.log_tail()}")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop (SIGTERM): mosquitto saves its persistence file."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """kill -9: what a crash or power loss of the broker looks like."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self, hard: bool = False) -> "Broker":
        """Same port, same persistence file."""
        self.kill() if hard else self.stop()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the old socket may linger briefly
            try:
                return self.start()
            except BrokerError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)
        return self

    def running(self) -> bool:
        return bool(self.proc and self.proc.poll() is None)

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for p in (self.log_path, self.workdir / "stderr.log"):
            if p.exists():
                out += p.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(out)

    def __enter__(self) -> "Broker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
