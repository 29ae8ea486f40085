"""The telemetry app's config.json, checked on the host before `tern deploy` copies it to a board.

On the board a bad config never stops the app: firmware/app/tconfig.py reports each problem on the console
and runs on the default (no broker at all for a config MicroPython's json cannot read). Here the same
file is read by the same rules -- tconfig.load itself, imported from the firmware folder, its console
lines collected instead of printed, reading the file as MicroPython's json does (ternlab.boards.mpjson)
-- and a config the board would not run as written is refused, with JSON errors given by line and
column and an unknown key answered with the key it was likely meant to be. What the board would only
remark on (no host: readings stay in the outbox) is passed on as a note.

MicroPython's json skips commas and colons: a trailing comma is read as the file means (a note: other
JSON tools refuse it), while other slips it reads in its own way (a key left without its value
vanishes) are refused, with what the board would read.
"""

import difflib
import importlib.util
import json
import sys
import types
from pathlib import Path

from ..paths import device_dir
from .mpjson import loads as mp_loads


class ConfigError(ValueError):
    """config.json would not run as written; the message names each key and what is wrong."""


def _tconfig(said):
    """firmware/app/tconfig.py as a module whose console lines go to `said` (a list of dicts)."""
    hal = types.ModuleType("hal")
    hal.say = lambda ev, **kw: said.append(kw)
    spec = importlib.util.spec_from_file_location("tern_fw_tconfig", device_dir("app") / "tconfig.py")
    mod = importlib.util.module_from_spec(spec)
    saved = sys.modules.get("hal")
    sys.modules["hal"] = hal  # tconfig does `from hal import say`
    try:
        spec.loader.exec_module(mod)
    finally:
        if saved is None:
            del sys.modules["hal"]
        else:
            sys.modules["hal"] = saved
    mod.json = types.SimpleNamespace(load=lambda f: mp_loads(f.read()))  # the board's json, not CPython's
    return mod


def _trailing_commas(text):
    """text without the commas that stand right before a } or ] (outside strings), and the (line,
    column) of the first of them; (text, None) when there is none."""
    out, first = [], None
    i, n, in_str = 0, len(text), False
    while i < n:
        c = text[i]
        if in_str:
            if c == "\\":
                out.append(text[i:i + 2])
                i += 2
                continue
            in_str = c != '"'
        elif c == '"':
            in_str = True
        elif c == ",":
            j = i + 1
            while j < n and text[j] in " \t\r\n":
                j += 1
            if j < n and text[j] in "}]":
                if first is None:
                    first = (text.count("\n", 0, i) + 1, i - text.rfind("\n", 0, i))
                i += 1
                continue
        out.append(c)
        i += 1
    return "".join(out), first


def _shown(raw):
    """A config as the board would read it, for a message: secrets masked."""
    if isinstance(raw, dict):
        raw = {k: "***" if k in ("password", "wifi_password") and v is not None else v for k, v in raw.items()}
    return json.dumps(raw)


def _read(path, text):
    """(the value the board's json reads from text, notes); ConfigError when the file is not JSON and
    the board would read something other than what it seems to say."""
    try:
        return json.loads(text), []
    except json.JSONDecodeError as e:
        bad = e
    where = "%s line %d column %d" % (path, bad.lineno, bad.colno)
    try:
        board = mp_loads(text)
    except ValueError:
        raise ConfigError("%s: not valid JSON: %s (MicroPython's json cannot read it either: the board would "
                          "say so and run on defaults, with no broker)" % (where, bad.msg)) from None
    fixed, comma = _trailing_commas(text)
    try:
        meant = json.loads(fixed) if comma else None
    except json.JSONDecodeError:
        meant = None
    if comma and meant == board:
        return board, ["%s line %d column %d: a trailing comma: not valid JSON, but MicroPython's json accepts "
                       "it and the board uses the file's values (other JSON tools refuse it)" % ((path,) + comma)]
    raise ConfigError("%s: not valid JSON: %s. MicroPython's json skips commas and colons, so the board would "
                      "read it as %s: write valid JSON, so that what the board reads is what the file says"
                      % (where, bad.msg, _shown(board)))


def check(path, profile):
    """Notes (list of str) for config file `path` on a board of `profile` (a profile dict); ConfigError
    when the firmware would refuse part of it (a key's value, an unknown key) or could not read it."""
    path = Path(path)
    text = path.read_text(encoding="utf-8", errors="replace")
    raw, notes = _read(path, text)
    from ..mqttcli.redact import add_config_secrets

    add_config_secrets(raw)  # its passwords are never printed, whatever happens next
    if not isinstance(raw, dict):
        raise ConfigError("%s must hold a JSON object ({\"host\": ...}), not %s" % (path, type(raw).__name__))
    said = []
    tconfig = _tconfig(said)
    tconfig.load({k: v for k, v in profile.items() if not k.startswith("_")}, str(path))
    keys = [k for k, *_ in tconfig.SPEC]
    errors = []
    for m in said:
        key, err = m.get("key"), m.get("err", "")
        if key in raw and err == "unknown key, ignored":
            near = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
            errors.append("unknown key %r%s" % (key, " (did you mean %r?)" % near[0] if near else
                                                  " (the keys: firmware/app/config.example.json)"))
        elif key in raw and err.startswith("must be"):
            fix = _split(raw[key]) if key == "host" else ""
            got = "" if "got" not in m else " (got %s%s)" % (json.dumps(m["got"]), fix)
            errors.append("%s %s%s" % (key, err, got))
        else:
            notes.append("%s: %s" % (key, err) if key else err)
    if errors:
        raise ConfigError("%s: %s" % (path, "; ".join(errors)))
    return notes


def _split(host):
    """For a host given with its port ("127.0.0.1:18831"): the two keys it should have been."""
    name, sep, port = host.rpartition(":") if isinstance(host, str) and host.count(":") == 1 else ("", "", "")
    if sep and name and port.isdigit():
        return '; write "host": %s, "port": %d' % (json.dumps(name), int(port))
    return ""
