"""Render a box-and-arrow diagram from its text form (docs/architecture.txt) to SVG or PNG.

The diagram lives as text so that a change to the architecture is a reviewable diff; the picture is
derived from it with matplotlib (already a dependency of the pipeline's report), so no graphviz or
browser is needed. The output is byte-stable for the same input (fixed hash salt, no date).

    python tools/render_diagram.py docs/architecture.txt docs/architecture.svg

Format, one item a line (``#`` starts a comment):
    box  <id> <x> <y> <w> <h> <group> | <label, lines separated by \\n>
    edge <from> <to> <solid|dashed> | <label, may be empty>
"""

import argparse
import sys
from pathlib import Path

COLOURS = {
    "device": "#fde2c4",
    "library": "#cfe3fb",
    "broker": "#e0d4f7",
    "host": "#d9f0d3",
    "pipeline": "#fbe0e6",
}


class DiagramError(ValueError):
    pass


def parse(text):
    """(boxes, edges) from the text form; a bad line raises DiagramError naming its line number."""
    boxes, edges = {}, []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        head, _, label = line.partition("|")
        words = head.split()
        label = label.strip().replace("\\n", "\n")
        try:
            if words[0] == "box" and len(words) == 7:
                _, bid, x, y, w, h, group = words
                if group not in COLOURS:
                    raise DiagramError("line %d: unknown group %r (one of %s)" % (n, group, ", ".join(COLOURS)))
                boxes[bid] = (float(x), float(y), float(w), float(h), group, label)
            elif words[0] == "edge" and len(words) == 4:
                _, a, b, style = words
                if style not in ("solid", "dashed"):
                    raise DiagramError("line %d: edge style must be solid or dashed, got %r" % (n, style))
                edges.append((a, b, style, label))
            else:
                raise DiagramError("line %d: expected 'box id x y w h group | label' or 'edge a b style | label'" % n)
        except (IndexError, ValueError) as e:
            if isinstance(e, DiagramError):
                raise
            raise DiagramError("line %d: %s" % (n, e)) from None
    for a, b, _, _ in edges:
        for end in (a, b):
            if end not in boxes:
                raise DiagramError("edge %s -> %s: no box named %r" % (a, b, end))
    return boxes, edges


def _border_point(box, tx, ty):
    """Where the line from the box's centre towards (tx, ty) leaves the box."""
    x, y, w, h = box[:4]
    cx, cy = x + w / 2, y + h / 2
    dx, dy = tx - cx, ty - cy
    if dx == 0 and dy == 0:
        return cx, cy
    sx = (w / 2) / abs(dx) if dx else float("inf")
    sy = (h / 2) / abs(dy) if dy else float("inf")
    s = min(sx, sy)
    return cx + dx * s, cy + dy * s


def render(boxes, edges, out):
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "tern"
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    xmax = max(b[0] + b[2] for b in boxes.values()) + 0.3
    ymax = max(b[1] + b[3] for b in boxes.values()) + 0.3
    fig, ax = plt.subplots(figsize=(xmax * 1.05, ymax * 0.95))
    ax.set_xlim(0, xmax)
    ax.set_ylim(1.5, ymax)
    ax.axis("off")
    for x, y, w, h, group, label in boxes.values():
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.12",
                                    fc=COLOURS[group], ec="#444444", lw=1.0))
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=9)
    for a, b, style, label in edges:
        ba, bb = boxes[a], boxes[b]
        ca = (ba[0] + ba[2] / 2, ba[1] + ba[3] / 2)
        cb = (bb[0] + bb[2] / 2, bb[1] + bb[3] / 2)
        p = _border_point(ba, *cb)
        q = _border_point(bb, *ca)
        ax.annotate("", xy=q, xytext=p, arrowprops=dict(arrowstyle="-|>", lw=1.0, color="#333333",
                                                        linestyle="--" if style == "dashed" else "-"))
        if label:
            ax.text((p[0] + q[0]) / 2, (p[1] + q[1]) / 2, label, fontsize=7.5, ha="center", va="center",
                    bbox=dict(fc="white", ec="none", pad=0.5))
    handles = [FancyBboxPatch((0, 0), 1, 1, fc=c, ec="#444444") for c in COLOURS.values()]
    ax.legend(handles, list(COLOURS), loc="lower left", fontsize=8, frameon=False, ncol=len(COLOURS))
    fig.tight_layout()
    fig.savefig(out, metadata={"Date": None} if str(out).endswith(".svg") else None)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path, help="the diagram's text form")
    p.add_argument("output", type=Path, help="where to write it (.svg or .png)")
    args = p.parse_args(argv)
    if args.output.suffix not in (".svg", ".png"):
        p.error("output must end in .svg or .png, got %r" % args.output.name)
    try:
        boxes, edges = parse(args.source.read_text())
    except OSError as e:
        p.exit(2, "render_diagram: cannot read %s: %s\n" % (args.source, e.strerror))
    except DiagramError as e:
        p.exit(2, "render_diagram: %s: %s\n" % (args.source, e))
    render(boxes, edges, args.output)
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
