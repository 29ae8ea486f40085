"""Secrets the `tern` command must never print (passwords): `add_secret` registers
one, `redact` masks every registered one in a message. Every command's error
output goes through `redact`; option parsers register a password before
argparse can quote it."""

import re

_SECRETS = set()


def add_secret(value):
    """Register a value (a password) that must never appear in the CLI's output."""
    if value:
        _SECRETS.add(value)


def redact(text):
    """text with every registered secret, and any long piece of one (argparse
    may quote part of a mistyped argument), replaced by '***' where it stands
    as a whole word or value: between spaces, quotes, brackets or commas, or
    after '=' (`-P p` must not turn `pub` into `***ub`)."""
    for s in sorted(_SECRETS, key=len, reverse=True):
        shortest = min(len(s), max(6, len(s) // 2))
        for n in range(min(len(s), len(text)), shortest - 1, -1):  # no piece longer than text
            for i in range(len(s) - n + 1):
                piece = s[i : i + n]
                if piece in text:
                    text = re.sub(r"(?<![^\s'\"=(\[,])%s(?![^\s'\",)\]])" % re.escape(piece), "***", text)
    return text
