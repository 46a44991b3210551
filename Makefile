# Every target creates and uses the virtualenv at .venv in the repository root.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Python keeps compiled modules (and pytest its rewritten test modules) in __pycache__: a machine
# that sets PYTHONDONTWRITEBYTECODE makes every daemon, CLI and test worker compile the project
# again (a third of a daemon's start, half of a worker's collection).
unexport PYTHONDONTWRITEBYTECODE
# The suite's tests wait on real daemons, subprocesses, sockets and disks a good part of the time:
# more pytest-xdist workers (whole files per worker) than cores keep both cores busy. TEST_WORKERS=0
# runs it in one process.
TEST_WORKERS ?= 4
XDIST := $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile)
# Budgets on a 2-core machine: make test 10 minutes, make test-fast 3, .ci/run 35 with the install.
# The wheel's own test (marker packaging: build, install into a new venv, run) is make test-packaging's.
UNPACKAGED := -m 'not packaging'

# Every run ends with its 25 slowest tests, so a new slow one shows; make test-durations lists all.
DURATIONS := --durations=25

.PHONY: run prepare packages test test-fast test-durations test-calendar test-at test-packaging lint docs bench install browser wrk faketime postgres systemd synapse clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned: a bare "torch" would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/neotask gateway

browser:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "chromium could not be installed: browser tests will be skipped"; \
	  else echo "chromium missing and not root: browser tests will be skipped"; fi; \
	fi

# wrk is the load generator of bench.gateway_ingest; its smoke test (slow) skips without it.
wrk:
	@if ! command -v wrk >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null) \
	      || echo "wrk could not be installed: its bench smoke test will be skipped"; \
	  else echo "wrk missing and not root: its bench smoke test will be skipped"; fi; \
	fi

# PostgreSQL (Debian's postgresql): the tests initdb a throwaway cluster (tests/support/postgres.py);
# its tests are skipped, with the reason, only when the binaries are absent.
postgres:
	@if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) \
	      || echo "postgresql could not be installed: the postgres backend's tests will be skipped"; \
	  else echo "postgresql missing and not root: the postgres backend's tests will be skipped"; fi; \
	fi

# systemd-analyze (Debian's systemd package; nothing starts it) checks the unit `neotask service
# install` writes; its test is skipped, with the reason, only when it cannot be installed.
systemd:
	@if ! command -v systemd-analyze >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null) \
	      || echo "systemd could not be installed: the service unit's verify test will be skipped"; \
	  else echo "systemd-analyze missing and not root: the service unit's verify test will be skipped"; fi; \
	fi

# Synapse (matrix-synapse from PyPI) in a venv of its own, apart from .venv's pins: the Matrix tests
# start one homeserver on SQLite (tests/support/synapse.py); ~50 s to create on a fresh machine, once.
# They are skipped, with the reason, only when it cannot be created.
SYNAPSE_VENV := .synapse-venv
synapse:
	@test -x $(SYNAPSE_VENV)/bin/python && $(SYNAPSE_VENV)/bin/python -c 'import synapse' 2>/dev/null || \
	  { rm -rf $(SYNAPSE_VENV) && $(PY) -m venv $(SYNAPSE_VENV) && $(SYNAPSE_VENV)/bin/pip install --quiet 'matrix-synapse>=1.100,<2'; } \
	  || { rm -rf $(SYNAPSE_VENV); echo "matrix-synapse could not be installed: the Matrix tests will be skipped"; }

# faketime (libfaketime) shifts the clock of a process tree: the suite at other dates (test-calendar, test-at).
faketime:
	@if ! command -v faketime >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null) \
	      || { echo "faketime could not be installed: the suite cannot run at other dates"; exit 1; }; \
	  else echo "faketime missing and not root: apt-get install faketime"; exit 1; fi; \
	fi

