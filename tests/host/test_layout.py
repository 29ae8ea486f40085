"""The shape of the code, checked statically (no import runs): no import cycle among the modules of
lib/tern and host/ternlab, and none among the rooms of host/ternlab (its packages and top-level
modules: each imports only rooms below it, lazy imports inside functions included), nothing in the
library importing the harness, nothing importing the `tern`
command's entry point (ternlab.cli) but the entry point itself, and no module over its size limit
(host 700 lines, library 1,000, lib/tern/session.py 1,200) without a reason written at its top."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = {"tern": ROOT / "lib" / "tern", "ternlab": ROOT / "host" / "ternlab"}
LIMITS = {"tern": 1000, "ternlab": 700}  # lines, per tree
LIMIT_OF = {"tern/session.py": 1200}  # the protocol engine: one class on the steady path
REASON = re.compile(r"Over [\d,]+ lines because")  # starts a line of a long module's first 10 lines
# Long modules whose split is another change (each must still be long and without a reason: the list
# shrinks as they are split or give their reason).
# Cycles another change of issue 19 (item 5: the emulated board's modules) takes apart; any other cycle fails.
PENDING_CYCLES = []
PENDING_SPLIT = set()


def modules():
    """{dotted name: path} of every module of both trees."""
    out = {}
    for top, base in TREES.items():
        for path in sorted(base.rglob("*.py")):
            parts = [top, *path.relative_to(base).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports(name, path, known):
    """The modules of `known` that the module `name` imports, anywhere in its body (function-level
    imports too: a cycle through a lazy import is still a cycle of the design)."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            targets = [mod] + ["%s.%s" % (mod, a.name) for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import tern.client` -> tern.client; a name -> its module
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def graph():
    known = modules()
    return {n: imports(n, p, known) for n, p in known.items()}


def cycles(g):
    """Every strongly connected component with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_checker_sees_a_cycle_and_a_package_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    g = graph()
    assert "ternlab.mqttcli.redact" in g["ternlab.mqttcli.argv"]  # from .secrets import add_secret
    assert "ternlab.mqttcli.connect" in g["ternlab.mqttcli.sub"]  # from . import connect
    assert "ternlab.mqttcli.redact" in g["ternlab.pipeline.collect_cli"]  # from ..secrets import add_secret
    assert "tern.codec" in g["ternlab.mqttcli.packet_trace"]


def test_no_import_cycle():
    assert cycles(graph()) == PENDING_CYCLES


def room(name):
    """The room a module stands in: a package of host/ternlab (ternlab.fleet, ternlab.boards, ...) or a
    top-level module of it; each module of the flat library is a room of its own."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "ternlab" else name


def rooms(g):
    """The module graph folded into rooms: room -> the other rooms its modules import (lazy imports,
    inside functions, included: they run up the layers as much as a top-level one)."""
    out = {}
    for name, deps in g.items():
        out.setdefault(room(name), set()).update(room(d) for d in deps if room(d) != room(name))
    return out


def test_the_checker_sees_a_lazy_import_that_runs_back_up():
    """Rooms that import each other, even through a function-level import of one module and a
    top-level one of another, are a cycle: one of the two arrows runs back up the layers."""
    g = {"ternlab.boards.qemu": {"ternlab.firmware"}, "ternlab.firmware": {"ternlab.boards.board"},
         "ternlab.boards.board": set(), "ternlab.pipeline.cli": {"ternlab.fleet.login"},
         "ternlab.fleet.runner": {"ternlab.pipeline.audit"}, "ternlab.fleet.login": set(), "ternlab.pipeline.audit": set()}
    assert cycles(g) == []  # no module imports itself back
    assert cycles(rooms(g)) == [["ternlab.boards", "ternlab.firmware"], ["ternlab.fleet", "ternlab.pipeline"]]
    lazy = "def f():\n    from ..fleet import login\n"
    assert "ternlab.fleet.login" in imports("ternlab.pipeline.x", _Source(lazy), modules())


class _Source:
    """A stand-in path for imports(): its text, under a module's file name."""

    name = "x.py"

    def __init__(self, text):
        self.text = text

    def read_text(self):
        return self.text

    def __str__(self):
        return self.name


def test_rooms_form_layers():
    """The rooms of host/ternlab (its packages and top-level modules) stand on floors: each imports
    only rooms below it, at the top of a module or inside a function alike. A lower room that needs a
    higher one's helper takes the helper down (the fleet's password variable lives in
    mqttcli.redact, below both the fleet and `tern collect`; the firmware build sits in boards/)."""
    assert cycles(rooms(graph())) == []


