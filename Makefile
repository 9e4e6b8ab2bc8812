# Runcrate Clusters. `make run` starts the whole product; `make test` runs the whole suite.
# Both need only Python 3.11 (or newer): they create .venv and install into it on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
export PORT

.PHONY: install axe chromium run serve serve-check test test-fast test-lab bench lint typecheck clean lab lab-down

$(BIN)/.installed: pyproject.toml cli/pyproject.toml
	@test -n "$(PYTHON)" || { echo "Python 3.11 is needed (python3.11 or python3)"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "Python 3.11 or newer is needed; $(PYTHON) is older"; exit 1; }
	@echo "Installing into $(VENV) (the first time takes a minute)..."
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install --quiet --disable-pip-version-check -e ./cli -e ".[dev]"
	@touch $@

# axe-core, for the browser tests' accessibility sweep (docs/accessibility.md): its tarball from
# the npm registry, checked against the sha512 pinned here, unpacked into .venv/axe by Python
# (bin/fetch_axe.py: no Node.js needed); never committed, never served from a CDN. Only
# `make test` needs it, so `make run` installs nothing more.
AXE_VERSION := 4.10.3
AXE_INTEGRITY := sha512-Xm7bpRXnDSX2YE2YFfBk2FnF0ep6tmG7xPh8iHee8MIcrgq762Nkce856dYtJYLkuIoYZvGfTs/PbZhideTcEg==
AXE_DIR := $(VENV)/axe
AXE_STAMP := $(AXE_DIR)/.installed-$(AXE_VERSION)

$(AXE_STAMP): $(BIN)/.installed
	@echo "Fetching axe-core $(AXE_VERSION) into $(AXE_DIR)..."
	@rm -rf $(AXE_DIR)
	@$(BIN)/python bin/fetch_axe.py --version $(AXE_VERSION) --integrity $(AXE_INTEGRITY) --into $(AXE_DIR)
	@touch $@

# Debian's Chromium, which the browser tests drive through Playwright (tests/conftest.py reads
# it at /usr/bin/chromium). `make test` checks for it first: as root it installs it with apt;
# anyone else is stopped at once with the one command to run. CHROMIUM and APT_GET are here so
# a test can point them elsewhere (tests/runcrate/test_make_chromium.py).
CHROMIUM ?= /usr/bin/chromium
APT_GET ?= apt-get

chromium:
	@if [ ! -x "$(CHROMIUM)" ]; then \
		if [ "$$(id -u)" != 0 ]; then \
			echo "make test needs Chromium at $(CHROMIUM) for the browser tests. Install it with:"; \
			echo ""; \
			echo "    sudo apt-get install -y chromium"; \
			echo ""; \
			exit 2; \
		fi; \
		echo "Installing Chromium for the browser tests (apt-get install chromium)..."; \
		$(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq chromium >/dev/null \
			|| { echo "apt-get could not install chromium: install Chromium at $(CHROMIUM)"; exit 2; }; \
		test -x "$(CHROMIUM)" || { echo "apt-get installed chromium, but $(CHROMIUM) is still missing"; exit 2; }; \
	fi

install: $(BIN)/.installed

axe: $(AXE_STAMP)

run: install
	@echo "Preparing the database..."
	@$(BIN)/python manage.py migrate --noinput --verbosity 0
	@$(BIN)/python manage.py seed_demo
	@$(BIN)/python bin/run.py

# The production set (README, "Running it for real"): DEBUG off, the Procfile's processes under
# bin/serve.py, which restarts any that dies (honcho stopped them all). The environment is
# checked before anything is installed or started.
serve: serve-check install
	@DEBUG=false $(BIN)/python manage.py migrate --noinput
	@DEBUG=false $(BIN)/python manage.py collectstatic --noinput --verbosity 0
	@# Every process sends the same address in emails and to agents (each gets its own PORT).
	@DEBUG=false SITE_URL="$${SITE_URL:-http://localhost:$(PORT)}" PATH="$(CURDIR)/$(BIN):$$PATH" \
		exec $(BIN)/python bin/serve.py

serve-check:
	@test -n "$$SECRET_KEY" || { echo "make serve needs SECRET_KEY: a long random secret, the same for every process (e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(50))')"; exit 2; }
	@test -n "$$DATABASE_URL" || { echo "make serve needs DATABASE_URL, e.g. postgres://user:password@127.0.0.1:5432/runcrate"; exit 2; }
	@test -n "$$REDIS_URL" || echo "make serve: no REDIS_URL, so the broker is files in $(or $(RUNCRATE_VAR_DIR),var)/broker: every process must run on this machine"

# The whole suite, in two parts. First, in one process, tests/lab: the lab's own tests, which
# take the whole lab down and bring it up again, so nothing else may use it meanwhile (seconds).
# Then everything else on three pytest-xdist workers (tests/workers.py): the lab's modules first
# (tests/tiers.py puts them at the front, then the other slow modules), each whole on one worker
# and on GPU hosts of that worker's own, then every other module on whichever worker is free.
# Three on two cores, because the lab's tests mostly wait on their hosts. Each part ends with a table
# of its tiers' time; a part that fails does not stop the other, and make test fails if either
# did. WORKERS=0 runs it all in one process; with PYTEST_ARGS (a selection, say) it is one run
# on the workers, where tests/lab's tests that need the lab to themselves skip.
WORKERS ?= 3
XDIST = -p tests.workers -n $(WORKERS) --dist loadfile --no-loadscope-reorder
LAB_ALONE := tests/lab

test: chromium install axe
ifeq ($(WORKERS),0)
	$(BIN)/python -m pytest $(PYTEST_ARGS)
else ifneq ($(strip $(PYTEST_ARGS)),)
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)
else
	@status=0; \
	echo "$(BIN)/python -m pytest $(LAB_ALONE)"; \
	$(BIN)/python -m pytest $(LAB_ALONE) || status=1; \
	echo "$(BIN)/python -m pytest $(XDIST) --ignore=$(LAB_ALONE)"; \
	$(BIN)/python -m pytest $(XDIST) --ignore=$(LAB_ALONE) || status=1; \
	exit $$status
