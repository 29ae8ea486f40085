"""Installing Tern the way its users do (issue 16): the two wheels built from this checkout, installed
into a fresh virtual environment (no system site-packages; pip may reuse its cache), work without
the checkout: `tern-mqtt` alone gives `import tern` and nothing else and publishes to Mosquitto; with
`ternlab` the `tern` command finds its board profiles, device code and scenarios as package data and runs
a fleet on the bundled smoke scenario."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MOSQ_SUB = "/usr/bin/mosquitto_sub"


def run(cmd, cwd, timeout=240, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "MICROPYPATH")}
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, **kw)
    assert r.returncode == 0, "%s failed (%d):\n%s\n%s" % (cmd, r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    return r.stdout


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """Both wheels, built from a copy of what the two distributions are made of (a build writes
    into its source tree)."""
    tmp = tmp_path_factory.mktemp("pkg")
    src, out = tmp / "src", tmp / "wheels"
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "*.mpy", "build", "*.egg-info")
    for name in ("lib", "host", "boards", "firmware", "scenarios"):
        shutil.copytree(ROOT / name, src / name, ignore=junk)
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(ROOT / name, src / name)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, src / "lib", src], cwd=tmp)
    return tmp, out


def venv(where):
    run([sys.executable, "-m", "venv", where], cwd=where.parent)
    return where / "bin"


def test_the_library_wheel_installs_alone_and_publishes(wheels, broker):
    tmp, out = wheels
    bin_ = venv(tmp / "lib-venv")
    run([bin_ / "pip", "install", "-q", "--no-index", "--find-links", out, "tern-mqtt"], cwd=tmp)
    installed = {d.split("==")[0] for d in run([bin_ / "pip", "list", "--format=freeze"], cwd=tmp).split()}
    assert installed - {"pip", "setuptools"} == {"tern-mqtt"}  # zero dependencies
    code = ("import sys, tern; from tern.client import Client\n"
            "assert '/lib-venv/' in tern.__file__, tern.__file__\n"
            "c = Client('wheel-pub', server=sys.argv[1], port=int(sys.argv[2]))\n"
            "c.connect(); c.wait_published(c.publish('wheel/lib', b'from the wheel', qos=1, retain=True)); c.disconnect()\n")
    run([bin_ / "python", "-c", code, broker.host, broker.port], cwd=tmp, timeout=60)
    got = run([MOSQ_SUB, "-h", broker.host, "-p", broker.port, "-t", "wheel/lib", "-C", "1", "-W", "10"], cwd=tmp)
    assert got == "from the wheel\n"


def test_the_harness_wheel_runs_a_fleet_from_the_installed_copy(wheels, broker):
    tmp, out = wheels
    bin_ = venv(tmp / "lab-venv")
    run([bin_ / "pip", "install", "-q", "--find-links", out, "ternlab"], cwd=tmp, timeout=600)
    where = json.loads(run([bin_ / "python", "-c", "import json, tern, ternlab.paths as p, ternlab.boards as b; "
                            "print(json.dumps([tern.__file__, str(p.project_dir('boards')), b.profile_names()]))"],
                           cwd=tmp))
    assert all("/lab-venv/" in w for w in where[:2]), where  # nothing from the checkout
    assert "unix-emulated" in where[2]
    run([bin_ / "tern", "pub", "-h", broker.host, "-p", broker.port, "-t", "wheel/cli", "-m", "hi", "-q", "1", "-r"],
        cwd=tmp, timeout=60)
    assert run([MOSQ_SUB, "-h", broker.host, "-p", broker.port, "-t", "wheel/cli", "-C", "1", "-W", "10"], cwd=tmp) == "hi\n"
    res = run([bin_ / "tern", "fleet", "run", "smoke", "--seed", "1", "--quiet", "--out", tmp / "fleet"], cwd=tmp,
              timeout=300)
    assert "fleet ok seed=1" in res
