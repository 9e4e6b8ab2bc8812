# Runcrate Clusters. `make run` starts the whole product; `make test` runs the whole suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
export PORT

.PHONY: install run test bench lint check clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet ".[dev]"
	touch $@

install: $(BIN)/.installed

run: install
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py seed_demo
	$(BIN)/python bin/run.py

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install
	$(BIN)/python manage.py bench

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) var
