# The two commands of the README. Both build the virtual environment themselves on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/demo.yaml

.PHONY: setup demo test typecheck format

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

## demo: the main job on the built-in default (demo model, local Ray, MLflow in runs/demo/mlflow.db)
demo: setup
	$(VENV)/bin/fastvocab run $(CONFIG)

## test: lint, format check and the whole test suite (GPU tests skip with a reason on CPU machines)
test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q

typecheck: setup
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .
