# compactd — the two commands that matter: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench clean services

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip
	@$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

services:
	@bash scripts/ensure-services.sh

lint: $(STAMP)
	$(BIN)/ruff check pipeline storage tasks compactd gateway tests bench scripts
	$(BIN)/mypy pipeline storage compactd tasks gateway

test: $(STAMP) services
	@bash scripts/ensure-pi-oracle.sh
	$(MAKE) lint
	@# loadfile: a module's tests share one Redis DB and its worker subprocesses, so they must
	@# run in one xdist process (a second copy of the fixture would start rival workers).
	$(BIN)/pytest -q -n 2 --dist loadfile -p no:cacheprovider

demo: $(STAMP)
	@bash examples/demo.sh

bench: $(STAMP) services
	$(BIN)/python bench/plan.py
	$(BIN)/python bench/retention.py
	$(BIN)/python -m bench.fanout
	$(BIN)/python -m bench.sweep

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