endif

# The tiers (docs/testing.md): a developer's loop without the lab, the browser, the tests that
# start processes of their own and the fuzz run (no root, no Chromium), a module to a worker on
# two pytest-xdist workers, each with its own database, Redis databases and var folder
# (tests/workers.py: a -p plugin, so that it acts before Django reads its settings; python -m
# puts the checkout on the path it is imported from); the host lab alone (root).
FAST_TESTS := not lab and not browser and not procs and not fuzz

test-fast: install
	$(BIN)/python -m pytest -p tests.workers -m "$(FAST_TESTS)" -n 2 --dist loadfile $(PYTEST_ARGS)

test-lab: install
	@status=0; \
	$(BIN)/python -m pytest -m lab $(LAB_ALONE) $(PYTEST_ARGS) || status=1; \
	$(BIN)/python -m pytest -m lab $(XDIST) --ignore=$(LAB_ALONE) $(PYTEST_ARGS) || status=1; \
	exit $$status

bench: install
	@$(BIN)/python -m bench

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# mypy with django-stubs over the product packages (pyproject.toml [tool.mypy]).
typecheck: install
	$(BIN)/mypy

# The host lab (docs/lab.md): real hosts in namespaces on this machine, loaded as ssh-driven
# hosts of locations `lab` and `lab-gw`. Linux and root only; the first run builds its image.
LAB_HOSTS ?= 3
LAB_GATEWAY_HOSTS ?= 0
LAB_DIR := $(or $(RUNCRATE_VAR_DIR),var)/lab

lab: install
	@$(BIN)/python manage.py migrate --noinput -v0
	@# The demo first (only into an empty database): its user then sees the lab's offers too.
	@$(BIN)/python manage.py seed_demo
	@mkdir -p $(LAB_DIR)
	@$(BIN)/python manage.py operator_ssh_key > $(LAB_DIR)/operator.out
	@tail -n1 $(LAB_DIR)/operator.out > $(LAB_DIR)/operator.pub && rm -f $(LAB_DIR)/operator.out
	@$(BIN)/python -m lab up --hosts $(LAB_HOSTS) --authorized-key-file $(LAB_DIR)/operator.pub \
		--inventory $(LAB_DIR)/inventory.json --gateway-hosts $(LAB_GATEWAY_HOSTS)
	@# The hosts are fresh: loading them records their baselines, what every reimage is
	@# verified against (docs/inventory.md).
	@$(BIN)/python manage.py load_inventory $(LAB_DIR)/inventory.json
	@echo ""
	@echo "  The host lab is up: lab-1..lab-$(LAB_HOSTS) (172.30.77.11...) and the SSH gateway"
	@echo "  lab-gw (172.30.77.10), loaded as ssh hosts of locations lab and lab-gw"
	@echo "  ($(LAB_DIR)/inventory.json). The operator's key ($(LAB_DIR)/operator.pub) logs in as root."
	@echo ""
	@echo "  Start the product where the hosts' agents reach it:  HOST=172.30.77.1 make run"
	@echo "  Inside a host:   .venv/bin/python -m lab exec lab-1 -- hostname"
	@echo "  What is up:      .venv/bin/python -m lab status"
	@echo "  Take it down:    make lab-down"

lab-down:
	@$(or $(wildcard $(BIN)/python),python3) -m lab down

# The virtualenv and build leftovers only: var/ holds the SQLite database and sent mail.
clean:
	rm -rf $(VENV) build *.egg-info
