# The two commands the README opens with: `make demo` and `make test`.
# Both set everything up on a fresh machine first (venv, Python packages, the Debian packages of
# tools/debian-packages.txt).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tern-installed

.PHONY: demo test test-fast bench bench-sweep setup debian firmware size clean

setup: $(STAMP) debian

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

debian:
	@sh tools/ensure_debian.sh

# make demo: 4 emulated boards for 120 s under faults, two collectors, the Spark audit, a verdict
# (about 2.5 min). Options: make demo DEMO_ARGS="--boards 8 --duration 60 --seed 7" (see docs/demo.md).
demo: setup
	$(VENV)/bin/tern demo $(DEMO_ARGS)

# make firmware: the qemu-m3 board's firmware images (MicroPython's qemu port with Tern frozen in), one
# per qemu-m3 profile, built into build/firmware unless the cache has one for the same content.
firmware: setup
	$(VENV)/bin/tern firmware build --board qemu-m3

test: setup firmware
	$(PY) -m pytest $(PYTEST_ARGS)

size: setup
	$(PY) tools/size_report.py --write docs/benchmarks.md

# make bench: every figure of docs/benchmarks.md, each tool rewriting its own section (about 30 min);
# make bench-sweep adds the full crash-point sweep (every cut point of three stores: hours).
bench: setup
	$(PY) tools/size_report.py --write docs/benchmarks.md
	$(PY) tools/bench/client_bench.py --write docs/benchmarks.md
	$(PY) tools/bench/flash_bench.py --write docs/benchmarks.md
	$(PY) tools/bench/firmware_bench.py --write docs/benchmarks.md
	$(PY) tools/bench/collector_bench.py --write docs/benchmarks.md
	$(PY) tools/bench/audit_bench.py --sizes 1M,5M,20M --write docs/benchmarks.md

bench-sweep: bench
	$(PY) tools/crash_sweep.py --write docs/benchmarks.md

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
