# The two commands of README.md. Each creates .venv/ on first use and installs the project into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SYSDEPS := $(VENV)/.sysdeps

.PHONY: demo test test-fast sysdeps venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml deploy/requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the versions the image ships: deploy/requirements.lock as constraints, without its hashes (a hash in a
	# constraints file turns on pip's hash checking for every requirement, the editable project's too); a new
	# release on the index cannot change what the suite runs. torch is pinned to 2.13.0: the CPU build on this
	# machine kind (docs/operators.md: GPU install)
	sed -n 's/^\([A-Za-z0-9][A-Za-z0-9._-]*==[^ ]*\) \\$$/\1/p' deploy/requirements.lock > $(VENV)/constraints.txt
	$(PY) -m pip install -q -c $(VENV)/constraints.txt -e ".[dashboards,postgres,dev]"
	touch $(STAMP)

demo: $(STAMP)
	bash deploy/local_demo.sh

# Debian packages the tests drive for real: Chromium (dashboard and MLflow UI pages) and a
# PostgreSQL server (the service's store). Installed once, as root, when missing.
$(SYSDEPS): | $(STAMP)
	@if command -v chromium >/dev/null && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium postgresql >/dev/null; \
	else echo "make test needs Debian's chromium and postgresql (make sysdeps as root, or: sudo apt-get install chromium postgresql)"; exit 1; fi
	touch $@

sysdeps: $(SYSDEPS)

# What needs no Ray cluster, browser, server process, GPU or compilation: the contributor's quick loop. Also
# in a fresh temporary directory of its own.
test-fast: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	@tmp=$$(mktemp -d /tmp/bst.XXXXXX) && \
	  TMPDIR=$$tmp PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n 2 --dist worksteal -m "not ray and not slow and not gpu and not browser and not server and not compile and not serial" -q; \
	  rc=$$?; rm -rf "$$tmp"; exit $$rc

# The suite runs in a fresh, empty temporary directory of its own (TMPDIR, which Python's tempfile and
# Ray's default folder follow), removed afterwards: nothing an earlier run or another program left in
# /tmp can make it pass or fail. Every test, in three runs: what needs no cluster, browser or server on both
# cores (pytest-xdist; worksteal: a worker that runs out takes queued tests from the other, which evens out
# the few long ones); then what does, also two at a time (each worker starts its own Ray head; a test's
# sweeps wait on Ray, MLflow and the browser as much as they compute, so two overlap); then the `serial`
# tests alone, which measure latency or load and would read the other test's load as their own.
# Both test targets write bytecode caches even where the environment says PYTHONDONTWRITEBYTECODE: pytest
# then rewrites the asserts of its plugins' modules once, not in every pytest process (about half of a
# process's collection time); a cache is checked against its source, so it cannot make a test pass or fail.
HEAVY := ray or slow or browser or server or compile or serial
test: $(STAMP) $(SYSDEPS)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	@tmp=$$(mktemp -d /tmp/bst.XXXXXX) && echo "TMPDIR=$$tmp" && \
	  TMPDIR=$$tmp PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n 2 --dist worksteal -m "not ($(HEAVY))" -q; quick=$$?; \
	  TMPDIR=$$tmp PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n 2 --dist worksteal -m "($(HEAVY)) and not serial" --durations=30; rest=$$?; \
	  TMPDIR=$$tmp PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -m serial -q; alone=$$?; \
	  rm -rf "$$tmp"; [ $$quick = 0 ] && [ $$rest = 0 ] && [ $$alone = 0 ]

clean:
	rm -rf $(VENV) .pytest_cache
