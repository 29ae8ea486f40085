"""Test helpers for the collector: `tern collect` as a real process, stand-in devices on the MicroPython
unix port, and reading what landed back with pyarrow (not with the collector's own code)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq

from ternlab.paths import device_dir

ROOT = Path(__file__).resolve().parents[3]
DEVICE = device_dir("testing") / "ledger_publisher.py"
MICROPYTHON = Path(sys.executable).with_name("micropython")


class CollectorProc:
    """One `tern collect` process; its stdout lines are kept (and parsed) as they come."""

    def __init__(self, broker, landing, cid, *extra, wrap=(), env=None, preexec_fn=None, port=None):
        self.cid = cid
        cmd = [*wrap, sys.executable, "-m", "ternlab.cli", "collect", str(landing), "--id", cid,
               "-p", str(port or broker.port), "--progress", "0.1", *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env, preexec_fn=preexec_fn)
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = 20.0, after: int = 0) -> re.Match:
        """The first output line from line number ``after`` on matching ``pattern``; its number is
        left in ``self.at``."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = after
        while True:
            for i, line in enumerate(self.lines[seen:], seen):
                m = rx.search(line)
                if m:
                    self.at = i
                    return m
            seen = len(self.lines)
            if time.monotonic() > deadline or (self.proc.poll() is not None and not self._t.is_alive()
                                               and seen == len(self.lines)):
                raise AssertionError(f"collector {self.cid}: no line matching {pattern!r}; output:\n"
                                     + "\n".join(self.lines[-30:]))
            time.sleep(0.02)

    def progress(self):
        """(landed, quarantined, waiting) from the newest progress line, or None."""
        for line in reversed(self.lines):
            m = re.search(r"landed (\d+) \(.*quarantined (\d+), files \d+, waiting (\d+)", line)
            if m:
                return tuple(int(x) for x in m.groups())
        return None

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        self._t.join(5)
        return rc

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._t.join(5)

    def summary(self) -> dict:
        """The key=value pairs of the final "stopped" line."""
        for line in reversed(self.lines):
            if ": stopped" in line:
                return {k: float(v) if "." in v else int(v) for k, v in re.findall(r"(\w+)=([\d.]+)", line)}
        raise AssertionError(f"collector {self.cid} printed no summary:\n" + "\n".join(self.lines[-30:]))


def publish_all(broker, msgs, client_id: str) -> None:
    """Publish (topic, payload, qos) messages with the CPython Tern client (MQTT 5) and wait until the
    broker acknowledged them all."""
    from tern.client import Client

    c = Client(client_id, server=broker.host, port=broker.port, version=5)
    c.connect()
    for topic, payload, qos in msgs:
        c.publish(topic, payload, qos=qos)
    c.wait_all(20)
    c.disconnect()


def start_device(broker, device: str, n: int, qos: int = 1, interval_ms: int = 0, boot: int = 1):
    env = {"MICROPYPATH": f".frozen:{ROOT / 'lib'}", "PATH": "/usr/bin:/bin"}
    return subprocess.Popen([str(MICROPYTHON), "-X", "heapsize=512k", str(DEVICE), broker.host,
                             str(broker.port), device, str(n), str(qos), str(interval_ms), str(boot)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def device_ledger(out: str) -> tuple[list[dict], dict | None]:
    """The LEDGER rows and the DONE record a device printed."""
    ledger, done = [], None
    for line in out.splitlines():
        if line.startswith("LEDGER "):
            ledger.append(json.loads(line[7:]))
        elif line.startswith("DONE "):
            done = json.loads(line[5:])
    return ledger, done


def parquet_files(root) -> list[Path]:
    """Committed Parquet files under ``root`` (temporary ``.``-files left out, as Spark does)."""
    return sorted(p for p in Path(root).rglob("*.parquet") if not p.name.startswith("."))


def read_rows(root, quarantine: bool = False) -> list[dict]:
    """Every landing (or quarantine) row under ``root``, with the file it came from as ``_file``."""
    rows = []
    for f in parquet_files(root):
        if ("quarantine" in f.relative_to(root).parts) != quarantine:
            continue
        for r in pq.read_table(f).to_pylist():
            r["_file"] = f
            rows.append(r)
    return rows


def unshare_works() -> bool:
    """Whether this process may make a private mount namespace (root, or unprivileged user
    namespaces), where a real tmpfs can be mounted for a disk-full or read-only landing directory."""
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


def on_tmpfs(mount_dir, copy_to, options: str) -> list[str]:
    """A command prefix: run the rest inside a private mount namespace with a tmpfs (``options``) on
    ``mount_dir``, then copy what it holds to ``copy_to`` (the mount vanishes with the namespace) and
    exit with the command's status."""
    script = ('mount -t tmpfs -o "$2" tmpfs "$0" || exit 97; shift 2; "$@"; rc=$?; '
              'cp -a "$T"/. "$C"/ 2>/dev/null; exit $rc')
    return ["env", f"T={mount_dir}", f"C={copy_to}", "unshare", "-rm", "sh", "-c", script,
            str(mount_dir), "-", options]


def free_bytes_limit(limit: int):
    """preexec_fn: cap the size of any file the process writes (RLIMIT_FSIZE; writes past it fail with
    EFBIG) -- the fallback when no tmpfs can be mounted."""
    def apply():
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply

