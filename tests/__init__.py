"""The suites, a package so that the test kit is `tests.lib.kit` wherever it is used (pytest, the
MicroPython runs of tests/lib, tools run as `python -m tools.NAME` from the checkout's root): no
sys.path edit reaches it. tests/lib and tests/host stay folders of modules imported by their own
names (the qemu boards import tests/lib's helpers from their ROMFS so); gmqtt installs a top-level
`tests` package of its own, which this one shadows where the root comes first on the path."""
