"""Shared fixtures (`broker`, `broker_addr`, `chaos`, `board`, `fleet`) come from the tern pytest plugin,
host/ternlab/pytest_plugin.py, which installing tern registers (entry point ``pytest11: tern``).

A checkout whose editable install predates that entry point, or a run with plugin autoloading turned
off, still gets the plugin: it is then loaded from here. `pytester` is for the plugin's own tests
(tests/host/test_plugin*.py), which run inner pytest sessions.
"""

import os
import sys
from importlib.metadata import entry_points

import pytest

from tests.setup_check import DEBIAN_LIST, missing_programs, refusal

# The library unloads tern.handshake and tern.replay after each connect (a device's heap): a suite that
# connects thousands of times would compile them again at each load where no bytecode is cached
# (PYTHONDONTWRITEBYTECODE, as on this machine and CI: 4/5 of the model test's time). The suite caches it.
sys.dont_write_bytecode = False

_installed = any(ep.value in ("ternlab.pytest_tern", "ternlab.pytest_plugin") for ep in entry_points(group="pytest11"))
pytest_plugins = ["pytester"]
if not _installed or os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
    pytest_plugins.append("ternlab.pytest_plugin")


def pytest_configure(config):
    """Refuse to start, in one line naming what is missing and how to install it, when a program of
    tools/debian-packages.txt (what the suite runs: tests/host/test_setup.py) is not on this machine."""
    missing = missing_programs(os.environ.get("TERN_DEBIAN_LIST") or DEBIAN_LIST)
    if missing:
        raise pytest.UsageError(refusal(missing))


def pytest_collection_modifyitems(config, items):
    """Tests marked slow (scale runs of minutes) run only when asked for with -m (e.g. `-m slow`);
    a plain run deselects them, so `make test` keeps its pace. Each has a fast seeded sibling."""
    if config.getoption("markexpr"):
        return
    slow = [i for i in items if i.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [i for i in items if not i.get_closest_marker("slow")]
