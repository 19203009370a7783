# dpcli — two set-up commands: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test audit man bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[test]"
	rm -f $(VENV)/.installed-* && touch $(STAMP)

demo: $(STAMP)
	rm -rf .demo-state
	DPCLI_STATE_DIR=.demo-state $(BIN)/dpcli budget init demo --mode pure --epsilon 1
	DPCLI_STATE_DIR=.demo-state $(BIN)/python scripts/demo_count.py sample_data/page_views.csv --epsilon 0.25
	DPCLI_STATE_DIR=.demo-state $(BIN)/python scripts/demo_count.py sample_data/page_views.csv --epsilon 0.25
	DPCLI_STATE_DIR=.demo-state $(BIN)/dpcli budget show demo
	DPCLI_STATE_DIR=.demo-state $(BIN)/dpcli budget history demo
	$(BIN)/dpcli budget compose --mode br --epsilon-per 0.15 --count 3000 --calls 30 --delta-per 1e-10 --delta-prime 1e-9

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

audit: $(STAMP)
	$(BIN)/python -m pytest -q

man: $(STAMP)
	$(BIN)/python scripts/gen_man.py man

bench: $(STAMP)
	$(BIN)/python bench/bench_samplers.py

clean:
	rm -rf $(VENV) .demo-state .pytest_cache
