# specbook: `make book` builds the HTML book, `make test` runs every check.
# Both create the virtual environment .venv on first use (Python 3.11).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard chapters/*.ipynb) $(wildcard exercises/solutions/*.ipynb))

.PHONY: setup book test unit nbval book-strict notebooks clean

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps --editable .
	touch $(STAMP)

book: setup
	$(BIN)/jupyter-book build . --path-output .
	@echo "The book is at file://$(CURDIR)/_build/html/index.html"

test: unit nbval book-strict

unit: setup
	$(BIN)/python -m pytest tests -q

nbval: setup
	$(BIN)/python -m pytest --nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg -q $(NOTEBOOKS)

book-strict: setup
	$(BIN)/jupyter-book build . --path-output . --warningiserror --nitpick --keep-going

# Re-execute every notebook in place, top to bottom (after changing what they import).
notebooks: setup
	for nb in $(NOTEBOOKS); do $(BIN)/jupyter-execute --inplace "$$nb" || exit 1; done

clean:
	rm -rf _build
