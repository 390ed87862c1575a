# Every recipe calls the Python tool (or the one set-up script). `make help` lists the targets.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# The default image: the matrix entry marked `default: true` (built end to end by CI).
DEFAULT_TAG = $(shell $(PY) -c 'from builder.model import matrix; print(matrix.load().default.tag)')
# Every base CI builds on (`ci: true` entries, the default first), as name:tag[@digest] words.
CI_BASES = $(shell $(PY) -c 'from builder.model import matrix; m = matrix.load(); es = [m.default] + [e for e in m.entries if e.ci and not e.default]; print(" ".join(dict.fromkeys(e.base for e in es)))')
TAG ?=
BUILD_FLAGS ?= --local-base
SMOKE_FLAGS ?=
GPU_CHECK_FLAGS ?=
PYTEST_FLAGS ?=

.PHONY: help venv docker validate render lock lint unit test test-docker20 test-docker-newest build build-all smoke image publish catalog verify repro \
	free-disk workflow gpu-check propose propose-pr

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "} {printf "  %-12s %s\n", $$1, $$2}'

# pip installs only uv (its hash-checked entry of the same file), uv the rest: 10 s instead of pip's 30 s.
UV_ENTRY = awk '/^uv==/{p=1;print;next} p&&/^ /{print;next} {p=0}' requirements-dev.txt
$(VENV)/.stamp: requirements-dev.txt
	python3 -m venv $(VENV) && $(VENV)/bin/pip install -q --require-hashes --no-deps -r <($(UV_ENTRY)) \
	  && $(VENV)/bin/uv pip install -q --python $(VENV)/bin/python --require-hashes --no-deps -r requirements-dev.txt \
	  && touch $@

venv: $(VENV)/.stamp ## create .venv from the pinned dev requirements

docker: venv ## install/start a Docker engine, cosign, and every CI entry's base image (idempotent)
	bash ci/setup-docker.sh $(CI_BASES) && bash ci/setup-cosign.sh

validate: venv ## validate the matrix strictly (schema, rules, digests)
	$(PY) -m builder validate --strict

render: venv ## render dockerfiles/ and the README table
	$(PY) -m builder render

lock: venv ## re-lock TAG (default: every entry) against its index
	$(PY) -m builder lock $(TAG) $(BUILD_FLAGS)

propose: venv ## append a matrix entry for PyPI's newest torch and stack releases, if new and the rules accept it
	$(PY) -m builder propose

# The workflow's `propose` job, after propose, lock and render: TAG (the proposed tag, from its environment) goes to
# GitHub as branch propose/TAG with a pull request. Needs git and gh with GH_TOKEN; a branch already there (last
# week's proposal, not merged yet) is left as it is.
propose-pr: ## push TAG's proposal as branch propose/TAG and open its pull request (the workflow's last step)
	@test -n "$(TAG)" || { echo "propose-pr: TAG is required (the tag propose wrote)" >&2; exit 2; }
	gh auth setup-git
	@if git ls-remote --exit-code --heads origin "propose/$(TAG)" >/dev/null; then \
	  echo "propose-pr: propose/$(TAG) exists already (an open proposal): nothing pushed"; exit 0; fi; \
	git switch -c "propose/$(TAG)" && git add -A matrix.yaml README.md locks dockerfiles \
	  && git -c user.name="github-actions[bot]" -c user.email="41898282+github-actions[bot]@users.noreply.github.com" \
	     commit -q -m "matrix: propose $(TAG) (newest releases on PyPI)" \
	  && git push origin "propose/$(TAG)" \
	  && gh pr create --base "$${GITHUB_REF_NAME:-main}" --head "propose/$(TAG)" --title "matrix: propose $(TAG)" \
	     --body "Proposed by the scheduled run (python -m builder propose): PyPI's newest torch and stack releases, \
	validated against compat.yaml, locked and rendered. This pull request's jobs build and gate it."

build-tools-lock: venv ## re-lock builder/data/build-tools.lock (uv, used inside image builds) from build-tools.in
	$(VENV)/bin/uv pip compile builder/data/build-tools.in --generate-hashes --python-platform x86_64-manylinux_2_28 \
	  --python-version 3.10 --no-header -q -o build/build-tools.lock.new
	{ sed -n '1,2p' builder/data/build-tools.lock; cat build/build-tools.lock.new; } > build/build-tools.lock.tmp \
	  && mv build/build-tools.lock.tmp builder/data/build-tools.lock && rm build/build-tools.lock.new

# hadolint's threshold is `warning`: the rendered files' info-level findings (SC2016, SC2012) are intended quoting
# and listing; CI's check job and tests/unit/test_render.py use this same threshold (tests/unit/test_workflows.py).
HADOLINT_THRESHOLD := warning

