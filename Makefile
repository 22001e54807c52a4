# Set-up and everyday commands. Each target creates or updates the project environment .venv itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.hybridcache-installed
PIP := $(BIN)/python -m pip --disable-pip-version-check

.PHONY: install test serve lint clean

install: $(STAMP)

# Re-runs only when the dependency list (or this recipe) changed. Without an NVIDIA GPU, torch is
# pinned to the CPU build first, so the project install finds it satisfied and never pulls a CUDA build.
$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "install: NVIDIA GPU found: default torch build"; \
	else \
		echo "install: no NVIDIA GPU: torch CPU build (torch==2.13.0)"; \
		$(PIP) install -q torch==2.13.0; \
	fi
	$(PIP) install -q -e '.[test]'
	@$(BIN)/python -c "import hybridcache, torch, transformers, msgspec, aiohttp"
	@touch $(STAMP)

lint: install
	$(BIN)/ruff check hybridcache tests

test: install lint
	$(BIN)/python -m pytest -q

serve: install
	$(BIN)/hybridcache serve

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
