"""`tern demo`: the main job, end to end on this machine.

For now (until the fleet, firmware and Spark pieces land) it runs the smallest
honest end-to-end thing: a device on the MicroPython unix port publishes
numbered QoS 1 messages with the Tern client; a collector on CPython (Tern
client, persistent session) receives them through a real Mosquitto; midway the
broker is killed with SIGKILL and restarted on its persistence file. The
verdict checks that every message arrived, and how many came twice.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from tern.client import Client

from .broker import Broker

ROOT = Path(__file__).resolve().parents[2]


def micropython() -> str:
    exe = Path(sys.executable).with_name("micropython")
    if not exe.exists():
        raise SystemExit("the MicroPython unix port is missing: run `make demo`, which installs it")
    return str(exe)


def add_subcommands(sub) -> None:
    p = sub.add_parser("demo", help="run the end-to-end demo (emulated device, Mosquitto, faults, verdict)")
    p.add_argument("--messages", type=int, default=600, help="messages the device publishes (default 600)")
    p.add_argument("--kill-at", type=float, default=0.4,
                   help="fraction of messages received when the broker is killed (default 0.4)")
    p.add_argument("--timeout", type=float, default=120, help="seconds before giving up (default 120)")
    p.add_argument("--short", action="store_true", help="a quick run for CI (150 messages)")
    p.set_defaults(func=run)


def run(args) -> int:
    console = Console()
    n = 150 if args.short else args.messages
    if n < 1 or not 0 < args.kill_at < 1:
        console.print("[red]--messages must be >= 1 and --kill-at between 0 and 1[/]")
        return 2
    got: list[int] = []
    lock = threading.Lock()
    with Broker(persistence=True) as broker:
        console.print(f"Mosquitto on {broker.host}:{broker.port} (persistence on)")
        collector = Client("demo-collector", server=broker.host, port=broker.port, version=5, clean=False,
                           session_expiry=3600, backoff_min=0.1, backoff_max=1)

        def on_msg(m):
            with lock:
                got.append(int(bytes(m.payload)))

        collector.on_message = on_msg
        collector.connect()
        collector.subscribe("demo/#", 1)
        stop = threading.Event()

        def pump():
            while not stop.is_set():
                collector.loop(20)

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        env = {"MICROPYPATH": f".frozen:{ROOT / 'lib'}", "PATH": "/usr/bin:/bin"}
        device = subprocess.Popen(
            [micropython(), "-X", "heapsize=256k", str(ROOT / "firmware" / "demo_publisher.py"),
             broker.host, str(broker.port), str(n), "dev-1"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(device.stdout), daemon=True)
        reader.start()
        killed = False
        deadline = time.monotonic() + args.timeout
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      console=console) as progress:
            task = progress.add_task("messages received", total=n)
            while time.monotonic() < deadline:
                with lock:
                    unique = len(set(got))
                progress.update(task, completed=unique)
                if not killed and unique >= n * args.kill_at:
                    progress.console.print("[yellow]fault:[/] broker killed with SIGKILL, restarting on its "
                                           "persistence file")
                    broker.restart(hard=True)
                    killed = True
                if unique >= n and device.poll() is not None:
                    break
                time.sleep(0.05)
        device.wait(10) if device.poll() is None else None
        stop.set()
        t.join(2)
        collector.disconnect()
    reader.join(2)
    events = [json.loads(x[5:]) for x in lines if x.startswith("TERN ")]
    with lock:
        received = list(got)
    lost = sorted(set(range(n)) - set(received))
    dups = len(received) - len(set(received))
    last = {}
    for i, s in enumerate(received):
        last[s] = i
    finals = sorted(last, key=last.get)
    reordered = sum(1 for a, b in zip(finals, finals[1:]) if b < a)
    table = Table(title="Delivery (QoS 1, device on the MicroPython unix port)")
    for col in ("published", "received", "unique", "lost", "duplicated", "reordered", "broker restarts"):
        table.add_column(col, justify="right")
    table.add_row(str(n), str(len(received)), str(len(set(received))), str(len(lost)), str(dups),
                  str(reordered), "1" if killed else "0")
    console.print(table)
    done = [e for e in events if e.get("ev") == "done"]
    if done:
        console.print(f"device: {done[0]['published']} published, {done[0]['resent']} resent after reconnect")
    else:
        console.print("[red]the device did not finish:[/]\n" + "".join(lines[-20:]))
    # The promise is "nothing lost". Order is the device's to keep, and it does;
    # a broker that crashes can itself deliver a resent copy out of order.
    ok = not lost and bool(done) and killed
    console.print("[bold green]VERDICT: no QoS 1 message lost[/]" if ok
                  else f"[bold red]VERDICT: FAILED[/] lost={lost[:20]}")
    return 0 if ok else 1