lint: venv ## ruff, render --check, lock --check, hadolint (the check job runs exactly this)
	$(PY) -m ruff check builder smoke tests bench && $(PY) -m builder render --check && $(PY) -m builder lock --check \
	  && $(VENV)/bin/hadolint --failure-threshold $(HADOLINT_THRESHOLD) dockerfiles/*/Dockerfile

# The unit tests share no state (no engine, no network, their own tmp dirs): pytest-xdist runs them on
# UNIT_WORKERS processes (CI's machine has 2 cores). The rest share one Docker engine: serial, and the 30
# slowest are listed at the end (CI's 75-minute budget is spent there).
UNIT_WORKERS ?= 2

unit: venv ## the unit tests only: no Docker engine, no network, under a minute
	$(PY) -m pytest tests/unit -n $(UNIT_WORKERS) $(PYTEST_FLAGS)

test: venv docker ## the whole suite: unit tests, the workflow harness, real Docker builds, registry, gate
	$(PY) -m pytest tests/unit -n $(UNIT_WORKERS) $(PYTEST_FLAGS)
	$(PY) -m pytest tests/workflow tests/integration -m "not docker20 and not docker_newest" --durations=30 $(PYTEST_FLAGS)

test-docker20: venv docker ## Docker 20.10 without buildx (Debian 12's docker.io) on a private engine: build, gate, publish
	PRIVATE_ENGINE_REQUIRED=1 $(PY) -m pytest tests/integration/test_docker20.py -m docker20 $(PYTEST_FLAGS)

test-docker-newest: venv docker ## the newest Docker Debian ships (28) on a private engine: build, gate, publish, a pin change (the workflow's weekly newest-docker job)
	bash ci/setup-docker-newest.sh
	PRIVATE_ENGINE_REQUIRED=1 $(PY) -m pytest tests/integration/test_docker_newest.py -m docker_newest -s $(PYTEST_FLAGS)

workflow: venv ## run the workflow's hosted jobs' steps here, per event (tests/workflow; no image builds)
	$(PY) -m pytest tests/workflow $(PYTEST_FLAGS)

# The import check first (resolve --import-check): a pin pair that installs but does not import stops here, in a
# throwaway venv from uv's cache, before the image build.
build: venv ## build TAG (default: the default image) with BuildKit, after its import check
	$(PY) -m builder resolve --import-check $(or $(TAG),$(DEFAULT_TAG))
	$(PY) -m builder build $(or $(TAG),$(DEFAULT_TAG)) $(BUILD_FLAGS)

build-all: venv ## build every entry
	$(PY) -m builder build --all $(BUILD_FLAGS)

smoke: venv ## run the smoke gate in the built TAG image
	$(PY) -m builder smoke $(or $(TAG),$(DEFAULT_TAG)) $(SMOKE_FLAGS)

image: venv docker ## the main job: Docker set-up, then import-check, build and smoke-test the default image
	$(PY) -m builder resolve --import-check $(DEFAULT_TAG) && $(PY) -m builder build $(DEFAULT_TAG) $(BUILD_FLAGS) \
	  && $(PY) -m builder smoke $(DEFAULT_TAG) $(SMOKE_FLAGS)

publish: venv ## publish TAG to REGISTRY (only if its smoke report passed)
	$(PY) -m builder publish $(or $(TAG),$(DEFAULT_TAG)) --registry $(REGISTRY)

free-disk: ## on a GitHub-hosted runner only: remove preinstalled SDKs (~14 GB free is too little for a CUDA image)
	@if [ "$$RUNNER_ENVIRONMENT" = github-hosted ]; then \
	  sudo rm -rf /usr/share/dotnet /usr/local/lib/android /opt/ghc /opt/hostedtoolcache/CodeQL && df -h /; \
	else echo "free-disk: not a GitHub-hosted runner (RUNNER_ENVIRONMENT=$${RUNNER_ENVIRONMENT:-unset}): nothing removed"; fi

catalog: venv ## regenerate IMAGES.md and images.json from the reports
	$(PY) -m builder catalog

verify: venv ## re-verify a pulled IMAGE on this host
	$(PY) -m builder verify $(IMAGE)

repro: venv ## rebuild TAG from scratch beside the existing image and compare contents
	$(PY) -m builder repro $(or $(TAG),$(DEFAULT_TAG)) $(BUILD_FLAGS)

gpu-check: ## on a GPU machine (no venv, no network): build DeepSpeed's ops there, run smoke all (OUT=dir)
	scripts/gpu-check $(if $(OUT),--out $(OUT)) $(GPU_CHECK_FLAGS)
