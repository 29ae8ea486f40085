"""Secrets the `tern` command must never print: one rule for every way a password arrives.

A password is registered the moment it is read -- `add_secret` for -P/--pw/--password (before argparse
runs: it may quote a value), `add_url_secrets` for a -L URL however malformed, `add_config_secrets` for
a config file (`tern deploy --config`, a fleet scenario's [firmware]), and the environment
(`TERN_FLEET_PASSWORD`: `env_password`, here so that the fleet and `tern collect` below it read it
alike) -- and `redact` masks every registered one. `guard_streams`
puts `redact` under everything the process writes as text to stdout and stderr (messages, logs,
progress lines, summaries, tables), so no path can forget it; files a command writes are built from
what it would print, or carry no password (a test greps every output of every command run with one).
"""

import os
import re
import sys

_SECRETS = set()
PASSWORD_ENV = "TERN_FLEET_PASSWORD"  # a fleet hands its child processes the broker's password here


def add_secret(value):
    """Register a value (a password) that must never appear in the CLI's output."""
    if value:
        _SECRETS.add(value)


def env_password():
    """The password a fleet handed its child process (PASSWORD_ENV; ternlab.fleet.login sets it), or
    None; registered as it is read."""
    password = os.environ.get(PASSWORD_ENV)
    add_secret(password)
    return password


def forget_secrets():
    """Forget every registered secret: for a process that runs one command after another (a test
    suite), where one command's password must not mask another's output."""
    _SECRETS.clear()


def add_url_secrets(url):
    """Register whatever may be a password in an mqtt(s):// URL, however malformed: the text after
    `user:` up to each `@` (a password holding '/' or '@' is cut short by a parser), and up to the
    first '/' (where a password without its '@' is read as the port)."""
    rest = url.partition("//")[2] if "//" in url else url
    head, colon, after = rest.partition(":")
    if not colon or "/" in head:  # no `user:` before the path
        return
    for i, ch in enumerate(after):
        if ch == "@":
            add_secret(after[:i])
    first = after.partition("/")[0].partition("@")[0]
    if "@" in after or not first.isdigit():  # host:PORT is no secret
        add_secret(first)


def add_config_secrets(obj):
    """Register every string under a key that names a password or a secret (`password`,
    `wifi_password`, `api_secret`...) in a config mapping, at any depth."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, str) and re.search(r"pass|secret|token", str(k), re.I):
                add_secret(v)
            else:
                add_config_secrets(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            add_config_secrets(v)


def redact(text):
    """text with every registered secret, and any long piece of one (argparse
    may quote part of a mistyped argument), replaced by '***' where it stands
    as a whole word or value: between spaces, quotes, brackets, commas, colons,
    slashes or '@', or after '=' (`-P p` must not turn `pub` into `***ub`)."""
    if not _SECRETS or not text:
        return text
    for s in sorted(_SECRETS, key=len, reverse=True):
        shortest = min(len(s), max(6, len(s) // 2))
        for n in range(min(len(s), len(text)), shortest - 1, -1):  # no piece longer than text
            for i in range(len(s) - n + 1):
                piece = s[i : i + n]
                if piece in text:
                    text = re.sub(r"(?<![^\s'\"=(\[,:/@])%s(?![^\s'\",)\]:/@])" % re.escape(piece), "***", text)
    return text


class _Redacting:
    """A text stream whose writes go through `redact` (everything else is the stream's own)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        return self._stream.write(redact(text) if isinstance(text, str) else text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def guard_streams():
    """Put `redact` under sys.stdout and sys.stderr's text writes (once). Bytes written to their
    binary buffers (what `tern sub` prints: the messages' payloads) are the user's data, as they came."""
    for name in ("stdout", "stderr"):
        s = getattr(sys, name)
        if s is not None and not isinstance(s, _Redacting):
            setattr(sys, name, _Redacting(s))
