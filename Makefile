# The two commands the README opens with: `make demo` and `make test`.
# Both set everything up on a fresh machine first (venv, packages, Mosquitto).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tern-installed

.PHONY: demo test test-fast bench setup mosquitto size clean

setup: $(STAMP) mosquitto

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

mosquitto:
	@sh tools/ensure_mosquitto.sh

demo: setup
	$(VENV)/bin/tern demo $(DEMO_ARGS)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

size: setup
	$(PY) tools/size_report.py --write docs/benchmarks.md

bench: setup
	$(PY) tools/size_report.py --write docs/benchmarks.md
	$(PY) tools/bench/client_bench.py --write docs/benchmarks.md
	$(PY) tools/bench/flash_bench.py --write docs/benchmarks.md
	$(PY) tools/bench/audit_bench.py --sizes 1M,5M --write docs/benchmarks.md

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
