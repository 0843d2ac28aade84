# recal — build, set-up, tests, training and benchmarks.
#
# LIBTORCH selects the libtorch to build against; it is read here and only
# here. Empty (the default) means Debian's libtorch-dev (1.13, CPU), which
# `make deps` installs. Otherwise it is a folder with include/ and lib/: an
# official libtorch archive (CUDA builds included) or the torch/ folder of a
# pip install. CUDA builds are detected by lib/libtorch_cuda.so.
# TORCH_CXX11_ABI=0 is needed only for libtorch builds made with the old C++
# ABI (pre-cxx11 archives, pip wheels before torch 2.7).
LIBTORCH ?=
TORCH_CXX11_ABI ?= 1
GO ?= go
PYTHON ?= /usr/bin/python3
CXX ?= g++

ifeq ($(strip $(LIBTORCH)),)
TORCH_INC := -I/usr/include -I/usr/include/torch/csrc/api/include
TORCH_LDFLAGS :=
else
TORCH_INC := -I$(LIBTORCH)/include -I$(LIBTORCH)/include/torch/csrc/api/include
TORCH_LDFLAGS := -L$(LIBTORCH)/lib -Wl,-rpath,$(LIBTORCH)/lib
ifneq ($(wildcard $(LIBTORCH)/lib/libtorch_cuda.so),)
# Without --no-as-needed the linker drops libtorch_cuda (nothing references it
# directly) and its CUDA kernels never register.
TORCH_LDFLAGS += -Wl,--no-as-needed -ltorch_cuda -lc10_cuda -Wl,--as-needed
# The CUDA runtime, which the bridge's CUDA code calls through c10's inline
# functions: official archives ship it in lib/, pip wheels in the nvidia-*
# packages beside torch/, a toolkit in lib64/.
CUDART := $(firstword $(wildcard $(LIBTORCH)/lib/libcudart*.so* $(LIBTORCH)/../nvidia/cu*/lib/libcudart.so* \
  $(LIBTORCH)/../nvidia/cuda_runtime/lib/libcudart.so* /usr/local/cuda/lib64/libcudart.so))
ifneq ($(CUDART),)
TORCH_LDFLAGS += -L$(dir $(CUDART)) -Wl,-rpath,$(dir $(CUDART)) -Wl,--no-as-needed -l:$(notdir $(CUDART)) -Wl,--as-needed
endif
endif
endif

# The distributed bridge (cgo/recal_dist.cc) runs on c10d's Gloo and, in
# CUDA builds, on NCCL too for GPU gradients. libtorch has Gloo compiled in,
# but c10d's Gloo header needs Gloo's own headers, which libtorch archives and
# pip wheels do not ship: Debian's libgloo-dev (which `make deps` installs)
# puts them in /usr/include, and GLOO_INC gives -I flags for another folder
# holding gloo/ (Debian's headers suit a newer libtorch too: c10d's header
# uses Gloo's types only through pointers). Without them the bridge builds
# without a process group: one process runs as usual, and a job of several
# (--nproc, torchrun, Slurm) fails at its start, saying so.
# c10d's NCCL header needs CUDA's and NCCL's headers, which libtorch does not
# ship either: CUDA_INC gives their -I flags (e.g. CUDA_INC="-I$$CUDA_HOME/include",
# or the include/ folders of a pip install's nvidia-* packages). Where they are
# not found, the bridge builds with Gloo alone and refuses the "nccl" backend
# at run time.
GLOO_INC ?=
CUDA_INC ?=
DIST_DEFS :=
ifeq ($(shell printf '\043include <gloo/config.h>\n' | $(CXX) $(TORCH_INC) $(GLOO_INC) -x c++ -E - >/dev/null 2>&1 && echo ok),ok)
DIST_DEFS += -DUSE_C10D_GLOO $(GLOO_INC)
# With Debian's libtorch and Debian's Gloo headers (the libgloo that
# libtorch loads is theirs) the gradient all-reduce runs Gloo's ring with
# larger pipeline steps than c10d's (cgo/recal_dist.cc, SegmentedAllreduce);
# with any other pair it keeps c10d's allreduce.
ifeq ($(strip $(LIBTORCH))$(strip $(GLOO_INC)),)
DIST_DEFS += -DRECAL_GLOO_SEGMENTS
endif
ifneq ($(strip $(LIBTORCH)),)
ifneq ($(wildcard $(LIBTORCH)/lib/libtorch_cuda.so),)
ifeq ($(shell printf '\043include <nccl.h>\n\043include <ATen/cuda/CUDAContext.h>\n' | $(CXX) $(TORCH_INC) $(CUDA_INC) -x c++ -E - >/dev/null 2>&1 && echo ok),ok)
DIST_DEFS += -DUSE_C10D_NCCL $(CUDA_INC)
endif
endif
endif
endif