def test_imports_point_down():
    g = graph()
    for name, deps in g.items():
        if name.startswith("tern."):
            assert not [d for d in deps if d.startswith("ternlab")], name  # the library never uses the harness
        up = {"ternlab.cli"} & deps
        assert not up or name == "ternlab.cli", "%s imports the `tern` command itself" % name


def too_long(key, text):
    """None, or why the module `key` (tree/path) is too long: over its limit with no line in its first
    10 that starts with "Over N lines because"."""
    lines = text.splitlines()
    limit = LIMIT_OF.get(key, LIMITS[key.partition("/")[0]])
    if len(lines) <= limit or any(REASON.match(line.strip()) for line in lines[:10]):
        return None
    return "%s: %d lines, over %d" % (key, len(lines), limit)


def test_the_size_checker_takes_a_limit_per_tree_or_a_reason():
    assert too_long("ternlab/x.py", "x = 1\n" * 700) is None
    assert too_long("ternlab/x.py", "x = 1\n" * 701) == "ternlab/x.py: 701 lines, over 700"
    assert too_long("tern/x.py", "x = 1\n" * 1000) is None and too_long("tern/x.py", "x = 1\n" * 1001)
    assert too_long("tern/session.py", "x = 1\n" * 1200) is None and too_long("tern/session.py", "x = 1\n" * 1201)
    assert too_long("ternlab/x.py", '"""Spark.\n\nOver 700 lines because one job.\n"""\n' + "x = 1\n" * 800) is None
    assert too_long("ternlab/x.py", '"""Spark."""\n' + "x = 1\n" * 12 + "# Over 700 lines because late\n" + "x = 1\n" * 800)


def test_no_long_module_without_a_reason():
    long, pending = [], set()
    paths = [(top, base, path) for top, base in TREES.items() for path in sorted(base.rglob("*.py"))]
    for top, base, path in paths:  # the library and the harness alike
        key = top + "/" + path.relative_to(base).as_posix()
        why = too_long(key, path.read_text())
        if key in PENDING_SPLIT:
            assert why, "%s: take it off PENDING_SPLIT" % key
            pending.add(key)
        elif why:
            long.append(why)
    assert long == [], "split them, or say in their first 10 lines why not (%s)" % REASON.pattern
    assert pending == PENDING_SPLIT


def test_host_modules_live_in_rooms_named_for_their_command():
    """host/ternlab keeps about a dozen top-level modules; the rest sit in packages named for what they
    serve (mqttcli: tern pub/sub, brokers: the far end of a connection, boards, fleet, pipeline), and
    no module takes the name of a standard library module it would shadow."""
    import sys

    top = sorted(p.stem for p in TREES["ternlab"].glob("*.py") if p.stem != "__init__")
    assert len(top) <= 12, top
    shadows = sorted(p.relative_to(TREES["ternlab"]).as_posix() for p in TREES["ternlab"].rglob("*.py")
                     if p.stem in sys.stdlib_module_names)
    assert shadows == [], shadows


def test_the_pipeline_package_lists_its_modules():
    import re

    pkg = TREES["ternlab"] / "pipeline"
    listed = set(re.findall(r"^- ``(\w+)``", (pkg / "__init__.py").read_text(), re.M))
    assert listed == {p.stem for p in pkg.glob("*.py") if p.stem != "__init__"}


# Device code (firmware/: what runs on a board or emulates one) is reached through one loader,
# ternlab.paths (device_dir, device_path, use_device). No other module, tool or test spells a folder
# of firmware/ (so none can put one on sys.path or MICROPYPATH itself), nor one of its old place
# device/, and no sys.path edit outside the loader takes a device folder from it either.
LOADER = TREES["ternlab"] / "paths.py"
SCANNED = (ROOT / "host", ROOT / "tools", ROOT / "tests")
DEVICE_TREE, OLD_TREE = "firmware", "device"
DEVICE_FOLDERS = {"app", "emulated", "qemu-firmware", "testing"}
OLD_PLACES = re.compile(r"boards/emulated|boards/qemu(/|$)|tools/firmware|qemu_device|tools/crash_device")
DEVICE_API = {"device_dir", "device_path", "use_device"}


def _names_device_code(s):
    parts = s.split("/")
    return any(a in (DEVICE_TREE, OLD_TREE) and b in DEVICE_FOLDERS for a, b in zip(parts, parts[1:])) \
        or bool(OLD_PLACES.search(s))


