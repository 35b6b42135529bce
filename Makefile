# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-quick lint typecheck pytest docs bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[server,dev,docs]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/rank-dataset demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks docs examples
	$(BIN)/ruff format --check src tests benchmarks docs examples
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest

# The documentation site, into site/ (open site/index.html). Strict: a broken link, anchor or API
# reference fails the build. NO_MKDOCS_2_WARNING quiets Material's banner about its end of life.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

test: lint typecheck docs pytest

# Everything but the tests marked slow (torchrun jobs, Lightning, Accelerate, the demo, benchmark smoke
# runs, doc and README examples) and the docs build: a couple of minutes. `make test` runs them all.
test-quick: lint typecheck
	$(BIN)/pytest -m "not slow"

bench: $(STAMP)
	for b in build getitem server workers mix audit group balanced jobstart scale failures; do $(BIN)/python benchmarks/bench_$$b.py || exit 1; done
	for m in fork forkserver; do $(BIN)/python benchmarks/bench_memory.py --start-method $$m || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
