"""The argv pre-pass of `tern pub` / `tern sub`: makes argparse read the
arguments the way mosquitto does, and registers passwords as secrets before
argparse can quote them."""

from .flags import PASSWORD_FLAGS
from .properties import SEP
from .redact import add_secret, add_url_secrets


# Options that take a value, for the argv pre-pass below.
_VALUE_SHORT = set("hptmfqiIkVuPxCWFDL")
_VALUE_LONG = {"--host", "--port", "--topic", "--message", "--file", "--qos", "--id", "--id-prefix", "--url",
               "--outbox", "--keepalive", "--protocol-version", "--username", "--pw", "--session-expiry-interval",
               "--will-topic", "--will-payload", "--will-qos", "--cafile", "--capath", "--cert",
               "--key", "--repeat", "--repeat-delay", "--property"}
_FLAG_SHORT = set("lnsrcdvNRE")


def prepare_argv(argv):
    """Make argparse read pub/sub arguments the way mosquitto does.

    mosquitto's -D takes 3 words, or 4 for user-property, and argparse wants a
    fixed count: each -D's words are joined into one value (split again
    later). An option's value is taken as it is even when it starts with '-'
    (`-m -5`, `-P -secret`): it is written `-m=-5` for argparse. Clusters of
    short flags (`-rq1`, `-dv`) are split. Password values are registered
    with ternlab.mqttcli.redact.add_secret so no error message can show them.
    """
    out = []
    i = 0
    n = len(argv)
    while i < n:
        a = argv[i]
        i += 1
        if a == "--" or not a.startswith("-") or len(a) < 2:
            if a == "--":
                out += argv[i - 1 :]
                break
            out.append(a)
            continue
        if a in ("-D", "--property"):
            k = 4 if i + 1 < n and argv[i + 1].lower() == "user-property" else 3
            words = argv[i : i + k]
            i += len(words)
            out.append(a + "=" + SEP.join(words) if words else a)
            continue
        if a.startswith("--"):
            name, eq, val = a.partition("=")
            if not eq and name in _VALUE_LONG and i < n:
                val = argv[i]
                i += 1
                a = name + "=" + val
                eq = "="
            if eq and name in PASSWORD_FLAGS:
                add_secret(val)
            elif eq and name == "--url":
                add_url_secrets(val)
            out.append(a)
            continue
        # one short option or a cluster of them: -r, -q1, -rq 1, -dv
        body = a[1:]
        parts = []
        ok = True
        for j, c in enumerate(body):
            if c in _FLAG_SHORT:
                parts.append("-" + c)
                continue
            if c in _VALUE_SHORT:
                val = body[j + 1 :]
                if not val:
                    if i >= n:
                        parts.append("-" + c)  # argparse says a value is missing
                        break
                    val = argv[i]
                    i += 1
                if c == "P":
                    add_secret(val)
                elif c == "L":
                    add_url_secrets(val)
                parts.append("-" + c + "=" + val)
                break
            ok = False  # not one of ours: leave the token to argparse
            break
        out += parts if ok else [a]
    return out
