# Two commands for a newcomer: `make demo` (set up, compile Qwen3-Next-80B, print the report)
# and `make test` (set up, run the whole test suite). Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast lint sanitize bench clean plan-op-tables

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned, so the wide range in pyproject.toml is already satisfied
	# by the CPU build rather than pulling a multi-gigabyte CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	# The C++ runtime's build tools stay in the venv, so the editable install can
	# rebuild runtime._core on import after a change to runtime/csrc.
	$(BIN)/pip install --quiet 'scikit-build-core>=0.10' 'pybind11>=2.11'
	command -v cmake >/dev/null 2>&1 || $(BIN)/pip install --quiet 'cmake>=3.18'
	command -v ninja >/dev/null 2>&1 || $(BIN)/pip install --quiet ninja
	$(BIN)/pip install --quiet --no-build-isolation -e '.[hf,dev]'
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

# mypy twice: the packages, benchmarks and examples with every definition annotated (pyproject.toml),
# then the tests, whose helpers need not be.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/mypy --allow-untyped-defs tests
	$(BIN)/pytest -q
	$(MAKE) --no-print-directory sanitize

# The C++ runtime built with AddressSanitizer and UndefinedBehaviorSanitizer: its
# native self-test (threads included) on generated plans, then the Python runtime
# tests against the sanitized extension.
SANITIZE_DIR := build/sanitize
sanitize: $(STAMP)
	cmake -S . -B $(SANITIZE_DIR) -G Ninja -DTESSERA_SANITIZE=ON -DPython_EXECUTABLE=$(abspath $(BIN)/python) \
	  -Dpybind11_DIR=$$($(BIN)/python -m pybind11 --cmakedir) >/dev/null
	cmake --build $(SANITIZE_DIR)
	$(BIN)/python tests/program_gen.py $(SANITIZE_DIR)/plans
	$(SANITIZE_DIR)/runtime_selftest $(SANITIZE_DIR)/plans/*.tsb
	# libstdc++ is preloaded beside libasan so its exception interceptors resolve in python.
	ASAN_OPTIONS=detect_leaks=0:hard_rss_limit_mb=6000 LD_PRELOAD="$$(g++ -print-file-name=libasan.so) $$(g++ -print-file-name=libstdc++.so)" \
	  TESSERA_RUNTIME_EXTENSION=$$(ls $(abspath $(SANITIZE_DIR))/_core*.so) \
	  $(BIN)/pytest -q -p no:cacheprovider tests/runtime --ignore=tests/runtime/test_pair_executor.py \
	  --ignore=tests/runtime/test_training_torchrun.py --ignore=tests/runtime/test_executor_local.py \
	  --ignore=tests/runtime/test_backward_split.py --ignore=tests/runtime/test_moe_binding.py \
	  --ignore=tests/runtime/test_pipelining_export.py --ignore=tests/runtime/test_hf_bindings.py \
	  --ignore=tests/runtime/test_train_hf_example.py --ignore=tests/runtime/test_session_hf_conventions.py
	# The pair-schedule search and its z3 proofs (passes/scheduling/csrc) under the same sanitizers.
	ASAN_OPTIONS=detect_leaks=0:hard_rss_limit_mb=6000 LD_PRELOAD="$$(g++ -print-file-name=libasan.so) $$(g++ -print-file-name=libstdc++.so)" \
	  TESSERA_SEARCH_EXTENSION=$$(ls $(abspath $(SANITIZE_DIR))/_search*.so) \
	  TESSERA_PROOF_EXTENSION=$$(ls $(abspath $(SANITIZE_DIR))/_proof*.so) \
	  $(BIN)/pytest -q -p no:cacheprovider tests/passes/scheduling tests/passes/test_overlap_schedule.py
	# The contention model's event loop (passes/costs/csrc) under the same sanitizers.
	ASAN_OPTIONS=detect_leaks=0:hard_rss_limit_mb=6000 LD_PRELOAD="$$(g++ -print-file-name=libasan.so) $$(g++ -print-file-name=libstdc++.so)" \
	  TESSERA_RETIME_EXTENSION=$$(ls $(abspath $(SANITIZE_DIR))/_retime*.so) \
	  $(BIN)/pytest -q -p no:cacheprovider tests/passes/costs/test_retime_native.py tests/passes/costs/test_contention.py
	# The simulator's action loop (passes/simulation/csrc) under the same sanitizers.
	ASAN_OPTIONS=detect_leaks=0:hard_rss_limit_mb=6000 LD_PRELOAD="$$(g++ -print-file-name=libasan.so) $$(g++ -print-file-name=libstdc++.so)" \
	  TESSERA_ACTION_EXTENSION=$$(ls $(abspath $(SANITIZE_DIR))/_action*.so) \
	  $(BIN)/pytest -q -p no:cacheprovider tests/simulation

test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not slow"

# Rewrite docs/ir.md's plan op tables from their declarations (tessera_ir/plan_ops.py).
plan-op-tables: $(STAMP)
	$(BIN)/python -c 'from tessera_ir.plan_ops import regenerate; regenerate("docs/ir.md")'

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/mypy --allow-untyped-defs tests

bench: $(STAMP)
	$(BIN)/python bench/bench_capture.py
	$(BIN)/python bench/bench_families.py
	$(BIN)/python bench/bench_ir_text.py
	$(BIN)/python bench/bench_parse.py
	$(BIN)/python bench/bench_pair_schedule.py
	$(BIN)/python bench/bench_real_pairs.py
	$(BIN)/python bench/bench_refine_bottleneck.py
	$(BIN)/python bench/bench_compile_time.py
	$(BIN)/python bench/bench_partition.py
	$(BIN)/python bench/bench_cost_model.py
	# The GPU measurement is taken on a GPU (see the script); here its committed readings are reported.
	$(BIN)/python bench/bench_cost_model_gpu.py report --plan bench/results/gpu/plan_qwen3_next_h200.json.gz \
	  --measured bench/results/gpu/measured_h200_run2.json.gz --hardware h200
	$(BIN)/python bench/bench_cost_model_gpu.py report --plan bench/results/gpu/plan_qwen3_next_h200_run3.json.gz \
	  --measured bench/results/gpu/measured_h200_run3.json.gz --out bench/results/cost_model_gpu_run3.json
	$(BIN)/python bench/bench_runtime.py

clean:
	rm -rf $(VENV) out build *.egg-info
