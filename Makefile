# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-torch lint venv bench clean system-deps

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/xirang demo

# The dashboard test renders the page in Debian's headless Chromium.
system-deps:
	@command -v chromium >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
	  { echo "installing chromium for the dashboard test"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 || \
	    echo "could not install chromium: the dashboard test will say what to do"; }

# The tests run in parallel: pytest-xdist, PYTEST_WORKERS processes, each taking one test file at
# a time (so a file's module fixtures are built once; tests/conftest.py hands out the slow kinds
# first). Most tests wait on real nats-servers and processes, so even two cores gain.
# `make test PYTEST_WORKERS=1` runs them serially, in one process.
PYTEST_WORKERS ?= 4
PYTEST_PARALLEL := $(if $(filter 0 1,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

test: $(STAMP) system-deps lint
	$(BIN)/python -m pytest tests -q $(PYTEST_PARALLEL); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

# examples/train_torch_ddp.py under torchrun on a live 2-host cluster. torch is never in the
# default suite (it brings gigabytes): it goes into a venv of its own, with the CPU wheel.
TORCH_VENV := .venv-torch
TORCH_VERSION ?= 2.13.0

test-torch:
	test -x $(TORCH_VENV)/bin/python || $(PY) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -m pip install -q -e '.[test]' torch==$(TORCH_VERSION)
	$(TORCH_VENV)/bin/python -m pytest tests_torch -q -p no:cacheprovider

# ruff's rules and the files it formats are set in pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy core  # the core's annotations hold (pinned: a newer mypy may find more)

bench: $(STAMP)
	$(BIN)/xirang bench core --json

clean:
	rm -rf $(VENV) $(TORCH_VENV) .xirang