def _joins_the_tree(n):
    """Whether the `/` of `n` joins the device tree to a root (`ROOT / "firmware"`), not a folder of
    that name deeper down (`ROOT / "build" / "firmware"`, where the firmware images are built)."""
    left, right = _const(n.left), _const(n.right)
    if OLD_TREE in (left, right) or left == DEVICE_TREE:
        return True
    return right == DEVICE_TREE and not (isinstance(n.left, ast.BinOp) and _const(n.left.right) is not None)


def _const(node):
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _sys_path_edits(tree):
    """The argument subtrees of every edit of sys.path: sys.path.insert/append/extend(...) and
    assignments to sys.path or a slice of it."""
    def is_sys_path(n):
        return isinstance(n, ast.Attribute) and n.attr == "path" and isinstance(n.value, ast.Name) and n.value.id == "sys"

    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and is_sys_path(n.func.value) \
                and n.func.attr in ("insert", "append", "extend"):
            yield from n.args
        elif isinstance(n, (ast.Assign, ast.AugAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(is_sys_path(t) or isinstance(t, ast.Subscript) and is_sys_path(t.value) for t in targets):
                yield n.value


def device_reaches(source, name="<source>"):
    """[(line, what)] of the places in `source` that spell a folder of device code or edit sys.path
    with one from the loader (docstrings and comments do not count: they name files for readers)."""
    tree = ast.parse(source, name)
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr) and _const(n.body[0].value) is not None}
    found = []
    for n in ast.walk(tree):
        s = _const(n)
        if s is not None and id(n) not in docs and _names_device_code(s):
            found.append((n.lineno, "spells %r" % s))
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and _joins_the_tree(n):
            found.append((n.lineno, "joins the device tree into a path"))
        elif isinstance(n, ast.Call):
            args = [_const(a) for a in n.args]
            if any(a in (DEVICE_TREE, OLD_TREE) and b in DEVICE_FOLDERS for a, b in zip(args, args[1:])):
                found.append((n.lineno, "joins the device tree and a device folder"))
            elif {DEVICE_TREE, OLD_TREE} & set(args) and getattr(n.func, "id", getattr(n.func, "attr", None)) == "project_dir":
                found.append((n.lineno, "asks project_dir for the device tree"))
    for arg in _sys_path_edits(tree):
        for n in ast.walk(arg):
            if isinstance(n, (ast.Name, ast.Attribute)) and getattr(n, "id", getattr(n, "attr", None)) in DEVICE_API:
                found.append((n.lineno, "puts a device folder on sys.path (use ternlab.paths.use_device)"))
    return found


def test_the_device_checker_sees_each_way_of_reaching_device_code():
    assert device_reaches('import sys\nsys.path.insert(0, ROOT + "/boards/emulated")\n')
    assert device_reaches('env = {"MICROPYPATH": str(ROOT / "firmware" / "emulated")}\n')
    assert device_reaches('p = os.path.join(ROOT, "firmware", "testing")\n')
    assert device_reaches('q = ROOT / "firmware/app/main.py"\n')
    assert device_reaches('from ternlab.paths import project_dir\nd = project_dir("firmware")\n')
    assert device_reaches('import sys\nsys.path[:0] = device_path("norflash")\n')
    assert device_reaches('import sys\nsys.path.append(str(paths.device_dir("app")))\n')
    # the tree's old name, device/, in any of those spellings
    assert device_reaches('env = {"MICROPYPATH": str(ROOT / "device" / "emulated")}\n')
    assert device_reaches('p = os.path.join(ROOT, "device", "testing")\n')
    assert device_reaches('q = ROOT / "device/app/main.py"\n')
    assert device_reaches('from ternlab.paths import project_dir\nd = project_dir("device")\n')
    assert not device_reaches('"""Runs firmware/app/main.py."""\nfrom ternlab.paths import use_device\nuse_device("norflash")\n')
    assert not device_reaches('import sys\nsys.path.insert(0, ROOT + "/lib")\nrow = {"device": "d1"}\n')
    assert not device_reaches('cache = ROOT / "build" / "firmware"\nprof = {"firmware": "frozen"}\n')


def test_only_the_loader_reaches_device_code():
    bad = []
    for base in SCANNED:
        for path in sorted(base.rglob("*.py")):
            if path in (LOADER, Path(__file__).resolve()) or ".venv" in path.parts:  # this file spells them to look for them
                continue
            bad += ["%s:%d %s" % (path.relative_to(ROOT), line, what) for line, what in device_reaches(path.read_text(), str(path))]
    assert bad == [], "reach device code through ternlab.paths (device_dir, device_path, use_device)"


