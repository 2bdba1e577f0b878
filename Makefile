# The two commands of the README. Both build the virtual environment themselves on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(abspath $(VENV))/bin
CONFIG ?= configs/demo.yaml
# The rooms (docs/ARCHITECTURE.md); setup.py installs each as fastvocab.<room>.
ROOMS := artifacts_schema kernels decoding tasks experiments training pipeline
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# The strict editable install's link tree: fastvocab/ laid out as in the wheel, one link per packaged file.
# lint-imports and mypy run inside it; from the repository root they would find fastvocab/ with
# __init__.py alone, since they put the current directory first on their path.
LINK_TREE := build/__editable__.fastvocab-$(VERSION)-py3-none-any

.PHONY: setup demo test typecheck format FORCE

# Python keeps the bytecode it compiles in the venv even where the environment says not to: with
# PYTHONDONTWRITEBYTECODE set, every process (each CLI run of the tests, each Ray worker of the pipeline)
# compiled torch, transformers, Ray and MLflow from source again, ~8 s a process on 2 cores, and a fresh
# clone's test suite took twice as long as a warm one.
unexport PYTHONDONTWRITEBYTECODE

setup: $(VENV)/.fastvocab-installed

# The pinned dependencies (slow): only when requirements.txt changes. An existing venv is kept.
# --no-compile: pip would byte-compile every installed module (torch, Ray, MLflow: ~70 of the ~130 s on 2
# cores); Python compiles the few thousand it imports on first use instead (see the unexport below).
$(VENV)/.requirements-installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile -r requirements.txt
	touch $@

# fastvocab itself (a few seconds). No build isolation: pip builds it with the pinned setuptools and fetches
# nothing. Editable in strict mode, chosen by trying both: setuptools links every packaged file into
# $(LINK_TREE) and puts that folder on the path, so the checkout imports what the wheel ships, and lint-imports
# and mypy read the whole package there. The default mode's import hook also imports files the wheel would not
# ship, and static tools cannot follow it (lint-imports found fastvocab/__init__.py and nothing else). The cost
# of strict mode: an edited file counts at once, but a new, removed or renamed one needs this install again,
# which make runs whenever the list of the package's files (below) changes.
$(VENV)/.fastvocab-installed: $(VENV)/.requirements-installed pyproject.toml setup.py build/package-files.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation --config-settings editable_mode=strict -e .
	touch $@

# The files fastvocab is made of, rewritten only when that list changes (not when a file is edited).
build/package-files.txt: FORCE
	@mkdir -p build
	@find fastvocab $(ROOMS) -type f -not -path '*/__pycache__/*' | LC_ALL=C sort > $@.new
	@if cmp -s $@.new $@; then rm $@.new; else mv $@.new $@; fi

## demo: the main job on the built-in default (demo model, local Ray, MLflow in runs/demo/mlflow.db)
demo: setup
	$(VENV)/bin/fastvocab run $(CONFIG)

## test: lint, format check, the import contracts (pyproject.toml [tool.importlinter]), the type check and the
## whole test suite (GPU tests skip with a reason on CPU machines)
test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	cd $(LINK_TREE) && $(BIN)/lint-imports --config $(CURDIR)/pyproject.toml --no-cache --no-logo
	$(MAKE) --no-print-directory typecheck
	$(PY) -m pytest -q

## typecheck: mypy over every room (pyproject.toml [tool.mypy]; ~50 s from an empty cache on 2 cores)
typecheck: setup
	cd $(LINK_TREE) && $(BIN)/mypy --config-file $(CURDIR)/pyproject.toml --cache-dir $(CURDIR)/.mypy_cache

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .
