#!/usr/bin/env python3
"""Rebuild mip's packages from lib/tern/manifest.py: mpy/tern/*.mpy (the device set as bytecode, what
`mpremote mip install github:OWNER/REPO` puts on a board), package.json naming them and
package-src.json naming the sources. Run after changing anything in the device set and commit the
result; tests/host/test_device_set.py rebuilds and fails when the committed files are stale.

    python tools/build_mpy.py
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "lib")]

from ternlab.devset import write_packages  # noqa: E402

if __name__ == "__main__":
    write_packages(ROOT)
    print("wrote", ROOT / "mpy", ROOT / "package.json", ROOT / "package-src.json")
