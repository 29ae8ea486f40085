"""Where the harness finds the project's files.

Board profiles, the firmware and the fleet scenarios are the checkout's `boards/`, `firmware/` and
`scenarios/` folders; an installed `ternlab` wheel carries the same files as package data under
`ternlab/share/` (copied there by setup.py when the wheel is built, never kept twice in the repo).
The library's sources, which deploy and the emulated boards compile and copy to boards, are those of
the `tern` package this interpreter imports (lib/tern in a checkout, the installed `tern-mqtt`).
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARE = HERE / "share"
CHECKOUT = HERE.parents[1]


def project_dir(name: str) -> Path:
    """`boards`, `firmware` or `scenarios`: the wheel's copy when installed, else the checkout's."""
    d = SHARE / name
    return d if d.is_dir() else CHECKOUT / name


def lib_dir() -> Path:
    """The folder that holds the `tern` package (its parent)."""
    import tern

    return Path(tern.__file__).resolve().parent.parent


def boards_home() -> Path:
    """Where `tern board run` keeps an emulated board's folder when no --dir is given: the user's data
    folder ($XDG_DATA_HOME/tern/boards, by default ~/.local/share/tern/boards), not the working
    directory, so a board is the same device wherever the command is run from, and no checkout gets
    a stray folder."""
    import os

    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "tern" / "boards"
