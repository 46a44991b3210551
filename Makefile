# Every target creates and uses the virtualenv at .venv in the repository root.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# The suite's tests wait on real daemons, subprocesses and disks about a quarter of the time: two
# pytest-xdist workers (whole files per worker) fill both cores. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile)

.PHONY: run test test-fast test-calendar test-at lint bench install browser wrk faketime postgres clean

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

# faketime (libfaketime) shifts the clock of a process tree: the suite at other dates (test-calendar, test-at).
faketime:
	@if ! command -v faketime >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null) \
	      || { echo "faketime could not be installed: the suite cannot run at other dates"; exit 1; }; \
	  else echo "faketime missing and not root: apt-get install faketime"; exit 1; fi; \
	fi

test: $(STAMP) browser wrk postgres
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

# What CI runs again at each date of tests/clock_shift.py's CALENDAR: the date-sensitive part of
# the tests that read the real clock (marker realtime: real daemons and CLI processes, the real
# scheduler, file timestamps): start-up resets, the scheduler, homes seeded for a real daemon, the
# CLI online and offline (reset, compact, cron run), file ages; 106 tests, about 4-5 minutes a date.
# With the daemon's own start/stop tests it was 6-7 minutes a date, and the whole realtime set (353)
# 20 minutes at one date: too long for seven dates in CI's budget. CALENDAR_TESTS=tests runs it all.
CALENDAR_TESTS ?= tests/gateway/test_startup_resets.py tests/scheduler/test_service.py \
  tests/gateway/test_cli_parity.py tests/gateway/test_cli_ops.py tests/gateway/test_cli.py \
  tests/faults/test_damaged_state.py tests/sessions/files/test_doctor.py
test-calendar: $(STAMP) faketime wrk
	$(BIN)/python -m tests.clock_shift --calendar -- -m 'realtime and not browser' $(XDIST) $(PYTEST_ARGS) \
	  $(CALENDAR_TESTS)

# The suite (or PYTEST_ARGS) at one moment: make test-at AT='2028-02-29 23:58' ZONE=Europe/Berlin
AT ?= 2027-03-28 01:56
ZONE ?= Europe/Berlin
test-at: $(STAMP) faketime browser wrk
	$(BIN)/python -m tests.clock_shift --at '$(AT)' --zone '$(ZONE)' -- $(XDIST) $(PYTEST_ARGS)

test-fast: $(STAMP) postgres
	$(BIN)/python -m pytest -m 'not slow' $(XDIST) $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check gateway conversations sessions memory scheduler config channels backups tests bench
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV)
