"""What the set-up installs, and which outside programs the code runs (tests/host/test_setup.py).

`debian_list()` reads tools/debian-packages.txt (`package  program`, the list tools/ensure_debian.sh
installs); `missing_programs()` is what tests/conftest.py checks before a session starts.
`scan()` reads the source of tests/, host/ and tools/ for the programs it starts: the first element
of a command given to subprocess / os.exec* / asyncio's create_subprocess_exec (a literal, or a name
bound to one in the same file), `shutil.which("X")`, `Path(sys.executable).with_name("X")` (a
console script beside the interpreter), `[sys.executable, "-m", "mod"]` (a Python module), and every
string that is a hard-coded /usr/bin, /usr/sbin or /usr/local path of a program.
"""

import ast
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEBIAN_LIST = ROOT / "tools" / "debian-packages.txt"
SCANNED = ("tests", "host", "tools")
SBIN = ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/sbin")  # where ensure_debian.sh also looks
RUNNERS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput",
           "create_subprocess_exec", "execv", "execve", "execvp", "execvpe", "execl", "execlp", "spawnv"}
ABS_PROGRAM = re.compile(r"^/usr/(?:local/)?s?bin/([A-Za-z0-9_.+-]+)$")


def debian_list(path=DEBIAN_LIST):
    """[(package, program)] from the list, comments and blank lines skipped."""
    out = []
    for line in Path(path).read_text().splitlines():
        parts = line.split("#", 1)[0].split()
        if parts:
            out.append((parts[0], parts[1] if len(parts) > 1 else parts[0]))
    return out


def find_program(prog):
    if shutil.which(prog):
        return shutil.which(prog)
    for d in SBIN:
        if Path(d, prog).is_file():
            return str(Path(d, prog))
    return None


def missing_programs(path=DEBIAN_LIST):
    """[(package, program)] of the list whose program is not on this machine."""
    return [(pkg, prog) for pkg, prog in debian_list(path) if not find_program(prog)]


def refusal(missing):
    """The one line a session that cannot run prints."""
    pkgs = " ".join(sorted({p for p, _ in missing}))
    progs = ", ".join("%s (%s)" % (prog, pkg) for pkg, prog in missing)
    return ("the test suite runs programs this machine lacks: %s. Install them with `make setup` "
            "(as root) or `sudo apt-get update && sudo apt-get install -y %s`" % (progs, pkgs))


# ------------------------------------------------------------------ the source scan

def _is_sys_executable(node):
    return isinstance(node, ast.Attribute) and node.attr == "executable" and \
        isinstance(node.value, ast.Name) and node.value.id == "sys"


def _beside_interpreter(node):
    """"X" of Path(sys.executable).with_name("X") (or .parent / "X"), else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "with_name" \
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        inner = node.func.value
        if isinstance(inner, ast.Call) and inner.args and _is_sys_executable(inner.args[0]):
            return node.args[0].value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant) \
            and isinstance(node.left, ast.Attribute) and node.left.attr == "parent" \
            and isinstance(node.left.value, ast.Call) and node.left.value.args \
            and _is_sys_executable(node.left.value.args[0]):
        return node.right.value
    return None


class _Scan(ast.NodeVisitor):
    def __init__(self, where, out):
        self.where, self.out, self.names = where, out, {}

    def add(self, kind, name, node):
        at = self.out.setdefault((kind, name), [])
        if "%s:%d" % (self.where, node.lineno) not in at:
            at.append("%s:%d" % (self.where, node.lineno))

    def bind(self, tree):
        """name -> values assigned to it anywhere in the file (literals, lists, interpreter paths)."""
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.names.setdefault(t.id, []).append(node.value)

    def program(self, node, depth=0):
        """Add what a command's first element names."""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str" and node.args:
            node = node.args[0]
        if _beside_interpreter(node):
            return  # visit_Call / visit_BinOp count it
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = ABS_PROGRAM.match(node.value)
            if m:
                self.add("debian", m.group(1), node)
            elif "/" not in node.value:
                self.add("program", node.value.split()[0] if node.value.split() else node.value, node)
        elif isinstance(node, ast.Name) and depth < 3:
            for v in self.names.get(node.id, ()):
                if isinstance(v, (ast.List, ast.Tuple)):
                    self.command(v, depth + 1)
                else:
                    self.program(v, depth + 1)

    def command(self, node, depth=0):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # [exe, ...] + extra
            return self.command(node.left, depth)
        if isinstance(node, ast.Name) and depth < 3:
            for v in self.names.get(node.id, ()):
                if isinstance(v, (ast.List, ast.Tuple, ast.BinOp)):
                    self.command(v, depth + 1)
                else:
                    self.program(v, depth + 1)
            return
        if not isinstance(node, (ast.List, ast.Tuple)) or not node.elts:
            return self.program(node, depth)
        first = node.elts[0]
        if _is_sys_executable(first):
            el = node.elts
            if len(el) > 2 and isinstance(el[1], ast.Constant) and el[1].value == "-m" \
                    and isinstance(el[2], ast.Constant):
                self.add("python-module", el[2].value.split(".")[0], node)
        else:
            self.program(first, depth)

    def visit_Call(self, node):
        self.beside(node)
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if name == "which" and node.args:
            a = node.args[0]
            if isinstance(a, ast.Constant) and isinstance(a.value, str):
                self.add("program", a.value, node)
        elif name in RUNNERS and node.args and (name not in ("run", "call") or isinstance(f, ast.Attribute)
                                                and isinstance(f.value, ast.Name) and f.value.id == "subprocess"):
            if name.startswith(("exec", "spawn")) or name == "create_subprocess_exec":
                args = node.args[1:] if name.startswith("spawn") else node.args
                if args:
                    self.program(args[0])
            else:
                self.command(node.args[0])
        self.generic_visit(node)

    def visit_Constant(self, node):
        if isinstance(node.value, str):
            m = ABS_PROGRAM.match(node.value)
            if m:
                self.add("debian", m.group(1), node)

    def beside(self, node):
        script = _beside_interpreter(node)
        if script:
            self.add("python-script", script, node)

    def visit_BinOp(self, node):
        self.beside(node)
        self.generic_visit(node)


def scan_source(text, where="<source>", out=None):
    """{(kind, name): [file:line, ...]} for one file's source. kind: "debian" (a hard-coded system
    path), "python-script" (beside the interpreter), "python-module" (python -m), "program" (either)."""
    out = {} if out is None else out
    tree = ast.parse(text)
    s = _Scan(where, out)
    s.bind(tree)
    s.visit(tree)
    return out


def scan(root=ROOT, folders=SCANNED):
    out = {}
    for folder in folders:
        for p in sorted(Path(root, folder).rglob("*.py")):
            if ".venv" in p.parts or "__pycache__" in p.parts:
                continue
            scan_source(p.read_text(), str(p.relative_to(root)), out)
    return out
