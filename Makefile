# ggml-dispatch: every step a person or CI runs is a target here.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out
CARRY ?= .carry
CUDA_HOME ?= /usr/local/cuda
REFERENCE_TSV ?= samples/reference/h200-mul-mat-routes.tsv
REFERENCE_MARGIN ?= 0.10
MEASURED ?= tables/cuda-sm90-nvidia-h200
COMMITTED_TABLE ?= $(MEASURED)/table.json
# the VRAM budget the committed table was decided with (its README says why this one)
VRAM_BUDGET ?= 16384
MEASURED_TUNING = $(sort $(wildcard $(MEASURED)/tuning/*.parquet))
MEASURED_CENSUS = $(foreach f,$(wildcard $(MEASURED)/census.parquet) $(wildcard $(MEASURED)/census-moe.parquet),--census $(f))

.PHONY: help venv demo test lint fmt typecheck pytest archive llama-src smollm2 llama-tarball clean device-carry device-session device-profile-carry device-gguf-py-carry

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

venv: $(BIN)/.installed  ## create .venv with the package and its dev tools

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

demo: venv  ## the main job on the embedded default (committed sample trace and tables; no GPU)
	@mkdir -p $(OUT)
	@echo "== census: the committed route trace (captured on an H200 from llama-bench on SmolLM2-135M)"
	$(BIN)/ggml-dispatch census ingest samples/trace-smollm2.jsonl -o $(OUT)/census.parquet
	$(BIN)/ggml-dispatch census show $(OUT)/census.parquet
	@echo "== codegen: the committed H200 tuning files (measured: dense routes, configurations, weight cache,"
	@echo "   MoE, attention) and censuses -> one table.json + header, VRAM budget $(VRAM_BUDGET) MiB"
	$(BIN)/ggml-dispatch codegen $(MEASURED_TUNING) $(MEASURED_CENSUS) --vram-budget $(VRAM_BUDGET) -o $(OUT)/table
	@echo "== diff: committed table -> regenerated table (decisions are deterministic: expect no change)"
	$(BIN)/ggml-dispatch diff $(COMMITTED_TABLE) $(OUT)/table/table.json
	@echo "== diff: stock (empty table) -> committed table, with its predicted effect on the H200 census"
	$(BIN)/ggml-dispatch tune merge $(MEASURED_TUNING) -o $(OUT)/tuning-merged.parquet
	$(BIN)/ggml-dispatch diff empty $(COMMITTED_TABLE) --census $(MEASURED)/census.parquet \
		--tuning $(OUT)/tuning-merged.parquet
	@echo "== the one-sample reference rows (samples/reference, margin $(REFERENCE_MARGIN)) vs the measured table"
	$(BIN)/ggml-dispatch census ingest samples/trace-reference-shapes.jsonl -o $(OUT)/census-reference.parquet
	$(BIN)/ggml-dispatch tune import-reference $(REFERENCE_TSV) --sm-count 132 -o $(OUT)/tuning-reference.parquet
	$(BIN)/ggml-dispatch codegen $(OUT)/tuning-reference.parquet --census $(OUT)/census-reference.parquet \
		--reference-margin $(REFERENCE_MARGIN) -o $(OUT)/table-reference
	$(BIN)/ggml-dispatch diff $(COMMITTED_TABLE) $(OUT)/table-reference/table.json
	@echo "== report: $(OUT)/report/REPORT.md"
	$(MAKE) --no-print-directory report TABLE_DIR=$(MEASURED) REPORT_OUT=$(OUT)/report >/dev/null

test: venv lint typecheck pytest  ## tests, ruff and mypy (what CI runs)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: venv  ## format and auto-fix
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: venv
	$(BIN)/mypy

# Test files run in parallel workers, one file per worker at a time (their module fixtures are compile
# steps), in the order tests/conftest.py gives (the native builds first; --no-loadscope-reorder keeps it):
# PYTEST_WORKERS=0 runs them in this process. The native builds share a locked cache. The slowest tests
# are listed at the end.
PYTEST_WORKERS ?= auto
PYTEST_XDIST = -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder
pytest: venv
	$(BIN)/pytest -q --durations=30 $(if $(filter 0,$(PYTEST_WORKERS)),,$(PYTEST_XDIST))

llama-src: venv  ## fetch the pinned llama.cpp tree into .cache/llama.cpp (sha256-checked)
	$(BIN)/python -m ggml_dispatch.fetch llama-src

smollm2: venv  ## fetch the real SmolLM2-135M Q4_1 GGUF into .cache/models
	$(BIN)/python -m ggml_dispatch.fetch smollm2

llama-tarball: venv  ## trimmed .tar.xz of the pinned tree for the GPU machine (.carry/)
	$(BIN)/python -m ggml_dispatch.fetch pack $(CARRY)/llama.cpp.tar.xz

.PHONY: compat compat-span
compat: venv  ## install --check on the trees of ggml_dispatch/hook/compat.tsv -> docs/compat.md, docs/compat.json
	$(BIN)/python -m ggml_dispatch.hook.compat
compat-span: venv  ## install --check across llama.cpp builds (ggml_dispatch/hook/compat-span.tsv, 10 sdists; not in CI) -> docs/compat-span.md
	$(BIN)/python -m ggml_dispatch.hook.compat --span

archive: venv  ## restore the archive (evidence/, superseded tables: git history) into .cache/archive/
	$(BIN)/python -m ggml_dispatch.archive

clean:
	rm -rf $(OUT) .pytest_cache .mypy_cache .ruff_cache

# ---- report: REPORT.md + plots for a measured table folder (tuning.parquet, or tuning/*.parquet merged
# into one file first; census.parquet, table.json; ab*.jsonl beside table.json (the A/Bs of that table:
# the component tables' A/Bs under ab/ are not), profile.tar.xz and NOTES.md are used when present).
TABLE_DIR ?= tables/cuda-sm90-nvidia-h200
REPORT_OUT ?= $(TABLE_DIR)
REPORT_TUNING = $(if $(wildcard $(TABLE_DIR)/tuning.parquet),$(TABLE_DIR)/tuning.parquet,$(OUT)/report-tuning/tuning-merged.parquet)

.PHONY: report
report: venv  ## REPORT.md + PNG plots in TABLE_DIR from its Parquet files (TABLE_DIR=tables/<gpu>)
	$(if $(wildcard $(TABLE_DIR)/tuning.parquet),,mkdir -p $(OUT)/report-tuning && \
		$(BIN)/ggml-dispatch tune merge $(sort $(wildcard $(TABLE_DIR)/tuning/*.parquet)) -o $(REPORT_TUNING))
	$(BIN)/ggml-dispatch report --tuning $(REPORT_TUNING) \
		$(if $(wildcard $(TABLE_DIR)/census.parquet),--census $(TABLE_DIR)/census.parquet) \
		$(if $(wildcard $(TABLE_DIR)/table.json),--table $(TABLE_DIR)/table.json) \
		$(foreach f,$(sort $(wildcard $(TABLE_DIR)/ab*.jsonl)),--ab $(f)) \
		$(if $(wildcard $(TABLE_DIR)/profile.tar.xz),--profile $(TABLE_DIR)/profile.tar.xz) \
		$(if $(wildcard $(TABLE_DIR)/NOTES.md),--notes $(TABLE_DIR)/NOTES.md) \
		-o $(REPORT_OUT)

# ---- census: ingest benchmark (a measurement, not a test): census ingest vs pandas read_json + groupby
BENCH_RECORDS ?= 5000000
BENCH_KEYS ?= 5000
BENCH_ALSO ?= 1000000
BENCH_MEMORY_KEYS ?= 1000000

.PHONY: bench-ingest
bench-ingest: venv  ## census ingest vs pandas on a generated 5M-line trace (records/s, peak RSS; BENCH_RECORDS=...), and RSS per distinct key
	$(BIN)/python -m ggml_dispatch.census.bench_ingest --records $(BENCH_RECORDS) --keys $(BENCH_KEYS) \
		$(if $(BENCH_ALSO),--also $(BENCH_ALSO)) $(if $(BENCH_MEMORY_KEYS),--memory-keys $(BENCH_MEMORY_KEYS))

# ---- ggml-cuda integration: install into a tree, and the GPU proof (lab/integration.sh)
.PHONY: install-hook cublas-headers device-integration-carry device-integration
install-hook: venv  ## install the dispatch hook into LLAMA_CPP_DIR (TABLE=table.json optional; UNINSTALL=1 reverts)
	$(BIN)/ggml-dispatch install --llama-cpp $(LLAMA_CPP_DIR) $(if $(TABLE),--table $(TABLE)) $(if $(UNINSTALL),--uninstall)

cublas-headers: venv  ## cuBLAS headers (PyPI nvidia-cublas) for nvcc -c of ggml-cuda.cu into .cache/cublas/include
	$(BIN)/python -m ggml_dispatch.fetch cublas-headers

device-integration-carry: llama-tarball smollm2  ## what lab/integration.sh needs in .carry/ (pinned tree, SmolLM2 metadata)
	$(BIN)/python -m lab.models meta .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf -o $(CARRY)/smollm2.meta.gguf

device-integration:  ## ON THE GPU MACHINE: probe, test-backend-ops per forced route, traced llama-bench, A/B (OUT=...)
	OUT=$(OUT) $(if $(PARTS),PARTS=$(PARTS)) bash lab/integration.sh

# ---- tuner: the harness and the GPU proof (lab/tune-agreement.sh) ----
.PHONY: tuner-harness tune-agreement-carry tune-agreement
tuner-harness: venv  ## build the tuning harness against the pinned tree's CPU backend (cached in .cache/tuner-harness)
	$(BIN)/ggml-dispatch tune build --llama-cpp $$($(BIN)/python -m ggml_dispatch.fetch llama-src) --cpu

tune-agreement-carry: llama-tarball  ## what lab/tune-agreement.sh needs in .carry/ (pinned tree, reference TSV)
	cp $(REFERENCE_TSV) $(CARRY)/h200-mul-mat-routes.tsv

tune-agreement:  ## ON THE GPU MACHINE: harness vs test-backend-ops, cost to a +-1% CI, L2 rotation (OUT=..., BUILD_DIR=...)
	OUT=$(OUT) $(if $(PARTS),PARTS=$(PARTS)) $(if $(BUILD_DIR),BUILD_DIR=$(BUILD_DIR)) bash lab/tune-agreement.sh

device-carry: venv device-integration-carry tune-agreement-carry device-profile-carry  ## build ggml-cuda here (cold: ~1 h on 2 cores) and fill .carry/ for lab/session.sh
	lab/prebuild.sh patched
	lab/prebuild.sh stock
	$(BIN)/ggml-dispatch codegen-crude -o $(OUT)/crude-rule
	lab/prebuild.sh crude $(OUT)/crude-rule/table.json
	if [ -f $(COMMITTED_TABLE) ]; then lab/prebuild.sh table $(COMMITTED_TABLE); fi
	if [ -f $(MEASURED)/census.parquet ]; then cp $(MEASURED)/census.parquet $(CARRY)/census.parquet; fi
	@du -sh $(CARRY)

$(CARRY)/libkernel_timeline.so: ggml_dispatch/report/native/kernel_timeline.cpp  ## CUPTI kernel-timeline injection library (+ libcupti) for the profile step
	mkdir -p $(CARRY)
	g++ -O2 -shared -fPIC -std=c++17 -I$(CUDA_HOME)/include -o $@ $< -L$(CUDA_HOME)/lib -L$(CUDA_HOME)/lib64 -lcupti
	cp -L $$(ls $(CUDA_HOME)/lib/libcupti.so.13 $(CUDA_HOME)/lib64/libcupti.so.13 2>/dev/null | head -1) $(CARRY)/libcupti.so.13

device-profile-carry: $(CARRY)/libkernel_timeline.so

device-gguf-py-carry: llama-src  ## the pinned tree's gguf-py alone (.carry/gguf-py.tar.xz): enough for e2e models/ab/profile
	mkdir -p $(CARRY)
	tar -C $$($(BIN)/python -m ggml_dispatch.fetch llama-src) -cJf $(CARRY)/gguf-py.tar.xz gguf-py

device-session:  ## ON THE GPU MACHINE (carry .carry): OUT=... STEPS="models trace-census tune" bash lab/session.sh
	OUT=$(OUT) STEPS="$(STEPS)" bash lab/session.sh