# The C++ standard: libtorch up to 2.12 builds with C++17 (Debian's 1.13
# needs it); later ones require C++20 (CXX_STD=c++20).
CXX_STD ?= c++17
# -ffp-contract=off: a*b+c stays two roundings unless the code asks for a
# fused multiply-add (recal_rows.cc's arithmetic is fixed by its source).
CXXFLAGS_BRIDGE := -std=$(CXX_STD) -O2 -fPIC -ffp-contract=off -Wall -Wno-unused-variable -D_GLIBCXX_USE_CXX11_ABI=$(TORCH_CXX11_ABI) $(TORCH_INC)
# CUDA builds: the model's and decoding's files get RECAL_CUDA (the
# allocator's counters, CUDA-graph decoding) when libtorch has CUDA and
# CUDA's headers are found (the toolkit's include/ on the default path or in
# CUDA_INC, as for NCCL).
CUDA_DEFS :=
ifneq ($(strip $(LIBTORCH)),)
ifneq ($(wildcard $(LIBTORCH)/lib/libtorch_cuda.so),)
ifeq ($(shell printf '\043include <ATen/cuda/CUDAGraph.h>\n' | $(CXX) -std=$(CXX_STD) $(TORCH_INC) $(CUDA_INC) -x c++ -E - >/dev/null 2>&1 && echo ok),ok)
CUDA_DEFS := -DRECAL_CUDA $(CUDA_INC)
endif
endif
endif
LIB := build/librecal.a
# The offline default's starting point: a tiny random policy.
INIT := runs/init/tiny/model.safetensors
# cgo cannot see when build/librecal.a changes, so its hash goes into the C
# flags of torchbridge: a new library rebuilds the (small) cgo package and
# relinks, never leaving a stale binary or test.
GOENV = CGO_CFLAGS="-O2 -DRECAL_LIB=$$(sha1sum $(LIB) | cut -c1-16)" CGO_LDFLAGS="$(TORCH_LDFLAGS)"

# Pure-Go packages: they build and test without cgo or libtorch.
PURE_PKGS := $(foreach d,internal/hfmodel internal/atomicfile internal/inputfile internal/runlock internal/docgen internal/layers internal/httpretry internal/diskcache config internal/generate internal/tokenizer data llmpool internal/outcomes router calibration internal/plot internal/procgroup serve eval/embed,$(if $(wildcard $(d)),./$(d)/...)) ./eval/baselines

.PHONY: all build lib deps test test-kernels test-pure fuzz bench train clean fixtures e2e-serve docs

all: build

# deps installs what is missing, idempotently.
deps:
	@./scripts/deps.sh

# The bridge's C++, one object per concern: the model (layout, forward
# pass), the KV cache and decoding, the row-invariant decoding kernels,
# training (loss, backward, optimizer), the checkpoint tensors, and the
# distributed collectives.
BRIDGE_OBJS := $(addprefix build/,recal_model.o recal_decode.o recal_rows.o recal_train.o recal_params.o recal_dist.o)

$(LIB): $(BRIDGE_OBJS)
	rm -f $@
	ar rcs $@ $^

build/%.o: cgo/%.cc cgo/recal.h cgo/recal_internal.h
	@mkdir -p build
	$(CXX) $(CXXFLAGS_BRIDGE) -c $< -o $@

build/recal_model.o build/recal_decode.o: build/%.o: cgo/%.cc cgo/recal.h cgo/recal_internal.h
	@mkdir -p build
	$(CXX) $(CXXFLAGS_BRIDGE) $(CUDA_DEFS) -c $< -o $@

build/recal_dist.o: cgo/recal_dist.cc cgo/recal.h cgo/recal_internal.h
	@mkdir -p build
	$(CXX) $(CXXFLAGS_BRIDGE) $(DIST_DEFS) -c $< -o $@

# lib builds the bridge's library, two objects at a time (15-30 s each).
lib: deps
	@$(MAKE) --no-print-directory -j2 $(LIB)

build: lib
	$(GOENV) $(GO) build -o bin/recal ./cmd/recal

# test: vet, every test, then the race detector over the pure-Go packages,
# where the concurrency lives (pool fan-out, rollout scheduler, server; about
# 2 minutes on 2 cores). eval/baselines is left out of the race run: its fitting
# starts no goroutine, and its learning tests take many minutes under -race.
# Last, every command README.md shows runs as shown, against a short
# stand-in run (scripts/readme-check.sh, under a minute).
RACE_PKGS := $(filter-out ./eval/baselines,$(PURE_PKGS))
test: lib
	CGO_ENABLED=0 $(GO) vet $(PURE_PKGS)
	CGO_ENABLED=0 $(GO) build $(PURE_PKGS)
	$(GOENV) $(GO) vet ./...
	$(GOENV) $(GO) test -count=1 ./...
	$(GO) test -race -count=1 $(RACE_PKGS)
	@$(MAKE) --no-print-directory test-kernels
	PYTHON=$(PYTHON) ./scripts/readme-check.sh

