# Two commands for a newcomer: `make demo` (set up, compile Qwen3-Next-80B, print the report)
# and `make test` (set up, run the whole test suite). Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned, so the wide range in pyproject.toml is already satisfied
	# by the CPU build rather than pulling a multi-gigabyte CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[hf,dev]'
	@command -v dot >/dev/null 2>&1 || { \
	  echo "installing graphviz (dot) with apt-get"; \
	  (apt-get update -qq && apt-get install -y -qq graphviz) >/dev/null 2>&1 || \
	  echo "warning: could not install graphviz; drawings will be skipped"; }
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	mkdir -p out
	$(BIN)/tessera-compile hf:qwen3_next --emit ir -o out/qwen3_next.tir \
	  --summary-json out/qwen3_next.summary.json --partition-json out/qwen3_next.partition.json --report --timing

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q

test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/bench_capture.py
	$(BIN)/python bench/bench_ir_text.py
	$(BIN)/python bench/bench_parse.py
	$(BIN)/python bench/bench_pair_schedule.py
	$(BIN)/python bench/bench_partition.py
	$(BIN)/python bench/bench_cost_model.py

clean:
	rm -rf $(VENV) out build *.egg-info
