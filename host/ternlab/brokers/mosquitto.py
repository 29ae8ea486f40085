"""The reference broker: Eclipse Mosquitto 2.x started from a generated config,
bound to 127.0.0.1 only, stopped, killed or restarted on demand.

The generated config covers what the tests need: persistence, the per-client
limits (max_inflight_messages, max_queued_messages, message_size_limit), a TLS
listener with certificates the harness makes (see ternlab.brokers.certs), a password
file, and extra listeners (`Listener`, e.g. a second plain port or WebSockets).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

INSTALL_HINT = "sudo apt-get update && sudo apt-get install -y mosquitto"


class BrokerError(RuntimeError):
    """Mosquitto is missing or would not start; the message says what to do."""


def mosquitto_path(explicit: str | os.PathLike | None = None) -> str:
    """The mosquitto executable: `explicit` if given, else found on PATH or in sbin."""
    if explicit is not None:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return str(explicit)
        raise BrokerError(f"mosquitto is not installed at {explicit}. Install it with: " + INSTALL_HINT)
    for cand in (shutil.which("mosquitto"), "/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise BrokerError("mosquitto is not installed. Install it with: " + INSTALL_HINT)


def password_line(username: str, password: str, *, iterations: int = 101) -> str:
    """One line of a mosquitto 2.x password file ("$7$": PBKDF2-HMAC-SHA512, the
    format `mosquitto_passwd -b` writes), so no extra tool is needed."""
    _check_credential("username", username)
    _check_credential("password", password, allow_colon=True)
    salt = os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    return "%s:$7$%d$%s$%s" % (username, iterations, base64.b64encode(salt).decode(),
                                base64.b64encode(digest).decode())


def _check_credential(what: str, value: str, allow_colon: bool = False) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a str, not {type(value).__name__}")
    if what == "username" and not value:
        raise ValueError("username must not be empty")
    if "\n" in value or "\r" in value or "\0" in value:
        raise ValueError(f"{what} {value!r} must not contain a newline or NUL")
    if not allow_colon and ":" in value:
        raise ValueError(f"username {value!r} must not contain ':' (the password file separator)")


_BINDING = ("listener", "port", "bind_address", "bind_interface")
# lines that bring in config or code this check never sees (a listener in an included file, a plugin)
_INDIRECT = ("include_dir", "plugin", "auth_plugin", "global_plugin")


def _check_loopback(where: str, lines) -> None:
    """Test brokers listen on 127.0.0.1 only: refuse a verbatim config line that would open a port
    elsewhere (`listener N` with no address binds every interface, as do `port` and a bind_*) or that
    loads config or code from elsewhere. A value holding newlines is checked line by line, as
    Mosquitto reads it; other control characters are refused."""
    for value in lines:
        for line in str(value).split("\n"):
            if any(c < " " and c != "\t" or c == "\x7f" for c in line):
                raise ValueError(f"{where} line {line!r}: a control character in a config line "
                                 "(test brokers listen on 127.0.0.1 only)")
            words = line.split()
            key = words[0].lower() if words else ""
            if key in _INDIRECT:
                raise ValueError(f"{where} line {line!r}: {key} loads what this check cannot see "
                                 "(test brokers listen on 127.0.0.1 only)")
            if key in _BINDING and not (key == "listener" and words[2:] == ["127.0.0.1"]):
                raise ValueError(f"{where} line {line!r}: test brokers listen on 127.0.0.1 only "
                                 "(use `listener PORT 127.0.0.1`, or Listener())")


def _check_port(name: str, port) -> None:
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
        raise ValueError(f"{name} must be a port number 1..65535, not {port!r}")


@dataclass
class Listener:
    """An extra listener on 127.0.0.1 (mosquitto's `listener` block).

    port: None picks a free port when the Broker is made (kept across restarts).
    protocol: "mqtt" or "websockets" (the Debian build of mosquitto 2.0.11
        has no WebSockets support and refuses to start with one).
    tls: serve TLS with the broker's generated server certificate.
    require_certificate: with tls, clients must present a certificate signed
        by the broker's CA (make one with ternlab.brokers.certs.make_cert(broker.ca, ...)).
    options: further lines for this listener block, verbatim.

    Mosquitto has no per-listener (or global) setting that restricts the MQTT
    protocol version: every listener speaks 3.1, 3.1.1 and 5.0. `protocol` here
    is the transport. A test that needs a server refusing a version must use the
    scripted broker or the chaos proxy instead.
    """

    port: int | None = None
    protocol: str = "mqtt"
    tls: bool = False
    require_certificate: bool = False
    options: tuple[str, ...] | list[str] = field(default_factory=tuple)

    def __post_init__(self):
        _check_port("Listener port", self.port)
        if self.protocol not in ("mqtt", "websockets"):
            raise ValueError(f"Listener protocol must be 'mqtt' or 'websockets', not {self.protocol!r}")
        if self.require_certificate and not self.tls:
            raise ValueError("require_certificate needs tls=True")
        self.options = tuple(self.options)
        _check_loopback("Listener option", self.options)


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

    persistence: keep sessions and queued messages across restarts. The
        database is saved after every change, but mosquitto acknowledges first
        and saves a few milliseconds later in the same loop iteration: a
        `kill()` inside that window loses what was just acknowledged. A test
        that means to kill after the save takes `save_mark()` before the action
        and calls `wait_saved(mark)` after it.
    max_inflight_messages: QoS 1/2 messages in flight to one MQTT 3.x client
        at a time (an MQTT 5 client's Receive Maximum takes precedence).
    max_queued_messages: QoS 1/2 messages kept for one client beyond those in
        flight (offline persistent sessions included); newer ones are dropped.
    message_size_limit: largest PUBLISH payload accepted; a larger one is
        dropped (still acknowledged to an MQTT 3.x publisher, as mosquitto does).
    tls: also listen with TLS on `tls_port` (a free port unless given), with a
        CA and a server certificate for 127.0.0.1 / localhost generated into
        workdir on first start; clients verify with `ca_path`.
    users: {username: password}; writes a password file and, unless
        allow_anonymous is given, turns anonymous access off.
    allow_anonymous: default True without users, False with them.
    listeners: extra `Listener`s (further ports, TLS with client certificates,
        WebSockets). Mosquitto cannot restrict the MQTT version per listener:
        see `Listener`.
    log_packets: log every packet (mosquitto's `log_type all`, what tests read back); False keeps
        connections, subscriptions and errors only: a large fleet's packets would be most of the
        broker's work.
    autosave_seconds: None saves the database after every change (a kill loses at most what was
        acknowledged in the last few milliseconds); N saves every N seconds (a kill loses up to N s
        of acknowledged state): a large fleet's broker would otherwise rewrite its whole database
        for every message. save() saves now, before a planned kill.
    extra: further mosquitto.conf lines, appended verbatim.
    binary: the mosquitto executable (default: found on PATH or in sbin).

    All ports are fixed when the Broker is made, so restart() comes back on the
    same ones with the same persistence file and certificates.
    """

    host = "127.0.0.1"

    def __init__(self, workdir: str | os.PathLike | None = None, *, port: int | None = None,
                 persistence: bool = False, max_inflight_messages: int | None = None,
                 max_queued_messages: int | None = None, message_size_limit: int | None = None,
                 extra: list[str] | None = None, tls: bool = False, tls_port: int | None = None,
                 users: dict[str, str] | None = None, allow_anonymous: bool | None = None,
                 listeners: list[Listener] | None = None, log_packets: bool = True,
                 autosave_seconds: int | None = None,
                 binary: str | os.PathLike | None = None):
        _check_port("port", port)
        _check_port("tls_port", tls_port)
        if tls_port is not None and not tls:
            raise ValueError("tls_port given without tls=True")
        self.limits = {
            "max_inflight_messages": max_inflight_messages,
            "max_queued_messages": max_queued_messages,
            "message_size_limit": message_size_limit,
        }
        for key, value in self.limits.items():
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{key} must be a non-negative int (0 = no limit), not {value!r}")
        if users is not None:
            if not isinstance(users, dict):
                raise ValueError("users must be a dict {username: password}")
            for name, pw in users.items():
                _check_credential("username", name)
                _check_credential("password", pw, allow_colon=True)
        for spec in listeners or ():
            if not isinstance(spec, Listener):
                raise ValueError(f"listeners must be Listener objects, not {spec!r}")
        _check_loopback("extra", extra or ())
        if autosave_seconds is not None and (not isinstance(autosave_seconds, int) or isinstance(autosave_seconds, bool)
                                             or autosave_seconds < 1):
            raise ValueError(f"autosave_seconds must be a positive int or None, not {autosave_seconds!r}")
        self.log_packets = log_packets
        self.autosave_seconds = autosave_seconds
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="tern-broker-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.persistence = persistence
        self.extra = list(extra or [])
        self.tls = tls
        self.tls_port = (tls_port or free_port()) if tls else None
        self.users = dict(users) if users is not None else None
        self.allow_anonymous = (not users) if allow_anonymous is None else bool(allow_anonymous)
        self.listeners = [replace(spec, port=spec.port or free_port()) for spec in (listeners or ())]
        self.binary = binary
        self.proc: subprocess.Popen | None = None
        self.conf_path = self.workdir / "mosquitto.conf"
        self.log_path = self.workdir / "mosquitto.log"
        self.passwd_path = self.workdir / "passwd"
        self.ca = None  # ternlab.brokers.certs.CA once TLS material exists
        self.server_cert = None

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def tls_address(self) -> tuple[str, int]:
        if not self.tls:
            raise BrokerError("this broker has no TLS listener (make it with tls=True)")
        return (self.host, self.tls_port)

    @property
    def ca_path(self) -> Path:
        """The generated CA certificate clients verify the broker with."""
        self._ensure_certs()
        return self.ca.cert_path

    def _needs_tls(self) -> bool:
        return self.tls or any(spec.tls for spec in self.listeners)

    def _ensure_certs(self) -> None:
        if not self._needs_tls():
            raise BrokerError("this broker has no TLS listener (make it with tls=True)")
        if self.ca is None:
            from . import certs
            d = self.workdir / "tls"
            self.ca = certs.make_ca(d, "Tern test broker CA")
            self.server_cert = certs.make_cert(self.ca, d, "server", hosts=(self.host, "localhost"))

    def _tls_lines(self, require_certificate: bool = False) -> list[str]:
        self._ensure_certs()
        return [
            f"cafile {self.ca.cert_path}",
            f"certfile {self.server_cert.cert_path}",
            f"keyfile {self.server_cert.key_path}",
            f"require_certificate {'true' if require_certificate else 'false'}",
        ]

    def config(self) -> str:
        lines = [
            f"listener {self.port} {self.host}",
            f"allow_anonymous {'true' if self.allow_anonymous else 'false'}",
            f"log_dest file {self.log_path}",
        ] + (["log_type all"] if self.log_packets else
             [f"log_type {t}" for t in ("error", "warning", "notice", "information", "subscribe", "unsubscribe")]) + [
            "connection_messages true",
            "log_timestamp_format %Y-%m-%dT%H:%M:%S",
        ]
        if os.geteuid() == 0:
            lines.append("user root")  # otherwise mosquitto drops to a user who cannot write here
        if self.persistence:
            lines += [
                "persistence true",
                f"persistence_location {self.workdir}/",
            ] + (["autosave_on_changes true", "autosave_interval 1"] if self.autosave_seconds is None else
                 ["autosave_on_changes false", f"autosave_interval {self.autosave_seconds}"])
        else:
            lines.append("persistence false")
        for key, value in self.limits.items():
            if value is not None:
                lines.append(f"{key} {value}")
        if self.users is not None:
            lines.append(f"password_file {self.passwd_path}")
        if self.tls:
            lines += [f"listener {self.tls_port} {self.host}", "protocol mqtt"] + self._tls_lines()
        for spec in self.listeners:
            lines += [f"listener {spec.port} {self.host}", f"protocol {spec.protocol}"]
            if spec.tls:
                lines += self._tls_lines(spec.require_certificate)
            lines += list(spec.options)
        lines += self.extra
        return "\n".join(lines) + "\n"

    def _write_passwd(self) -> None:
        if self.users is None:
            return
        text = "".join(password_line(u, pw) + "\n" for u, pw in self.users.items())
        fd = os.open(self.passwd_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)

    def start(self, timeout: float = 10.0) -> "Broker":
        if self.proc and self.proc.poll() is None:
            return self
        exe = mosquitto_path(self.binary)
        self.conf_path.write_text(self.config())
        self._write_passwd()
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.workdir / "stderr.log", "ab") as err:
            self.proc = subprocess.Popen([exe, "-c", str(self.conf_path)],
                                         stdout=subprocess.DEVNULL, stderr=err)
        ports = [self.port] + ([self.tls_port] if self.tls else []) + [s.port for s in self.listeners]
        deadline = time.monotonic() + timeout
        # A port that answers may belong to someone else: wait for this process
        # to log that it runs (it does so once every listener is open).
        ok = False
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self._logged_running(log_start):
                ok = all(wait_port(self.host, p, max(0.0, deadline - time.monotonic())) for p in ports)
                break
            time.sleep(0.01)
        if not ok or self.proc.poll() is not None:
            self.kill()
            hint = ""
            if any(s.protocol == "websockets" for s in self.listeners):
                hint = "\n(a WebSockets listener needs a mosquitto built with WebSockets support)"
            raise BrokerError(f"mosquitto did not start on {self.host}:{ports}:\n{self.log_tail()}{hint}")
        return self

    def _logged_running(self, offset: int) -> bool:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return b" running" in f.read()
        except FileNotFoundError:
            return False

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
        mosquitto_path(self.binary)  # a missing binary is not worth retrying
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the old socket may linger briefly
            try:
                return self.start()
            except BrokerError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)
        return self

    @property
    def db_path(self) -> Path:
        """mosquitto's persistence file (mosquitto.db in workdir)."""
        return self.workdir / "mosquitto.db"

    def save_mark(self):
        """An opaque marker of the persistence file's current state, for wait_saved()."""
        try:
            st = self.db_path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def save(self, timeout: float = 10.0) -> None:
        """Have mosquitto write its persistence file now (SIGUSR1) and wait until it has."""
        if not self.running():
            raise BrokerError("the broker is not running")
        mark = self.save_mark()
        self.proc.send_signal(signal.SIGUSR1)
        self.wait_saved(mark, timeout)

    def wait_saved(self, mark, timeout: float = 5.0) -> None:
        """Wait until mosquitto has written its persistence file since `mark`
        (from save_mark()); BrokerError if it does not within timeout."""
        if not self.persistence:
            raise BrokerError("this broker has no persistence (make it with persistence=True)")
        deadline = time.monotonic() + timeout
        while self.save_mark() == mark:
            if time.monotonic() >= deadline:
                raise BrokerError(f"mosquitto did not save {self.db_path} within {timeout} s:\n{self.log_tail()}")
            time.sleep(0.005)

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
