"""What the `tern` command says about its own installation names the distributions that exist: the
harness is `ternlab` and the library `tern-mqtt` (both in this repository's pyproject files); `tern` on
PyPI is an unrelated project, so a hint naming it would install the wrong thing."""

import re
import subprocess
import sys
import tomllib
from importlib.metadata import distribution
from pathlib import Path

from ternlab import cli

ROOT = Path(__file__).resolve().parents[2]


def project(path):
    return tomllib.loads(path.read_text())["project"]


def test_every_install_hint_names_an_extra_of_the_harness_distribution():
    harness = project(ROOT / "pyproject.toml")
    hints = [hint for _, _, hint in cli.OPTIONAL if hint]
    assert hints, "the pipeline commands carry an install hint"
    for hint in hints:
        m = re.fullmatch(r"pip install '([\w-]+)\[(\w+)\]'", hint)
        assert m, hint
        assert m.group(1) == harness["name"] == "ternlab", hint
        assert m.group(2) in harness["optional-dependencies"], hint


def test_version_is_the_installed_harness_distributions():
    harness = project(ROOT / "pyproject.toml")
    library = project(ROOT / "lib" / "pyproject.toml")
    assert library["name"] == "tern-mqtt" and harness["name"] == "ternlab"
    # the installed `tern` script belongs to the harness distribution, and says its version
    assert any(e.name == "tern" for e in distribution("ternlab").entry_points)
    out = subprocess.run([sys.executable, "-m", "ternlab.cli", "--version"], capture_output=True, text=True,
                         check=True).stdout
    assert out == "tern %s\n" % distribution("ternlab").version
    assert distribution("ternlab").version == harness["version"]
