"""docs/benchmarks.md is written by several tools, each owning one marked section
(``<!-- name:begin -->`` ... ``<!-- name:end -->``), so rerunning one benchmark never
touches another's figures."""

from pathlib import Path

NEW_DOC = "# Benchmarks\n\nMeasurements of Tern; each `##` section is produced by the tool it names.\n"


def _marks(name):
    return "<!-- %s:begin -->" % name, "<!-- %s:end -->" % name


def read_section(path, name):
    """The text of section `name` in `path`, or None when the file or the section is missing."""
    begin, end = _marks(name)
    try:
        doc = Path(path).read_text()
    except OSError:
        return None
    if begin not in doc or end not in doc:
        return None
    return doc[doc.index(begin) + len(begin): doc.index(end)].strip("\n")


def write_section(path, name, text, heading=None):
    """Replace section `name` of `path` with `text`; a missing section is appended (under `heading`)."""
    begin, end = _marks(name)
    p = Path(path)
    doc = p.read_text() if p.exists() else NEW_DOC
    block = begin + "\n" + text.strip("\n") + "\n" + end
    if begin in doc and end in doc and doc.index(begin) < doc.index(end):
        doc = doc[: doc.index(begin)] + block + doc[doc.index(end) + len(end):]
    else:
        doc = doc.rstrip("\n") + "\n\n" + ("## %s\n\n" % heading if heading else "") + block + "\n"
    p.write_text(doc)
