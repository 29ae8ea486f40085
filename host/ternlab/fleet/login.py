"""TLS and credentials for a broker the team runs (``tern fleet run --broker HOST:PORT --cafile CA
-u USER -P PASSWORD``): one object that hands the same settings to every client the fleet starts --
the boards (their config.json), the observer and the collectors (child processes), and the settle
commands -- so that none of them is configured twice.

Why the password travels as it does: the boards keep it in their config.json on their own flash, as a
device does (the firmware never prints it); the child processes get it in their environment
(``TERN_FLEET_PASSWORD``), never in argv (``ps`` shows argv to every user of the machine); it is
registered with ``ternlab.mqttcli.redact`` so no error message quotes it; ``describe()`` is what the summary
and the fault log say of the broker, without it.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from ..mqttcli.redact import PASSWORD_ENV  # the fleet's children read it: redact.env_password

BOARD_CA = "fleet-ca.pem"  # the CA file's name on each board's filesystem


class LoginError(ValueError):
    """A TLS or credential setting the fleet cannot use; the message names the flag, never a password."""


class BrokerLogin:
    """cafile: CA certificates (PEM) to verify the broker with (TLS on); user, password: MQTT login."""

    def __init__(self, cafile: str | None = None, user: str | None = None, password: str | None = None):
        from ..mqttcli.redact import add_secret

        if password is not None and user is None:
            raise LoginError("-P/--pw needs --username (-u): a password is only sent with a user name")
        if cafile is not None:
            p = Path(cafile)
            if not p.is_file():
                raise LoginError(f"--cafile {cafile}: no such file")
            self.ca_pem = p.read_bytes()
            try:
                ssl.create_default_context(cadata=self.ca_pem.decode("ascii", "replace"))
            except ssl.SSLError as e:
                raise LoginError(f"--cafile {cafile}: not a PEM CA certificate ({e.reason or e})") from None
        else:
            self.ca_pem = None
        self.cafile = str(Path(cafile).resolve()) if cafile else None
        self.user, self.password = user, password
        if password:
            add_secret(password)

    @property
    def tls(self) -> bool:
        return self.cafile is not None

    def describe(self) -> str:
        """What the logs may say: TLS or not, the user name, whether a password was given."""
        return ", ".join(["TLS verified with " + self.cafile if self.tls else "plain MQTT"] +
                         ([f"user {self.user}" + (" with a password" if self.password else "")] if self.user else []))

    def client_kwargs(self) -> dict:
        """Keyword arguments of tern.client.Client (the settle commands, the observer)."""
        kw = {}
        if self.tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # chain and host name verified
            ctx.load_verify_locations(cadata=self.ca_pem.decode("ascii"))  # the CA file's text: a Spark
            # worker that runs a slice need not have the file
            kw["ssl"] = ctx
        if self.user is not None:
            kw["username"] = self.user
        if self.password is not None:
            kw["password"] = self.password.encode()
        return kw

    def collect_args(self) -> list[str]:
        """`tern collect` flags (the password goes by child_env)."""
        return (["--cafile", self.cafile] if self.tls else []) + (["-u", self.user] if self.user is not None else [])

    def child_env(self) -> dict:
        env = dict(os.environ)
        env.pop(PASSWORD_ENV, None)
        if self.password is not None:
            env[PASSWORD_ENV] = self.password
        return env

    def firmware(self, board) -> dict:
        """The board's config.json keys; the CA is written to the board's filesystem."""
        cfg = {"user": self.user, "password": self.password}
        if self.tls:
            board.write_file(BOARD_CA, self.ca_pem.decode("ascii"))
            cfg.update(tls=True, ca=BOARD_CA)
        return cfg

