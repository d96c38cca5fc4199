# hp: two commands set everything up on a fresh Debian machine:
#   make demo   venv, Docker engine if missing, images, a default cluster, a job across its nodes
#   make test   the same set-up, then unit and end-to-end tests
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
HP := $(VENV)/bin/hp
DEMO ?= demo
PYTEST_ARGS ?=

.PHONY: all venv docker images demo demo-clean test unit e2e bench clean

all: images

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

docker:
	@bash scripts/ensure-docker.sh

images: venv docker
	$(HP) images build

demo: images
	-@$(HP) delete $(DEMO) >/dev/null 2>&1
	$(HP) create --name $(DEMO)
	$(HP) nodes $(DEMO)
	$(HP) exec $(DEMO) -- srun -N4 hostname
	@echo
	@echo "Cluster '$(DEMO)' is up. Try: $(HP) exec $(DEMO) -- sinfo ; remove it with: $(HP) delete $(DEMO)"

demo-clean: venv
	$(HP) delete $(DEMO)

unit: venv
	$(PY) -m pytest tests/unit -q $(PYTEST_ARGS)

test: images
	$(PY) -m pytest tests -v --durations=15 $(PYTEST_ARGS)

bench: images
	$(PY) bench/create.py

clean:
	rm -rf $(VENV) build *.egg-info