# test-kernels: the determinism tests (row invariance, data-parallel ranks =
# one process, rollout workers, resume, the shared warm-up) again under each
# OpenBLAS kernel of BLAS_CORES that this CPU runs ("default": the library's
# own choice, OPENBLAS_CORETYPE unset), each set in its sub-command's
# environment only; `test` above ran them under the environment's choice.
# The list holds every kernel recal's commands may choose by themselves
# (torchbridge.UseFastBLAS: SkylakeX, Haswell, Sandybridge, one per vector
# width). About a minute per kernel.
BLAS_CORES ?= default SkylakeX Haswell Sandybridge
test-kernels: lib
	$(GOENV) ./scripts/test-kernels.sh $(BLAS_CORES)

# fuzz runs every fuzz target of the module (each func FuzzXxx(*testing.F),
# found anew on every run, so new targets need no edit here) for FUZZTIME
# each, one after the other: go test -fuzz takes one package and one target
# at a time. `make fuzz FUZZTIME=10m` runs longer; FUZZ_PKGS narrows the
# packages (FUZZ_PKGS=./router/...); FUZZFLAGS adds flags (-parallel 1 on a
# shared machine). An input that fails is saved to the package's
# testdata/fuzz/FuzzXxx/, where `make test` runs it with the seed corpus
# from then on; the run goes on with the other targets and fails at the end.
FUZZTIME ?= 60s
FUZZ_PKGS ?= ./...
FUZZFLAGS ?=
fuzz: lib
	@failed=""; n=0; summary=""; log=$$(mktemp); \
	for line in $$($(GO) list -f '{{.Dir}}|{{.ImportPath}}' $(FUZZ_PKGS)); do \
		dir=$${line%%|*}; pkg=$${line#*|}; \
		grep -qs '^func Fuzz' $$dir/*_test.go || continue; \
		targets=$$($(GOENV) $(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz') || { failed="$$failed $$pkg(list)"; continue; }; \
		for t in $$targets; do \
			n=$$((n+1)); echo "== $$pkg $$t ($(FUZZTIME))"; \
			{ $(GOENV) $(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $(FUZZFLAGS) $$pkg; echo $$? > $$log.rc; } 2>&1 | tee $$log; \
			res=ok; [ "$$(cat $$log.rc)" = 0 ] || { res=FAIL; failed="$$failed $$pkg.$$t"; }; \
			summary="$$summary$$res $$pkg $$t: $$(grep -o 'elapsed: .*' $$log | tail -1)\n"; \
		done; \
	done; \
	rm -f $$log $$log.rc; \
	echo "fuzz: $$n targets, $(FUZZTIME) each"; printf '%b' "$$summary"; \
	if [ -n "$$failed" ]; then echo "fuzz: FAILED:$$failed"; exit 1; fi

bench: build $(INIT)
	$(GOENV) $(GO) run ./bench -python $(PYTHON)
	$(GOENV) $(GO) run ./bench/dist -python $(PYTHON)
	$(GO) run ./bench/dp
	$(GO) run ./bench/serve

# The official OpenAI SDK (npm package openai, pinned in scripts/e2e) drives
# a real `recal serve`: plain, streamed and restricted requests. Needs node
# and npm; `make test` runs the same test (it installs the package itself).
e2e-serve: lib
	cd scripts/e2e && npm ci --no-audit --no-fund
	$(GOENV) $(GO) test -count=1 -v -run '^TestServeOpenAISDK$$' ./cmd/recal

# Its tokenizer is Qwen2.5's trimmed to the 4,000 tokens most frequent in the
# vendored data and the protocol (instead of 151.9k ids), so the output head,
# which dominates a tiny model's cost, is 38x smaller, and every token is seen
# often enough in training. --copy-circuit gives the random weights a copy
# (induction) circuit, so the policy can copy a reply's answer into <answer>
# from the first steps on: trained from scratch it does not learn to copy in
# the minutes this run has. It is made again when what it is trimmed to
# changes (recal.toml: the pool's names and descriptions; comments do not
# count) or when the code that writes it changes.
$(INIT): Makefile recal.toml $(wildcard router/*.tmpl internal/hfmodel/*.go internal/atomicfile/*.go internal/tokenizer/*.go internal/policyinit/*.go) router/protocol.go | build
	./bin/recal policy init --preset tiny --tokenizer tokenizer/qwen2.5 --out runs/init/tiny --seed 0 \
		--trim-corpus data/qa --trim-corpus router --trim-corpus recal.toml --trim-vocab 4000 --copy-circuit

# The offline default (recal.toml). RUN_DIR is replaced if it exists.
RUN_DIR ?= runs/recal
train: build $(INIT)
	rm -rf $(RUN_DIR)
	./bin/recal train --config recal.toml --run-dir $(RUN_DIR)
	@echo "next: ./bin/recal eval --checkpoint $(RUN_DIR) --split ood   (the run's checkpoints/best, else checkpoints/last)"

# docs rewrites the generated reference pages, docs/config.md (every config
# key, from the typed config and its doc comments) and docs/cli.md (every
# command, from its help); `make test` fails while they are stale.
docs: lib
	$(GOENV) $(GO) test -count=1 -run '^TestDocs$$' ./cmd/recal -update

fixtures:
	$(PYTHON) torchbridge/testdata/qwen2_ref.py

clean:
	rm -rf build bin
