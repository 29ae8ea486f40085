"""The shape of the code, checked statically (no import runs): no import cycle among the modules of
lib/tern and host/ternlab, nothing in the library importing the harness, nothing importing the `tern`
command's entry point (ternlab.cli) but the entry point itself, and no module of either tree over 600
lines without a reason written at its top."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = {"tern": ROOT / "lib" / "tern", "ternlab": ROOT / "host" / "ternlab"}
MAX_LINES = 600
REASON = "Over 600 lines because"  # the start of a line in a long module's first 10 lines
# Long modules whose split is another change of issue 19 (each must still be long and without a
# reason: the list shrinks as they are split or give their reason).
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
    assert "ternlab.secrets" in g["ternlab.mqtt_argv"]  # from .secrets import add_secret
    assert "ternlab.mqtt_conn" in g["ternlab.mqtt_sub"]  # from . import mqtt_conn
    assert "ternlab.secrets" in g["ternlab.pipeline.collect_cli"]  # from ..secrets import add_secret
    assert "tern.codec" in g["ternlab.trace"]


def test_no_import_cycle():
    assert cycles(graph()) == PENDING_CYCLES


def test_imports_point_down():
    g = graph()
    for name, deps in g.items():
        if name.startswith("tern."):
            assert not [d for d in deps if d.startswith("ternlab")], name  # the library never uses the harness
        up = {"ternlab.cli"} & deps
        assert not up or name == "ternlab.cli", "%s imports the `tern` command itself" % name


def test_no_long_module_without_a_reason():
    long, pending = [], set()
    paths = [(top, base, path) for top, base in TREES.items() for path in sorted(base.rglob("*.py"))]
    for top, base, path in paths:  # the library and the harness alike
        lines = path.read_text().splitlines()
        key = top + "/" + path.relative_to(base).as_posix()
        has_reason = any(line.strip().startswith(REASON) for line in lines[:10])
        if key in PENDING_SPLIT:
            assert len(lines) > MAX_LINES and not has_reason, "%s: take it off PENDING_SPLIT" % key
            pending.add(key)
        elif len(lines) > MAX_LINES and not has_reason:
            long.append("%s (%d lines)" % (key, len(lines)))
    assert long == [], "split them, or say at the top why not (%r...)" % REASON
    assert pending == PENDING_SPLIT


def test_the_pipeline_package_lists_its_modules():
    import re

    pkg = TREES["ternlab"] / "pipeline"
    listed = set(re.findall(r"^- ``(\w+)``", (pkg / "__init__.py").read_text(), re.M))
    assert listed == {p.stem for p in pkg.glob("*.py") if p.stem != "__init__"}
