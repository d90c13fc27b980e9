# agoc — entry points. `make demo` and `make test` each do their own set-up.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
AGOC   := $(VENV)/bin/agoc
PYTEST := $(VENV)/bin/pytest
STAMP  := $(VENV)/.agoc-installed
DEMO   ?= build/demo

# command:debian-package pairs `make setup` installs when missing (as root; otherwise it says what to run)
SYSTEM_TOOLS := aarch64-linux-gnu-g++:g++-aarch64-linux-gnu qemu-aarch64:qemu-user adb:adb dot:graphviz cmake:cmake \
                valgrind:valgrind

# benchmark knobs: make bench-host MODELS="mobilenet-v2,mnasnet" SHAPES=112 QUICK=1 THREADS=2 CACHE=warm
MODELS  ?=
SHAPES  ?=
QUICK   ?=
THREADS ?=
CACHE   ?=
BENCH_ARGS = $(if $(MODELS),--models "$(MODELS)") $(if $(SHAPES),--shapes "$(SHAPES)") \
             $(if $(QUICK),--quick) $(if $(THREADS),--threads $(THREADS)) $(if $(CACHE),--cache $(CACHE))

.PHONY: help setup system venv runners demo lint test test-slow test-all test-conformance bench bench-host bench-untuned bench-quick bench-pairs bench-e2e bench-locality bench-layout bench-cuda bench-rpc bench-tuning bench-phases library bench-library bench-shipped clean

# the C++ runner: make runner TARGET=host|linux-arm64|android-arm64|android-arm64-ndk (see android_runner/README.md)
include android_runner/runner.mk

help:
	@echo "make demo       partition MobileNet-V2 (AGO vs stock); build it untuned and time it beside onnxruntime; tune it"
	@echo "                (DEMO_TIME=4m, from the record library), build and time it again; compile it for ARM64, verify it under qemu"
	@echo "make test       run the fast test suite (what CI runs), in JOBS=2 parallel workers (JOBS=0: one process)"
	@echo "make lint       ruff (complexity <= 15) and the import contracts in pyproject.toml; silent when clean (make test runs it first)"
	@echo "make test-slow  run the long tests too (whole zoo models)"
	@echo "make test-conformance  ONNX's backend node tests (from the onnx wheel) through the default pipeline:"
	@echo "                   a per-family table -> bench/results/conformance-DATE.json (FAMILIES=conv,pool QUICK=1)"
	@echo "make bench      the host suite: every zoo model x shape, stock TVM vs onnxruntime -> bench/results/"
	@echo "make bench-host MODELS=a,b SHAPES=56,112 QUICK=1 THREADS=2   a narrower run"
	@echo "make bench-quick  the host suite at --quick sizes (smoke test, minutes)"
	@echo "make bench-pairs  AGO micro-benchmarks: dw-dw, dw-pw, pw-dw, pw-pw; AGO vs AGO-NI vs AGO-NR (tuned, long)"
	@echo "make bench-rpc    tuning throughput measured through the RPC path vs the local runner (DEVICE=local)"
	@echo "make bench-cuda   CUDA path: fused (APOLLO/FusionStitching) vs stock TVM training steps; kernel counts, GPU times when a GPU exists"
	@echo "make bench-untuned zoo CNNs @112/224 as compile builds them untuned (register blocks) vs onnxruntime"
	@echo "make bench-e2e    zoo @112 tuned at equal budget: AGO vs stock partition vs onnxruntime (long)"
	@echo "make bench-layout the same conv kernels tuned in NCHW and NHWC (MODEL=mobilenet-v2 SIZE=112 TRIALS=48; ~15 min)"
	@echo "make bench-tuning time to quality: latency vs tuning minutes of stock MetaSchedule, agoc, agoc + a leave-one-out"
	@echo "                   library (MODELS=mobilenet-v2,mnasnet,squeezenet SHAPES=112,224 CHECKPOINTS=5,15,45 CURVES=a,b,c: hours;"
	@echo "                   C_CHECKPOINTS=2,5: (c)'s own); (b) and (c) built at the end are timed again side by side"
	@echo "make bench-phases where a short tuning session's time goes, per phase (MODEL=zoo:mobilenet-v2@1x3x56x56 TRIALS=64;"
	@echo "                   COMPARE=1: also with fresh workers per batch, the stock behaviour) -> bench/results/tuning-DATE.json"
	@echo "make bench-locality  simulated phone-cache traffic (valgrind, PROXY=a76) beside latency: the pairs, and"
	@echo "                   mobilenet-v2 + mnasnet @112, every variant (tuned: long; QUICK=1 for 16 trials)"
	@echo "make library    tune the zoo CNNs, package their schedules as library/<target>/ (TARGET=host SHAPE=56 TRIALS=96)"
	@echo "make bench-library  MODEL tuned with and without a record library of the other zoo CNNs (MODEL=mnasnet)"
	@echo "make bench-shipped  the zoo CNNs @112/224 after the default \`agoc tune\`, tuned and untuned builds beside onnxruntime"
	@echo "                   at 2 and 1 threads, warm and cold; the share of the FMA peak (MODELS= SIZES= THREADS=: ~2 h)"
	@echo "make setup      create $(VENV), install agoc and the system tools (idempotent)"

setup: system venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

system:
	@missing=""; \
	for pair in $(SYSTEM_TOOLS); do \
	  command -v "$${pair%%:*}" >/dev/null 2>&1 || missing="$$missing $${pair##*:}"; \
	done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing system packages:$$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; }; \
	else \
	  echo "agoc: missing system packages:$$missing" >&2; \
	  echo "      install them with: sudo apt-get install$$missing  (ARM64 targets and qemu tests need them)" >&2; \
	fi

DEMO_MODEL ?= zoo:mobilenet-v2@1x3x112x112
DEMO_TIME  ?= 4m

# the model built without tuning (register blocks, the record library), then after a tune bounded by DEMO_TIME
# (the packaged record library seeds it; a second run tunes on from the first's records), each timed beside onnxruntime
demo: setup runners
	$(AGOC) partition $(DEMO_MODEL)
	$(AGOC) compile $(DEMO_MODEL) --target host -o $(DEMO)/untuned
	$(AGOC) bench $(DEMO)/untuned --against onnxruntime
	@if [ -f $(DEMO)/db/session.json ] && ! $(VENV)/bin/python -c "import json, sys; \
		from host.commands.common import partition_settings; \
		kept = json.load(open('$(DEMO)/db/session.json'))['settings']['partition'].get('locality_unit', 0); \
		sys.exit(kept != partition_settings('ago', None, None, 'host')[0].locality_unit)"; then \
		echo "demo: $(DEMO)/db was tuned keeping other tensors inside (an earlier default): tuning afresh"; \
		rm -rf $(DEMO)/db; fi
	$(AGOC) tune $(DEMO_MODEL) --target host --db $(DEMO)/db --time $(DEMO_TIME)
	$(AGOC) compile $(DEMO_MODEL) --target host --db $(DEMO)/db -o $(DEMO)/host
	$(AGOC) verify $(DEMO)/host
	$(AGOC) bench $(DEMO)/host --against onnxruntime
	$(AGOC) compile $(DEMO_MODEL) --target linux-arm64 -o $(DEMO)/arm64
	$(AGOC) verify $(DEMO)/arm64 --device qemu
	$(AGOC) bench $(DEMO)/arm64 --device qemu --warmup 1 --repeat 3

# the runners the tests use: host, and linux-arm64 for the qemu stand-in of a phone
runners: setup
	$(MAKE) --no-print-directory runner TARGET=host
	$(MAKE) --no-print-directory runner TARGET=linux-arm64

# the suite in JOBS parallel workers (pytest-xdist; JOBS=0: in this process); a worker steals queued tests
# from the other when idle, so one long test (device tuning under qemu) does not hold the run's end
JOBS ?= 2
PYTEST_JOBS = $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist worksteal)

# ruff (pycodestyle, pyflakes, bugbear, isort, mccabe complexity <= 15) and the import contracts in pyproject.toml;
# prints nothing when clean (lint-imports' report only when a contract is broken)
lint: setup
	@$(VENV)/bin/ruff check --quiet toolchain host models tests
	@out=$$($(VENV)/bin/lint-imports 2>&1) || { echo "$$out"; exit 1; }

test: setup runners lint
	$(PYTEST) -q $(PYTEST_JOBS)

test-slow: setup runners
	$(PYTEST) -q $(PYTEST_JOBS) -m slow

# the end-to-end tests (a whole model, a device tune under qemu, a bench suite): CI runs them after `make test`
test-e2e: setup runners
	$(PYTEST) -q $(PYTEST_JOBS) -m e2e

test-all: setup runners
	$(PYTEST) -q $(PYTEST_JOBS) -m "slow or not slow"

bench: bench-host

# ONNX's own node tests, as shipped and with constant-like inputs frozen to initializers (docs/ops.md)
test-conformance: setup
	$(PY) -m host.bench.conformance $(if $(FAMILIES),--families "$(FAMILIES)") $(if $(QUICK),--quick)

# the CUDA path: kernel counts + llvm numerics everywhere; fused vs stock timings only where an NVIDIA GPU is present
# tuning throughput through the RPC path vs the local runner, same kernel (DEVICE=local|qemu|SERIAL)
bench-rpc: setup runners
	$(AGOC) bench-rpc $(if $(DEVICE),--device $(DEVICE))

bench-cuda: setup
	$(AGOC) bench-cuda $(if $(ARCH),--arch $(ARCH))

# AGO's micro-benchmarks (four conv pairs; AGO vs AGO-NI vs AGO-NR, equal budget) and the tuned end-to-end suite
bench-pairs: setup
	$(AGOC) bench-suite pairs $(BENCH_ARGS)

