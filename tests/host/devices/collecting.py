"""Test helpers for the collector: `tern collect` as a real process (the harness's CollectorProc, as
the fleet runs it), stand-in devices on the MicroPython unix port, and reading what landed back with
pyarrow (not with the collector's own code)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from ternlab.fleet.collectors import CollectorProc

from ternlab.paths import device_dir

ROOT = Path(__file__).resolve().parents[3]
DEVICE = device_dir("testing") / "ledger_publisher.py"
MICROPYTHON = Path(sys.executable).with_name("micropython")


def start_collector(broker, landing, cid, *extra, wrap=(), env=None, preexec_fn=None, port=None) -> CollectorProc:
    """A running `tern collect` on ``broker`` (the harness's own CollectorProc, progress every 0.1 s):
    ``extra`` are more of its arguments, ``wrap`` a command prefix."""
    c = CollectorProc(cid, landing, host=broker.host, port=port or broker.port, progress=0.1, extra=extra,
                      wrap=wrap, env=env, preexec_fn=preexec_fn)
    c.launch()
    return c


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

