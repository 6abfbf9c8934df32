# The two commands of README.md. Each creates .venv/ on first use and installs the project into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned to 2.13.0: the CPU build on this machine kind (README: GPU install)
	$(PY) -m pip install -q -e ".[dashboards,postgres,dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sweeps run sweeps/examples/demo.yaml --report .batchsweep/demo-report.json

test: $(STAMP)
	$(PY) -m pytest

clean:
	rm -rf $(VENV) .pytest_cache
