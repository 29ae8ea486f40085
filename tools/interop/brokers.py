"""The brokers of `make interop` (tools/interop/matrix.py): each started as a child process group of ours on
127.0.0.1, in a scratch folder, and stopped by its group id. Mosquitto, RabbitMQ with its MQTT plugin
and ejabberd's mod_mqtt come from Debian, aedes from npm (under build/interop/node_modules), amqtt from
PyPI (in .venv-interop); nothing is looked for until a broker starts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from ternlab.brokers.mosquitto import free_port, wait_port

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "interop"  # node_modules of aedes and MQTT.js
VENV = ROOT / ".venv-interop"  # amqtt, away from the main venv
HERE = ROOT / "tools" / "interop"


class _Process:
    """A broker run as a child process group of ours (stopped by its id, never by name)."""

    name = ""
    versions = (4, 5)
    username = None  # a broker that wants a user name
    start_s = 20.0

    def __init__(self, work: Path):
        self.work = work
        self.port = free_port()
        self.proc = None
        self.log = work / (self.name + ".log")

    def command(self) -> tuple[list[str], dict | None, Path | None]:
        raise NotImplementedError

    def version_text(self) -> str:
        return ""

    def start(self) -> "_Process":
        argv, env, cwd = self.command()
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        if not wait_port("127.0.0.1", self.port, self.start_s) or self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-1500:]
            self.stop()
            raise RuntimeError("%s did not start on 127.0.0.1:%d:\n%s" % (self.name, self.port, tail))
        return self

    def groups(self) -> list[int]:
        """The process groups to stop: ours, and any the broker's scripts made."""
        return [self.proc.pid]

    def stop(self) -> None:
        """Stop the whole process group (an Erlang node outlives the script that started it)."""
        p = self.proc
        if p is None:
            return
        groups = self.groups()
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
            for g in groups:
                try:
                    os.killpg(g, sig)
                except ProcessLookupError:
                    pass
            end = time.monotonic() + wait
            while time.monotonic() < end:
                p.poll()  # reap the leader
                if not any(_group_alive(g) for g in groups):
                    return
                time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    """A process of group pgid still runs (zombies left to a container's init do not count)."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(f[2]) == pgid and f[0] != "Z":
                return True
    return False


class Mosquitto(_Process):
    name = "Mosquitto"
    versions = (3, 4, 5)
    start_s = 10.0

    def command(self):
        conf = self.work / "mosquitto.conf"
        conf.write_text("listener %d 127.0.0.1\nallow_anonymous true\n" % self.port)
        return ["/usr/sbin/mosquitto", "-c", str(conf)], None, None

    def version_text(self):
        out = subprocess.run(["/usr/sbin/mosquitto", "-h"], capture_output=True, text=True).stdout
        return out.split("\n", 1)[0].replace("mosquitto version ", "")


class _Erlang(_Process):
    """RabbitMQ and ejabberd: Erlang nodes. Distribution on 127.0.0.1, through an epmd of our own."""

    epmd = None

    def env(self):
        return dict(os.environ, HOME=str(self.work), ERL_EPMD_ADDRESS="127.0.0.1", ERL_EPMD_PORT=str(_Erlang.epmd))


class RabbitMQ(_Erlang):
    name = "RabbitMQ"
    start_s = 90.0

    def command(self):
        w = self.work
        (w / "rabbitmq.conf").write_text(
            "listeners.tcp.default = 127.0.0.1:%d\nmqtt.listeners.tcp.default = 127.0.0.1:%d\n"
            "mqtt.allow_anonymous = true\nloopback_users = none\n" % (free_port(), self.port))
        (w / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        env = self.env()
        env.update(RABBITMQ_NODENAME="tern-interop-%d@localhost" % self.port, RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
                   RABBITMQ_DIST_PORT=str(free_port()), RABBITMQ_CONFIG_FILE=str(w / "rabbitmq.conf"),
                   RABBITMQ_ENABLED_PLUGINS_FILE=str(w / "enabled_plugins"), RABBITMQ_MNESIA_BASE=str(w / "mnesia"),
                   RABBITMQ_LOG_BASE=str(w / "log"), RABBITMQ_PID_FILE=str(w / "pid"),
                   RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}")
        return ["/usr/lib/rabbitmq/bin/rabbitmq-server"], env, w

    def version_text(self):
        return _dpkg_version("rabbitmq-server")


class Ejabberd(_Erlang):
    name = "ejabberd"
    username = "tern"  # anonymous login (login_anon) still wants a name: it becomes the JID
    start_s = 60.0

    def command(self):
        w = self.work / "ejabberd"
        for d in ("logs", "spool"):
            (w / d).mkdir(parents=True, exist_ok=True)
        (w / "ejabberd.yml").write_text(
            'hosts:\n  - "localhost"\nloglevel: info\nauth_method: [anonymous]\nanonymous_protocol: login_anon\n'
            'listen:\n  -\n    port: %d\n    ip: "127.0.0.1"\n    module: mod_mqtt\n    backlog: 1000\n'
            "modules:\n  mod_mqtt: {}\n" % self.port)
        subprocess.run(["chown", "-R", "ejabberd", str(w)], check=True)  # ejabberdctl runs the node as ejabberd
        for d in (w, self.work, self.work.parent):  # the node, run as ejabberd, reads its folder
            d.chmod(0o755)
        env = self.env()
        env.update(EJABBERD_PID_PATH=str(w / "ejabberd.pid"), EJABBERD_CONFIG_PATH=str(w / "ejabberd.yml"), LOGS_DIR=str(w / "logs"), SPOOL_DIR=str(w / "spool"),
                   CONFIG_DIR=str(w), EJABBERDCTL_CONFIG_PATH=str(w / "none.cfg"), INET_DIST_INTERFACE="127.0.0.1",
                   ERLANG_NODE="tern-interop-%d@localhost" % self.port)
        return ["/usr/sbin/ejabberdctl", "foreground"], env, w

    def groups(self):
        # ejabberdctl runs the node through su, in a session of its own: found by its pid file
        try:
            return [self.proc.pid, os.getpgid(int((self.work / "ejabberd" / "ejabberd.pid").read_text()))]
        except (OSError, ValueError):
            return [self.proc.pid]

    def version_text(self):
        return _dpkg_version("ejabberd")


class Aedes(_Process):
    name = "aedes"
    start_s = 15.0

    def command(self):
        shutil.copy(HERE / "aedes_broker.mjs", BUILD / "aedes_broker.mjs")  # ESM resolves beside its file
        return ["node", "aedes_broker.mjs", str(self.port)], None, BUILD

    def version_text(self):
        return _npm_version("aedes")


class Amqtt(_Process):
    name = "amqtt"
    start_s = 20.0

    def command(self):
        conf = self.work / "amqtt.yaml"
        conf.write_text("listeners:\n  default:\n    type: tcp\n    bind: 127.0.0.1:%d\nplugins:\n"
                        "  amqtt.plugins.authentication.AnonymousAuthPlugin:\n    allow_anonymous: true\n" % self.port)
        return [str(VENV / "bin" / "amqtt"), "-c", str(conf)], None, None

    def version_text(self):
        out = subprocess.run([str(VENV / "bin" / "pip"), "show", "amqtt"], capture_output=True, text=True).stdout
        return next((ln.split(": ", 1)[1] for ln in out.splitlines() if ln.startswith("Version: ")), "?")


# Sources kept beside the repository for machines that reach only the package registries
# (../shared/third_party/README.md); CI clones the repository with shared/ beside it.
THIRD_PARTY = ROOT.parent / "shared" / "third_party"
_STATEMENT = re.compile(r"\[(MQTT5?-[0-9.]+-[0-9]+)\]")


class PahoTest(_Process):
    """The Eclipse Paho test broker (paho.mqtt.testing): pure Python, MQTT 3.1.1 and 5.0 on one port, and
    strict: it checks what clients send against the specification's normative statements, logs each one
    it checks ([MQTT-x.y.z-n] at INFO) and each violation (at ERROR). Not packaged anywhere: it runs when
    its archive is in THIRD_PARTY, unpacked under build/interop, with the main venv's Python."""

    name = "Paho test broker"
    start_s = 30.0

    @staticmethod
    def archive():
        found = sorted(THIRD_PARTY.glob("paho.mqtt.testing-*.tar.gz"))
        return found[-1] if found else None

    @classmethod
    def absent(cls):
        """Why it cannot run here, or None."""
        if cls.archive() is None:
            return "not run: no paho.mqtt.testing-*.tar.gz in %s (the strict broker is not packaged)" % THIRD_PARTY
        return None

    def command(self):
        tar = self.archive()
        dest = BUILD / tar.name[: -len(".tar.gz")]
        if not (dest / "paho.mqtt.testing" / "interoperability" / "startbroker.py").exists():
            with tarfile.open(tar) as t:
                t.extractall(dest, filter="data")
        conf = self.work / "paho.conf"
        conf.write_text("loglevel debug\nlistener %d 127.0.0.1\n" % self.port)  # debug: INFO lines are the checks
        return [sys.executable, "startbroker.py", "-c", str(conf)], None, dest / "paho.mqtt.testing" / "interoperability"

    def version_text(self):
        tar = self.archive()
        return "(paho.mqtt.testing %s)" % tar.name[len("paho.mqtt.testing-"): -len(".tar.gz")] if tar else ""

    def mark(self) -> int:
        """Where the log ends now: violations() reads from here."""
        return self.log.stat().st_size if self.log.exists() else 0

    def violations(self, mark: int) -> tuple[list[str], list[str]]:
        """What the log says since mark: (violations, faults). A violation is an ERROR line (a client
        broke a rule the broker checks); a fault is an exception of the broker's own (its handler's
        catch-all, "WebSocketTCPHandler", with a traceback), named by the traceback's last line."""
        time.sleep(0.3)  # the broker handles the last packets on threads of its own
        with open(self.log, "rb") as f:
            f.seek(mark)
            lines = f.read().decode("utf-8", "replace").splitlines()
        bad, faults = [], []
        for i, ln in enumerate(lines):
            if not ln.startswith(("ERROR ", "CRITICAL ")):
                continue
            msg = ln.split(" ", 3)[-1]
            if msg == "WebSocketTCPHandler":
                tb = [x for x in lines[i + 1:i + 40] if x and not x.startswith((" ", "Traceback", "^"))]
                faults.append(tb[0] if tb else msg)
            else:
                bad.append(msg)
        return bad, faults

    def statements(self) -> list[str]:
        """Every normative statement the broker's log names, checked or broken."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return sorted(set(_STATEMENT.findall(text)), key=_statement_key)


def _statement_key(sid):
    head, _, n = sid.rpartition("-")
    return (head.startswith("MQTT5"), [int(x) for x in head.split("-", 1)[1].split(".")], int(n))


BROKERS = (Mosquitto, RabbitMQ, Ejabberd, Aedes, Amqtt, PahoTest)


def _dpkg_version(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True, text=True)
    return r.stdout.strip() or "?"


def _npm_version(pkg):
    try:
        return json.loads((BUILD / "node_modules" / pkg / "package.json").read_text())["version"]
    except OSError:
        return "?"
