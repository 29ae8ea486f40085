"""The architecture diagram is rendered from its text form, and that text stays honest."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "render_diagram.py"


def run(*args):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True)


def test_the_architecture_diagram_renders_with_every_box_and_names_real_folders(tmp_path):
    out = tmp_path / "arch.svg"
    r = run(ROOT / "docs" / "architecture.txt", out)
    assert r.returncode == 0, r.stderr
    svg = out.read_text()
    assert svg.startswith("<?xml") and "</svg>" in svg
    # matplotlib writes text as glyph paths: the labels are in the SVG's comments
    for label in ("session (sans-I/O)", "MQTT broker", "Spark: audit, rollup,", "tern collect x N"):
        assert label in svg, label
    # a second render is byte-identical: the committed picture is reproducible
    again = tmp_path / "again.svg"
    assert run(ROOT / "docs" / "architecture.txt", again).returncode == 0
    assert again.read_bytes() == out.read_bytes()


@pytest.mark.parametrize("text, message", [
    ("box a 0 0 1 1 nosuch | A\n", "line 1: unknown group 'nosuch'"),
    ("box a 0 0 1 1 host | A\nedge a b solid | x\n", "no box named 'b'"),
    ("box a 0 zero 1 1 host | A\n", "line 1: could not convert"),
    ("arrow a b\n", "line 1: expected"),
])
def test_a_bad_diagram_line_is_named(tmp_path, text, message):
    src = tmp_path / "d.txt"
    src.write_text(text)
    r = run(src, tmp_path / "d.svg")
    assert r.returncode == 2
    assert message in r.stderr
    assert not (tmp_path / "d.svg").exists()