def test_device_code_lives_in_firmware_and_boards_holds_profiles_only():
    from ternlab.paths import DEVICE_PARTS, device_dir

    for part in DEVICE_PARTS:
        assert device_dir(part).is_dir() and ROOT / DEVICE_TREE in device_dir(part).parents, part
    homes = {device_dir(p) for p in DEVICE_PARTS}
    stray = [p for p in (ROOT / DEVICE_TREE).rglob("*") if p.is_file() and p.suffix in (".py", ".c", ".patch", ".mk")
             and not any(h == p.parent or h in p.parents for h in homes)]
    assert stray == []
    assert sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "boards").rglob("*")
                  if p.is_file() and p.suffix not in (".json", ".csv", ".md")) == []


# The top level is the one the project was specified with (issue 39): firmware, lib, host, tests,
# boards, tools; beside them the docs, what tools need at the top (mip's package.json and the mpy/ it
# points to, the build and packaging files, CI's entry; the fleet scenarios, scenarios/, which users
# name by path as they name boards/ profiles: `tern fleet run scenarios/smoke.toml`) and nothing else.
TOP_FOLDERS = {DEVICE_TREE, "lib", "host", "tests", "boards", "tools"}
TOP_BESIDE = {"docs", "mpy", ".ci", "README.md", "Makefile", "pyproject.toml", "setup.py", "MANIFEST.in",
              "package.json", "package-src.json", ".gitignore", "scenarios"}


def top_level():
    """The first path part of every file git keeps or would add (tracked, or untracked and not
    ignored): what the checkout is made of, without the venv, build/ and the runs' output."""
    import subprocess

    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    return {f.split("/")[0] for f in out.split("\0") if f and (ROOT / f).exists()}


def test_the_top_level_is_the_specified_one():
    top, want = top_level(), TOP_FOLDERS | TOP_BESIDE
    assert OLD_TREE not in top, "device/ is firmware/ now: what runs on a board goes there"
    assert top == want, "not at the top: %s; missing: %s" % (sorted(top - want), sorted(want - top))


# No test module is a library: what tests share lives in helper modules not named test_* (the test
# kit tests/lib/kit.py and the modules on it; tests/host/firmwarekit.py), and tools reach the kit as
# the package tests.lib (`python -m tools.NAME` from the root), never by putting a tests folder on
# sys.path.


def imported_test_modules(source, name="<source>"):
    """[(line, module)] of the test modules (test_*) that `source` imports, by any spelling."""
    found = []
    for n in ast.walk(ast.parse(source, name)):
        mods = [a.name for a in n.names] if isinstance(n, ast.Import) else \
            [n.module or ""] + [(n.module + "." if n.module else "") + a.name for a in n.names] \
            if isinstance(n, ast.ImportFrom) else []
        found += [(n.lineno, m) for m in mods if m.rpartition(".")[2].startswith("test_")]
    return found


def sys_path_edits_to_tests(source, name="<source>"):
    """[line] of the sys.path edits in `source` that spell a tests folder."""
    return [arg.lineno for arg in _sys_path_edits(ast.parse(source, name))
            if any("tests" in (_const(c) or "") for c in ast.walk(arg))]


def test_the_library_checker_sees_a_test_module_imported():
    assert imported_test_modules("from test_store_powercut import sample\n") == [(1, "test_store_powercut")]
    assert imported_test_modules("def f():\n    import test_firmware as t\n") == [(2, "test_firmware")]
    assert imported_test_modules("from tests.lib import test_model\n") == [(1, "tests.lib.test_model")]
    assert imported_test_modules("from tests.lib import kit\nimport testing\n") == []
    assert sys_path_edits_to_tests('import sys\nsys.path.insert(0, ROOT + "/tests/lib")\n') == [2]
    assert sys_path_edits_to_tests('import sys\nfor p in ("/tests/lib", "/lib"):\n    sys.path.insert(0, ROOT + p)\n') == []
    assert sys_path_edits_to_tests('import sys\nsys.path[:0] = [ROOT + "/tests/lib"]\n') == [2]


def test_no_test_module_is_imported_and_no_tool_puts_tests_on_the_path():
    bad = []
    for base in (ROOT / "tests", ROOT / "tools"):
        for path in sorted(base.rglob("*.py")):
            text = path.read_text()
            rel = path.relative_to(ROOT)
            bad += ["%s:%d imports %s" % (rel, line, m) for line, m in imported_test_modules(text, str(path))]
            if base.name == "tools":
                bad += ["%s:%d puts a tests folder on sys.path" % (rel, line) for line in sys_path_edits_to_tests(text, str(path))]
    assert bad == [], "share through a helper module (tests/lib/kit.py, tests/host/firmwarekit.py)"
