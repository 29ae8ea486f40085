"""The telemetry app's config.json, checked on the host before `tern deploy` copies it to a board.

On the board a bad config never stops the app: device/app/tconfig.py reports each problem on the console
and runs on the default (no broker at all for a config that is not JSON). Here the same file is read
by the same rules -- tconfig.load itself, imported from the firmware folder, its console lines
collected instead of printed -- and a config the board would not run as written is refused, with
JSON errors given by line and column and an unknown key answered with the key it was likely meant to
be. What the board would only remark on (no host: readings stay in the outbox) is passed on as a note.
"""

import difflib
import importlib.util
import json
import sys
import types
from pathlib import Path

from ..paths import device_dir


class ConfigError(ValueError):
    """config.json would not run as written; the message names each key and what is wrong."""


def _tconfig(said):
    """device/app/tconfig.py as a module whose console lines go to `said` (a list of dicts)."""
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
    return mod


def check(path, profile):
    """Notes (list of str) for config file `path` on a board of `profile` (a profile dict); ConfigError
    when the firmware would refuse part of it (a key's value, an unknown key) or could not read it."""
    path = Path(path)
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError("%s line %d column %d: not valid JSON: %s (the board would run on defaults, with no "
                          "broker)" % (path, e.lineno, e.colno, e.msg)) from None
    from ..mqttcli.redact import add_config_secrets

    add_config_secrets(raw)  # its passwords are never printed, whatever happens next
    if not isinstance(raw, dict):
        raise ConfigError("%s must hold a JSON object ({\"host\": ...}), not %s" % (path, type(raw).__name__))
    said = []
    tconfig = _tconfig(said)
    tconfig.load({k: v for k, v in profile.items() if not k.startswith("_")}, str(path))
    keys = [k for k, *_ in tconfig.SPEC]
    errors, notes = [], []
    for m in said:
        key, err = m.get("key"), m.get("err", "")
        if key in raw and err == "unknown key, ignored":
            near = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
            errors.append("unknown key %r%s" % (key, " (did you mean %r?)" % near[0] if near else
                                                  " (the keys: device/app/config.example.json)"))
        elif key in raw and err.startswith("must be"):
            got = "" if "got" not in m else " (got %s)" % json.dumps(m["got"])
            errors.append("%s %s%s" % (key, err, got))
        else:
            notes.append("%s: %s" % (key, err) if key else err)
    if errors:
        raise ConfigError("%s: %s" % (path, "; ".join(errors)))
    return notes
