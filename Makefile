# The two commands the README opens with: `make demo` and `make test`.
# Both set everything up on a fresh machine first (venv, Python packages, the Debian packages of
# tools/debian-packages.txt).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tern-installed

.PHONY: demo test test-fast bench bench-sweep setup debian firmware size clean interop

setup: $(STAMP) debian

# two distributions, both editable: the library `tern-mqtt` (lib/) and the harness `ternlab` (here)
$(STAMP): pyproject.toml lib/pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip uninstall -q -y tern 2>/dev/null || true   # the single distribution of older checkouts
	$(VENV)/bin/pip install -q -e ./lib -e '.[test]'
	# the boards' API for tests/host/test_stubs.py, one folder per port (their stubs overlap)
	for port in esp32 rp2; do rm -rf $(VENV)/stubs/$$port; \
	  $(VENV)/bin/pip install -q --target $(VENV)/stubs/$$port "micropython-$$port-stubs==1.28.0.post4" || exit 1; done
	touch $(STAMP)

debian:
	@sh tools/ensure_debian.sh

# make demo: 4 emulated boards for 120 s under faults, two collectors, the Spark audit, a verdict
# (about 2.5 min). Options: make demo DEMO_ARGS="--boards 8 --duration 60 --seed 7" (see docs/demo.md).
demo: setup
	$(VENV)/bin/tern demo $(DEMO_ARGS)

# make firmware: the qemu boards' firmware images (MicroPython's qemu port for the Cortex-M3 and the RISC-V
# RV32 core, stock, and with Tern frozen in for a profile that says "frozen"), one per machine and kind,
# built into build/firmware unless the cache has one for the same content.
firmware: setup
	$(VENV)/bin/tern firmware build

# one pytest worker per core, at most 4 (pytest-xdist), each test file on one worker so that its fixtures are
# made once; PYTEST_WORKERS=0 runs the suite in this process (what -x, --pdb and -s want)
PYTEST_WORKERS ?= $(shell n=$$(nproc); [ $$n -gt 4 ] && n=4; echo $$n)
test: setup firmware
	$(PY) -m pytest $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

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
	$(PY) -m tools.crash_sweep --write docs/benchmarks.md

# make interop: Tern (library on CPython and MicroPython, tern pub/sub) against Mosquitto, RabbitMQ,
# ejabberd, aedes and amqtt on 127.0.0.1, each feature beside a peer client; writes the matrix into
# docs/interop.md (about 10 min). Installs its brokers and peers apart from the main venv
# (tools/interop/setup.sh). Not part of `make test`.
interop: setup
	sh tools/interop/setup.sh
	$(PY) tools/interop/matrix.py --write docs/interop.md

clean:
	rm -rf $(VENV) .venv-interop .pytest_cache build *.egg-info
