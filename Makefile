# hp: two commands set everything up on a fresh Debian machine:
#   make demo   venv, Docker engine if missing, images, a default cluster, a job across its nodes
#   make test   the same set-up, then lint, unit tests (with coverage) and end-to-end tests
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
HP := $(VENV)/bin/hp
DEMO ?= demo
PYTEST_ARGS ?=
COVERAGE_MIN ?= 85
# e2e and fault tests side by side: they mostly wait for containers and daemons
E2E_WORKERS ?= 4

.PHONY: all venv docker images images-all demo demo-clean test lint unit e2e faults bench clean

all: images

# hp's own modules compiled at every `make`: an editable install compiles nothing, and where
# PYTHONDONTWRITEBYTECODE is set (this machine's shells) Python then compiles every module an
# hp command imports, at every command: +60 ms for `hp exec`, +80 ms before create's first step
venv: $(VENV)/.installed
	@$(PY) -m compileall -q -j 0 orchestrator
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

docker:
	@bash scripts/ensure-docker.sh

images: venv docker
	$(HP) images build

# every other Slurm release's images too, for the tests (tests/e2e/test_upgrade.py starts a
# cluster on 24.11 and upgrades it; make e2e runs the tests marked `releases` on each other release)
images-all: images
	@for r in $$($(PY) -c 'from orchestrator.releases import DEFAULT, RELEASES; print(*(r for r in RELEASES if r != DEFAULT))'); do \
		echo "$(HP) images build --slurm $$r"; $(HP) images build --slurm $$r || exit 1; done

demo: images
	@$(HP) delete $(DEMO) --missing-ok
	$(HP) create --name $(DEMO)
	$(HP) nodes $(DEMO)
	$(HP) exec $(DEMO) -- srun -N4 hostname
	@echo
	@echo "Cluster '$(DEMO)' is up. Try: $(HP) exec $(DEMO) -- sinfo ; remove it with: $(HP) delete $(DEMO)"

demo-clean: venv
	$(HP) delete $(DEMO)

lint: venv
	$(VENV)/bin/ruff check orchestrator tests bench
	$(VENV)/bin/ruff format --check orchestrator tests bench

# unit tests: pure logic and orchestration against the in-memory fakes (tests/fakes.py), with coverage
unit: venv
	$(PY) -m pytest tests/unit -q -n 2 --cov=orchestrator --cov-report=term --cov-fail-under=$(COVERAGE_MIN) $(PYTEST_ARGS)

# e2e and fault tests on E2E_WORKERS xdist workers (tests that share a module's cluster are one
# xdist_group), beside them the tests marked `releases` on every other Slurm release
# (OTHER_WORKERS workers), then the `serial` ones alone (the engine restart disturbs every other
# test): scripts/e2e.sh
OTHER_WORKERS ?= 2
e2e: images-all
	@PY=$(PY) E2E_WORKERS=$(E2E_WORKERS) OTHER_WORKERS=$(OTHER_WORKERS) PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/e2e.sh

# the long fault campaign (by hand): HP_FAULT_POINTS=200 make faults
faults: images
	HP_FAULTS_LONG=1 $(PY) -m pytest tests/faults -v $(PYTEST_ARGS)

# every phase timed (scripts/test-phases.sh): venv, docker, images, lint, unit, e2e
test:
	@bash scripts/test-phases.sh

bench: images
	$(PY) bench/create.py

clean:
	rm -rf $(VENV) build dist *.egg-info
