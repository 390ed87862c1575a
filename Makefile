# Every recipe is one line that calls the Python tool. `make help` lists the targets.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
TAG ?= $(shell test -x $(PY) && $(PY) -m builder matrix 2>/dev/null | $(PY) -c 'import json,sys; print(next(r["tag"] for r in json.load(sys.stdin)["include"] if not r["gpu"]))')
BUILD_FLAGS ?=
SMOKE_FLAGS ?= --cpu
PYTEST_FLAGS ?=

.PHONY: help venv validate render lint test build build-all smoke image lock

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "} {printf "  %-12s %s\n", $$1, $$2}'

$(VENV)/.stamp: requirements-dev.txt pyproject.toml
	python3 -m venv $(VENV) && $(VENV)/bin/pip install -q --no-deps -r requirements-dev.txt && $(VENV)/bin/pip install -q --no-deps -e . && touch $@

venv: $(VENV)/.stamp ## create .venv from the pinned dev requirements

validate: venv ## validate the matrix strictly (schema, rules, digests)
	$(PY) -m builder validate --strict

render: venv ## render dockerfiles/ and the README table
	$(PY) -m builder render

lock: venv ## re-lock TAG (default: all) against the index
	$(PY) -m builder lock $(TAG_ARG)

lint: venv ## ruff, render --check, lock --check, hadolint
	$(PY) -m ruff check builder smoke tests bench && $(PY) -m builder render --check && $(PY) -m builder lock --check && $(PY) -m builder lint

test: venv ## run the test suite
	$(PY) -m pytest $(PYTEST_FLAGS)

build: venv ## build TAG (default: the CI entry) with BuildKit
	$(PY) -m builder build $(TAG) $(BUILD_FLAGS)

build-all: venv ## build every entry
	$(PY) -m builder build --all $(BUILD_FLAGS)

smoke: venv ## run the smoke gate in the built TAG image
	$(PY) -m builder smoke $(TAG) $(SMOKE_FLAGS)

image: venv ## the main job: set up Docker if needed, build and smoke-test the default image
	bash ci/setup-docker.sh && $(PY) -m builder build $(TAG) --local-base-if-missing $(BUILD_FLAGS) && $(PY) -m builder smoke $(TAG) $(SMOKE_FLAGS)