bench-e2e: setup
	$(AGOC) bench-suite e2e $(BENCH_ARGS)

# the phone-cache proxy (host/bench/proxy.py, design §5): DRAM bytes / L2 traffic of every variant in a simulated
# phone cache, recorded beside latency. PROXY=a76|a55|small-slc; VARIANTS narrows the variants.
PROXY    ?= a76
VARIANTS ?= tvm-stock,tvm-ago,tvm-stock-tuned,tvm-ago-tuned,tvm-ago-ni,tvm-ago-nr,onnxruntime
LOCALITY_MODELS ?= mobilenet-v2,mnasnet
LOCALITY_ARGS = --proxy $(PROXY) --variants "$(VARIANTS)" $(if $(QUICK),--trials 16) $(if $(THREADS),--threads $(THREADS)) \
                $(if $(CACHE),--cache $(CACHE))

bench-locality: setup
	$(MAKE) --no-print-directory runner TARGET=host
	$(AGOC) bench-suite pairs $(LOCALITY_ARGS)
	$(AGOC) bench-suite e2e --models "$(or $(MODELS),$(LOCALITY_MODELS))" --shapes 112 \
		--variants tvm-stock-tuned,tvm-ago-tuned,tvm-ago-a76,tvm-ago-locality,onnxruntime $(LOCALITY_ARGS)

# the activation layout: the same conv kernels of one model tuned in NCHW and NHWC (host/bench/layout.py)
bench-layout: setup
	$(VENV)/bin/python -m host.bench.layout --model $(or $(MODEL),mobilenet-v2) --size $(or $(SIZE),112) \
		--trials $(or $(TRIALS),48) $(if $(THREADS),--threads $(THREADS))

# time to quality (host/bench/curves.py): each model tuned by stock MetaSchedule, agoc, agoc + library, one after
# another; every checkpoint built, verified and timed beside onnxruntime -> bench/results/tuning-curves-*.json/png
comma := ,
TUNING_MODELS = $(or $(MODELS),mobilenet-v2 mnasnet squeezenet)
TUNING_SHAPES = $(or $(SHAPES),112 224)
bench-tuning: setup
	set -e; for m in $(subst $(comma), ,$(TUNING_MODELS)); do for s in $(subst $(comma), ,$(TUNING_SHAPES)); do \
		$(VENV)/bin/python -m host.bench.curves --model zoo:$$m@1x3x$$s"x"$$s \
			--checkpoints $(or $(CHECKPOINTS),5$(comma)15$(comma)45) $(if $(CURVES),--variants $(CURVES)) \
			$(if $(C_CHECKPOINTS),--checkpoints-c $(C_CHECKPOINTS)) \
			$(if $(STOCK_SCHEDULER),--stock-scheduler $(STOCK_SCHEDULER)); done; done

# where a tuning session's time goes (host/bench/tuning.py): seconds per phase, trials, seconds per trial
bench-phases: setup
	$(VENV)/bin/python -m host.bench.tuning --model $(or $(MODEL),zoo:mobilenet-v2@1x3x56x56) \
		--trials $(or $(TRIALS),64) $(if $(COMPARE),--compare)

# the packaged record library of a target: the zoo CNNs tuned, their verified schedules in library/<target key>/
library: setup
	$(VENV)/bin/python -m host.bench.library_zoo --target $(or $(TARGET),host) --shape $(or $(SHAPE),56) \
		--trials $(or $(TRIALS),96) --per-iter $(or $(PER_ITER),4) $(if $(MODELS),--models "$(MODELS)") \
		$(if $(PARTITION),--partition $(PARTITION))

# leave-one-out: MODEL tuned with and without a library of the other models' databases -> bench/results/
bench-library: setup
	$(VENV)/bin/python -m host.bench.library_loo --model $(or $(MODEL),mnasnet) --shape $(or $(SHAPE),56) \
		--trials $(or $(TRIALS),48) --per-iter $(or $(PER_ITER),4)

# the sizes users ship: the default tune of each zoo CNN, its builds timed beside onnxruntime (host/bench/shipped.py)
bench-shipped: setup runners
	$(VENV)/bin/python -m host.bench.shipped $(if $(MODELS),--models "$(MODELS)") $(if $(SIZES),--sizes "$(SIZES)") \
		$(if $(THREADS),--threads "$(THREADS)")

bench-host: setup
	$(AGOC) bench-suite host $(BENCH_ARGS)

# what `agoc compile` builds without tuning (register blocks, record library), AGO and stock partitions, vs onnxruntime
bench-untuned: setup
	$(AGOC) bench-suite untuned $(BENCH_ARGS)

bench-quick: setup
	$(AGOC) bench-suite host --quick $(if $(MODELS),--models "$(MODELS)") $(if $(THREADS),--threads $(THREADS))

clean:
	rm -rf build .pytest_cache .ruff_cache .import_linter_cache