# What the suite needs, installed side by side on a fresh machine (mostly waiting on downloads): the
# Debian packages in one apt-get run, .venv, Synapse's venv; then each tool's own check (its fallback
# and its message when it could not be installed).
DEBIAN_PACKAGES := chromium:chromium wrk:wrk pg_ctl:postgresql systemd-analyze:systemd faketime:faketime
packages:
	@missing=""; for pair in $(DEBIAN_PACKAGES); do \
	  tool=$${pair%%:*}; package=$${pair#*:}; \
	  if [ "$$tool" = pg_ctl ]; then ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 && continue; \
	  else command -v $$tool >/dev/null 2>&1 && continue; fi; missing="$$missing $$package"; done; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ]; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
	    || echo "apt-get could not install$$missing (each is tried again on its own)"; fi

prepare:
	@$(MAKE) --no-print-directory -j3 packages $(STAMP) synapse
	@$(MAKE) --no-print-directory browser wrk postgres systemd

test: prepare
	$(BIN)/python -m pytest $(XDIST) $(DURATIONS) $(UNPACKAGED) $(PYTEST_ARGS)

# The whole suite, then every test's duration (setup, call, teardown), slowest first.
test-durations: prepare
	mkdir -p test-artifacts
	$(BIN)/python -m pytest $(XDIST) --durations=0 --durations-min=0 $(UNPACKAGED) $(PYTEST_ARGS) > test-artifacts/pytest.log 2>&1; \
	  status=$$?; tail -n 3 test-artifacts/pytest.log; \
	  sed -n '/slowest durations/,/short test summary\|in [0-9.]*s/p' test-artifacts/pytest.log > test-artifacts/durations.txt; \
	  echo "every duration: test-artifacts/durations.txt ($$(wc -l < test-artifacts/durations.txt) lines)"; exit $$status

# The date rules run in-process at every moment of tests/clock_shift.py's CALENDAR on every make
# test (tests/dates/). What only real processes at a shifted date show runs here: the date-sensitive
# tests that read the real clock (marker realtime: real daemons and CLI processes, APScheduler's own
# timers, file timestamps) at CI_MOMENTS (the nights DST starts and ends, a year past 2038), the
# three runs at once, each in one process. CALENDAR_TESTS=tests runs every realtime test.
CALENDAR_TESTS ?= tests/gateway/test_startup_resets.py tests/scheduler/test_service.py \
  tests/gateway/test_cli_parity.py tests/gateway/test_cli_ops.py tests/gateway/test_cli.py \
  tests/faults/test_damaged_state.py tests/sessions/files/test_doctor.py
test-calendar: $(STAMP) faketime wrk postgres
	$(BIN)/python -m tests.clock_shift --ci -- -m 'realtime and not browser and not packaging' -p no:xdist $(PYTEST_ARGS) \
	  $(CALENDAR_TESTS)

# The suite (or PYTEST_ARGS) at one moment: make test-at AT='2028-02-29 23:58' ZONE=Europe/Berlin
AT ?= 2027-03-28 01:56
ZONE ?= Europe/Berlin
test-at: $(STAMP) faketime browser wrk
	$(BIN)/python -m tests.clock_shift --at '$(AT)' --zone '$(ZONE)' -- $(XDIST) $(UNPACKAGED) $(PYTEST_ARGS)

test-fast: $(STAMP) postgres systemd
	$(BIN)/python -m pytest -m 'not slow and not packaging' $(XDIST) $(DURATIONS) $(PYTEST_ARGS)

# The wheel built from this checkout, installed (not editable) into a new venv that borrows .venv's
# dependencies, run from another folder: its files, init, a gateway answering through a model (~25 s).
test-packaging: $(STAMP)
	$(BIN)/python -m pytest -p no:xdist -m packaging $(DURATIONS) $(PYTEST_ARGS) tests/packaging

lint: $(STAMP)
	$(BIN)/ruff check gateway conversations sessions home memory scheduler config channels backups tests bench
	$(BIN)/mypy

# The docs site (mkdocs-material, mkdocs.yml) into build/site. --strict: a broken link or anchor, or a
# page of docs/ missing from the navigation, fails it. The configuration, CLI and HTTP API references
# are generated from the code at each build (gateway/docs_site.py, a mkdocs hook); nothing generated
# is committed. Run as `python -m mkdocs` so this checkout's packages are the ones documented.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --quiet

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) $(SYNAPSE_VENV)
