# Runcrate Clusters. `make run` starts the whole product; `make test` runs the whole suite.
# Both need only Python 3.11 (or newer): they create .venv and install into it on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
export PORT

.PHONY: install run test bench lint clean

$(BIN)/.installed: pyproject.toml
	@test -n "$(PYTHON)" || { echo "Python 3.11 is needed (python3.11 or python3)"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "Python 3.11 or newer is needed; $(PYTHON) is older"; exit 1; }
	@echo "Installing into $(VENV) (the first time takes a minute)..."
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install --quiet --disable-pip-version-check ".[dev]"
	@touch $@

install: $(BIN)/.installed

run: install
	@echo "Preparing the database..."
	@$(BIN)/python manage.py migrate --noinput --verbosity 0
	@$(BIN)/python manage.py seed_demo
	@$(BIN)/python bin/run.py

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install
	@$(BIN)/python manage.py bench

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The virtualenv and build leftovers only: var/ holds the SQLite database and sent mail.
clean:
	rm -rf $(VENV) build *.egg-info
