"""The `ternlab` wheel carries the project's board profiles, device code and fleet scenarios as package
data (ternlab/share/{boards,firmware,scenarios}, found by ternlab.paths): they are copied from the
checkout's folders when the wheel is built, so the repository keeps one copy of each file. An editable
install reads the checkout's folders directly. Everything else is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHARED = ("boards", "firmware", "scenarios")
HERE = Path(__file__).resolve().parent


class build_py_with_share(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for name in SHARED:
            dest = Path(self.build_lib, "ternlab", "share", name)
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(HERE / name, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.mpy"))


setup(cmdclass={"build_py": build_py_with_share})
