# Two commands do everything on a fresh machine: `make demo` and `make test`.
# PYTHON picks the interpreter (3.10-3.13), VENV where it installs: give each Python its own VENV
# (make PYTHON=python3.10 VENV=.venv-3.10 test), since an existing venv keeps the Python it was made with.
PYTHON ?= python3
VENV ?= .venv
# make test-quick runs the quick tier in QUICK_WORKERS processes (pytest-xdist).
QUICK_WORKERS ?= 2
# make test runs the whole suite in TEST_WORKERS processes: more than the cores, since most of the suite's
# time is its processes waiting (ranks on each other, workers' joins, servers' lingers), not CPU.
TEST_WORKERS ?= 4
BIN := $(VENV)/bin
# pytest's assertion rewriting of each test module is cached beside its bytecode, but only where Python may
# write bytecode: with PYTHONDONTWRITEBYTECODE set, every pytest process (each xdist worker, the alone tier,
# the sanitizer runs) rewrote all of them again (about 5 s of CPU each). The suite's pytest runs write it.
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/pytest
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt
# What `make demo` installs (the package and its server extra), and what the checks install on top of it.
DEMO_STAMP := $(VENV)/.installed-demo
STAMP := $(VENV)/.installed
# Options for the demo, e.g. DEMO_ARGS="--lines 20000 --world-size 2 --workers 1 --epochs 1 --mini-epochs 1".
DEMO_ARGS ?=
# The native kernels: the install builds them (hatch_build.py, with the same flags); `make native` rebuilds
# them in place when the C file changes. Without a compiler the package runs on numpy (and says so once).
NATIVE_SRC := src/rank_dataset/core/_kernels.c
NATIVE_LIB := src/rank_dataset/core/_kernels.so
NATIVE_FLAGS := -O2 -fPIC -shared -std=c99
# The sanitizer build the kernel tests also run against (make test-asan): gcc's ASan and UBSan, preloaded
# into a Python that was not built with them.
ASAN_CC ?= gcc
ASAN_LIB := build/asan/_kernels.so
# The same without SSE2: the portable 8-byte-word paths that other machines (aarch64) take.
ASAN_WORDS_LIB := build/asan-words/_kernels.so
ASAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -fPIC -shared -std=c99

.PHONY: demo test test-quick lint typecheck bytecode pytest pytest-shared pytest-quick docs bench clean native test-asan

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(DEMO_STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e '.[server]'
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e '.[server,dev,docs]'
	touch $(STAMP)

$(NATIVE_LIB): $(NATIVE_SRC)
	$(CC) $(NATIVE_FLAGS) $(CFLAGS) -o $@ $< || echo "make: the native kernels were not built ($(CC) failed): rank-dataset runs on numpy"

native: $(NATIVE_LIB)

$(ASAN_LIB): $(NATIVE_SRC)
	mkdir -p $(dir $@)
	$(ASAN_CC) $(ASAN_FLAGS) -o $@ $<

$(ASAN_WORDS_LIB): $(NATIVE_SRC)
	mkdir -p $(dir $@)
	$(ASAN_CC) $(ASAN_FLAGS) -U__SSE2__ -o $@ $<

# The kernel tests against the sanitizer builds (SSE2 and words): an out-of-bounds access or undefined
# behaviour fails them. Those that never call the library (the numpy reference's side of a comparison,
# the loader's fallbacks) ran in `make pytest` and are left out here. (--capture=sys: a sanitizer's report
# goes to the terminal, not to pytest.)
test-asan: $(STAMP) $(ASAN_LIB) $(ASAN_WORDS_LIB)
	for lib in $(ASAN_LIB) $(ASAN_WORDS_LIB); do \
	LD_PRELOAD="$$($(ASAN_CC) -print-file-name=libasan.so) $$($(ASAN_CC) -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	RANK_DATASET_NATIVE=require RANK_DATASET_NATIVE_LIB=$$lib \
	$(PYTEST) -q --capture=sys -p no:cacheprovider -m "not no_library" tests/core/test_kernels.py tests/core/test_kernels_fields.py || exit 1; done

demo: $(DEMO_STAMP) native
	$(BIN)/rank-dataset demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks docs examples
	$(BIN)/ruff format --check src tests benchmarks docs examples
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

# The package and the tests' helpers, compiled before a suite: it starts hundreds of interpreters, and with
# PYTHONDONTWRITEBYTECODE set (as in many containers) each would compile them again.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q src tests

# The suite in TEST_WORKERS processes (pytest-xdist, work stealing: the long gloo jobs do not queue behind
# each other), then the few tests marked `alone`, which measure threads or timing and need the machine to
# themselves.
pytest: pytest-shared
	$(PYTEST) -m alone

pytest-shared: $(STAMP) native bytecode
	$(PYTEST) -n $(TEST_WORKERS) --dist worksteal -m "not alone" --durations=20

# The documentation site, into site/ (open site/index.html). Strict: a broken link, anchor or API
# reference fails the build. NO_MKDOCS_2_WARNING quiets Material's banner about its end of life.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The checks and the suite side by side: the suite's processes wait on ranks, servers and sleeps (a fifth
# of the cores' time), which the checks fill. Each one's output is shown whole when it ends, the suite's
# last (`make pytest` alone shows its progress).
test:
	$(MAKE) --no-print-directory -j5 --output-sync=target lint typecheck docs test-asan pytest-shared
	$(PYTEST) -m alone

# Everything but the tests marked slow (torchrun jobs, Lightning, Accelerate, the demo, benchmark smoke
# runs, doc and README examples) and the docs build: a couple of minutes. `make test` runs them all. As
# there, the tests marked `alone` run after the others, by themselves (beside them, a loaded machine fails them).
test-quick:
	$(MAKE) --no-print-directory -j3 --output-sync=target lint typecheck pytest-quick
	$(PYTEST) -m "alone and not slow"

pytest-quick: $(STAMP) native bytecode
	$(PYTEST) -m "not slow and not alone" -n $(QUICK_WORKERS)

bench: $(STAMP) native
	for b in build getitem server workers mix audit group balanced jobstart scale failures collective kernels; do $(BIN)/python benchmarks/bench_$$b.py || exit 1; done
	for m in fork forkserver; do $(BIN)/python benchmarks/bench_memory.py --start-method $$m || exit 1; done

clean:
	rm -rf $(VENV) .venv-3.* .pytest_cache .mypy_cache .ruff_cache site build $(NATIVE_LIB)
	find src tests -name __pycache__ -type d -prune -exec rm -rf {} +
