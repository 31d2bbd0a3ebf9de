# agentrl: every entry point a developer or CI uses. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
PIP := $(PYTHON) -m pip
EXTRAS ?= local,dev,megatron

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

.PHONY: install
install: ## Install agentrl with the local-run and developer extras (editable)
	$(PIP) install --disable-pip-version-check -q -e '.[$(EXTRAS)]'

HF_MODEL := .agentrl/models/qwen3-mini
HF_TRACES := .agentrl/traces/toy.jsonl

.PHONY: run
run: install ## Install, then the main job on this machine: an HF-format model, SFT warm start, GRPO
	@test -f $(HF_MODEL)/config.json || agentrl model create $(HF_MODEL) --preset mini --seed 0
	@test -f $(HF_TRACES) || agentrl tasks traces examples/quickstart-hf.yaml --out $(HF_TRACES)
	agentrl run examples/quickstart-hf.yaml

.PHONY: run-tiny
run-tiny: install ## The built-in tiny policy's quickstart: the whole loop in about 5 minutes, no HF model
	agentrl run examples/quickstart.yaml

.PHONY: test
test: install ## The whole suite, as CI runs it: lint, mypy, prepare, every test (50-70 min on 2 cores)
	bash scripts/test.sh

.PHONY: test-fast
test-fast: install ## Lint, mypy and the unit tests of pure code on every core: no prepare, no cluster, no processes (about 2 min)
	bash scripts/test.sh --fast

.PHONY: lint
lint: ## ruff and the import-layer contracts
	ruff check operator tests e2e bench
	lint-imports

.PHONY: typecheck
typecheck: ## mypy --strict on the API and the pure reconcile layer
	mypy

.PHONY: crds
crds: ## Regenerate crds/ and the chart's CRD template from the models
	agentrl crds --write crds/
	agentrl crds --helm --write charts/agentrl/templates/crds/

.PHONY: wire-schema
wire-schema: ## Pin the wire contract's schema under its version (tests/api/wire_schemas/)
	$(PYTHON) scripts/wire_schema.py

.PHONY: helm-lint
helm-lint: ## helm lint --strict on the chart
	helm lint --strict charts/agentrl

.PHONY: docs
docs: ## Regenerate docs/manifest.md from the models
	agentrl docs --write docs/manifest.md

.PHONY: cluster
cluster: ## Start the local control plane (kube-apiserver, etcd, kcm, scheduler, kwok)
	agentrl dev cluster up

.PHONY: cluster-down
cluster-down: ## Stop the local control plane
	agentrl dev cluster down

.PHONY: bench
bench: ## Run the CPU benchmarks (each prints one JSON object)
	$(PYTHON) bench/operator_apply.py --jobs 100 --json
	$(PYTHON) bench/rollout_concurrency.py --concurrency 2048 --json
	$(PYTHON) bench/stop_grace.py --json
	$(PYTHON) bench/local_learning.py

.PHONY: images
images: ## Build the images locally (cpu flavour, buildah, no registry) into ~/.cache/agentrl/images
	agentrl dev images

.PHONY: images-rocm
images-rocm: ## Build the images from their registry (ROCm) bases with docker (images/Makefile)
	$(MAKE) -C images all
