# One command to run the service, one to run the tests; both set themselves up.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup run test lint bench clean

$(BIN)/lightpath: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[server,dev]'
	touch $(BIN)/lightpath

setup: $(BIN)/lightpath

run: setup
	$(BIN)/lightpath serve

test: setup
	$(BIN)/ruff check .
	$(BIN)/mypy app lightpath_client
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .lightpath
