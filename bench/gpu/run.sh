#!/usr/bin/env bash
# run.sh — recal's CUDA path on a GPU machine that has python3 with a CUDA
# pip torch (its torch/ folder is the libtorch) but no Go: bench/gpu/bundle.sh
# made .gpu/ (a trimmed Go toolchain, the vendored modules, Gloo's headers)
# on a machine with Go, and .gpu travels beside the working tree. Run from the
# repository's root, naming the stages to run, in this order:
#
#   setup   unpack Go and the modules, print the machine (GPU, compilers, torch)
#   build   make build against the pip torch, with NCCL (CUDA_INC: the CUDA
#           toolkit's and the nvidia-* packages' headers) and Gloo (GLOO_INC);
#           falls back to Gloo alone, then to no process group
#   test    go test ./torchbridge/ with RECAL_TEST_DEVICE=cuda
#   speed   bench/gpu/speed (prefill, decode, train step tokens/s) for the
#           tiny and small presets and Qwen2.5-0.5B's and 3B's shapes: cuda
#           in float32 and bfloat16 (see the stage for its variables)
#   memory  bench/memory on the GPU (0.5B and 3B shapes, bfloat16) against the plan
#   grpo05  GRPO steps of a random 0.5B-shaped policy, CUDA graphs on and off
#   kernels decode and prefill speed with the policy's kernel choices off
#           (-kernels 0) and on (the default), alternating, on one card
#   grpo    GRPO steps of random 0.5B- and 3B-shaped policies in bfloat16
#           (GRPO_RUNS): per phase seconds and device-memory peaks against
#           the dry run's plan of the same settings
#   headers libtorch's and CUDA's headers packed into $OUT (compile checks)
#   train   recal policy init (make's $(INIT)), then recal train of recal.toml
#           with SFT_STEPS and GRPO_STEPS, on cuda and on cpu (CPU_THREADS)
#   eval    recal eval of the cuda run's checkpoint (EVAL_N questions per
#           dataset, --split EVAL_SPLIT (id), the policy router), on cuda and on cpu
#   serve   recal serve of that checkpoint, on cuda and on cpu: serve_probe.py
#   small   the small preset: policy init, then a short train on cuda and cpu
#   bf16    a short train on cuda in bfloat16 (and in float32 unless train
#           ran), and eval's checkpoint evaluated on cuda in bfloat16
#
# Given .gpu/src.tar.xz, it runs in a copy of that tree at /tmp/recal-src.
# Without build, bin/recal must be there (from an earlier build: .gpu/recal,
# copied to bin/). Everything goes to $OUT (default /tmp/gpu-out): log (this
# script's output), logs.tgz (every command's output), runs.tgz (the runs'
# jsonl and config files), and with train ckpt-cuda.tgz (the cuda run's last
# checkpoint, for eval and serve in a later call) and recal.xz.* (the binary).
#
#   OUT=/tmp/o bench/gpu/run.sh setup build test train 2>&1 | tee /tmp/o/log
set -uo pipefail
cd "$(dirname "$0")/../.."
# The committed tree that bundle.sh packed, when there is one (see bundle.sh).
if [ -f .gpu/src.tar.xz ] && [ "$PWD" != /tmp/recal-src ]; then
  rm -rf /tmp/recal-src && mkdir -p /tmp/recal-src && tar -C /tmp/recal-src -xJf .gpu/src.tar.xz &&
    cp -r .gpu /tmp/recal-src/ && cd /tmp/recal-src || exit 1
  echo "running commit $(cat .gpu/src.commit) in $PWD"
fi
OUT=${OUT:-/tmp/gpu-out}
LOGS=/tmp/gpu-logs
mkdir -p "$OUT" "$LOGS"
SFT_STEPS=${SFT_STEPS:-50}
GRPO_STEPS=${GRPO_STEPS:-10}
CPU_THREADS=${CPU_THREADS:-$(nproc)}
EVAL_N=${EVAL_N:-100}
EVAL_SPLIT=${EVAL_SPLIT:-id}
T0=$SECONDS
say() { echo "[$((SECONDS - T0))s] $*"; }
stages=" $* "
has() { [[ "$stages" == *" $1 "* ]]; }
# Every command ends by DEADLINE seconds after the start (the device tool's
# limit on one call is 600 s); what has no time left is skipped.
DEADLINE=${DEADLINE:-570}
# run NAME TIMEOUT CMD...: runs CMD with its output in $LOGS/NAME.log, timed.
run() {
  local name=$1 limit=$2 t=$SECONDS rc left
  shift 2
  left=$((DEADLINE - (SECONDS - T0)))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 10 ]; then
    say "$name: skipped, no time left"
    return 124
  fi
  say "$name: $*"
  {
    echo "time=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ) msg=run-start" # summary.py's origin
    timeout "$limit" "$@"
  } >"$LOGS/$name.log" 2>&1
  rc=$?
  say "$name: exit $rc after $((SECONDS - t)) s"
  [ $rc -eq 0 ] || tail -25 "$LOGS/$name.log"
  return $rc
}
finish() {
  tar -C "$LOGS" -czf "$OUT/logs.tgz" . 2>/dev/null
  tar -czf "$OUT/runs.tgz" $(ls -d runs/gpu-*/*.jsonl runs/gpu-*/config.toml runs/eval-gpu-*/table.* runs/eval-gpu-*/results-*.jsonl 2>/dev/null) 2>/dev/null
  say "done"
}
trap finish EXIT

export GOROOT=/tmp/go PATH=/tmp/go/bin:$PATH GOTOOLCHAIN=local GOFLAGS="-mod=vendor -buildvcs=false" \
  GOCACHE=/tmp/gocache GOPATH=/tmp/gopath
TORCH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')
SITE=$(dirname "$TORCH")

if has setup; then
  mkdir -p /tmp/go && tar -C /tmp/go -xJf .gpu/go.tar.xz && rm -rf vendor && tar -xJf .gpu/vendor.tar.xz || exit 1
  say "setup: $(go version)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  echo "cores $(nproc); $(g++ --version | head -1); $(python3 -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())')"
  echo "torch at $TORCH; nvidia include folders: $(ls -d "$SITE"/nvidia/*/include 2>/dev/null | tr '\n' ' ')"
  ls -d /usr/local/cuda/include 2>/dev/null
  for h in nccl.h cuda_runtime_api.h cublas_v2.h cusparse.h cusolverDn.h; do
    echo "$h: $(ls /usr/local/cuda/include/$h "$SITE"/nvidia/*/include/$h 2>/dev/null | tr '\n' ' ')"
  done
fi

if has build; then
  CUDA_INC=""
  [ -d /usr/local/cuda/include ] && CUDA_INC="-I/usr/local/cuda/include"
  for d in "$SITE"/nvidia/*/include; do [ -d "$d" ] && CUDA_INC="$CUDA_INC -I$d"; done
  GLOO_INC="-I$PWD/.gpu/gloo-include"
  rm -rf build bin/recal
  built=""
  for try in "nccl+gloo|$GLOO_INC|$CUDA_INC" "gloo|$GLOO_INC|" "none||"; do
    IFS='|' read -r what gi ci <<<"$try"
    rm -f build/recal_dist.o build/librecal.a
    if run "build-$what" 480 make -o deps -j4 build LIBTORCH="$TORCH" GLOO_INC="$gi" CUDA_INC="$ci"; then
      built=$what
      break
    fi
    ls build/recal_{model,decode,rows,train,params}.o >/dev/null 2>&1 || break # the non-distributed objects failed: no fallback helps
  done
  [ -n "$built" ] || exit 1
  grep -o -- '-DUSE_C10D_[A-Z]*' "$LOGS/build-$built.log" | sort -u | tr '\n' ' '
  say "build: $built; bin/recal $(stat -c %s bin/recal) bytes"
  ldd bin/recal | grep -E 'torch|c10|cuda|nccl' | sed 's/ (0x.*//'
  mkdir -p .gpu && cp bin/recal .gpu/recal
fi
[ -x bin/recal ] || { [ -x .gpu/recal ] && mkdir -p bin && cp .gpu/recal bin/recal; }
[ -x bin/recal ] || { say "no bin/recal"; exit 1; }

# go test and go run link as make build does (the Makefile's GOENV).
if [ -f build/librecal.a ]; then
  export CGO_CFLAGS="-O2 -DRECAL_LIB=$(sha1sum build/librecal.a | cut -c1-16)"
  export CGO_LDFLAGS="-L$TORCH/lib -Wl,-rpath,$TORCH/lib -Wl,--no-as-needed -ltorch_cuda -lc10_cuda -Wl,--as-needed"
  # The CUDA runtime, as the Makefile links it (CUDART there).
  cudart=$(ls "$TORCH"/lib/libcudart*.so* "$SITE"/nvidia/cu*/lib/libcudart.so* "$SITE"/nvidia/cuda_runtime/lib/libcudart.so* 2>/dev/null | head -1)
  [ -n "$cudart" ] && CGO_LDFLAGS="$CGO_LDFLAGS -L$(dirname "$cudart") -Wl,-rpath,$(dirname "$cudart") -Wl,--no-as-needed -l:$(basename "$cudart") -Wl,--as-needed"
fi

if has test; then
  RECAL_TEST_DEVICE=cuda run test-cuda 300 go test -count=1 -timeout 280s -v ./torchbridge/
  grep -E '^(--- |ok|FAIL|PASS)|device_test.go|not bit for bit' "$LOGS/test-cuda.log" | grep -v -- '--- PASS: .*/' | head -80
fi

if has speed; then
  # SPEED_MODELS, SPEED_BATCHES, SPEED_NO_TRAIN (models whose train step is
  # skipped), SPEED_DTYPES, SPEED_MIN_TIME; SPEED_CPU=1 adds cpu in float32.
  # With .gpu/speed-before (an earlier build's bench/gpu/speed, e.g. this
  # stage's $OUT/speed.xz of another commit, unpacked) each cuda measure runs
  # on it first, then on this build, back to back on the same card.
  go build -o bin/speed ./bench/gpu/speed || exit 1
  xz -T0 -c bin/speed >"$OUT/speed.xz"
  sflags=(-models "${SPEED_MODELS:-tiny,small,0.5b,3b}" -batches "${SPEED_BATCHES:-1,16,64,256}"
    -no-train "${SPEED_NO_TRAIN:-3b}" -min-time "${SPEED_MIN_TIME:-1s}")
  for dt in ${SPEED_DTYPES:-float32 bfloat16}; do
    if [ -x .gpu/speed-before ]; then
      run speed-before-cuda-$dt 240 .gpu/speed-before -device cuda -dtype $dt "${sflags[@]}" && cat "$LOGS/speed-before-cuda-$dt.log"
    fi
    run speed-cuda-$dt 240 ./bin/speed -device cuda -dtype $dt "${sflags[@]}" && cat "$LOGS/speed-cuda-$dt.log"
  done
  if [ "${SPEED_EAGER:-0}" = 1 ]; then  # this build with CUDA graphs off
    for dt in ${SPEED_DTYPES:-float32 bfloat16}; do
      run speed-eager-cuda-$dt 240 ./bin/speed -device cuda -dtype $dt -eager "${sflags[@]}" && cat "$LOGS/speed-eager-cuda-$dt.log"
    done
  fi
  if [ "${SPEED_CPU:-0}" = 1 ]; then
    run speed-cpu-f32 240 ./bin/speed -device cpu -dtype float32 -threads "$CPU_THREADS" "${sflags[@]}" && cat "$LOGS/speed-cpu-f32.log"
  fi
fi

# memory: bench/memory on the GPU in bfloat16 (the one-rank configurations):
# the allocator's peak per GRPO update against the memory plan, for
# Qwen2.5-0.5B's shape and Qwen2.5-3B's (zero weights: the same memory).
if has memory; then
  go build -o bin/memory ./bench/memory || exit 1
  run memory-0.5b 150 ./bin/memory -device cuda -dtype bfloat16 -preset qwen2.5-0.5b -configs unchunked,chunked,chunked+ckpt &&
    cat "$LOGS/memory-0.5b.log"
  run memory-3b 200 ./bin/memory -device cuda -dtype bfloat16 -preset qwen2.5-3b -random=false -configs chunked,chunked+ckpt &&
    cat "$LOGS/memory-3b.log"
fi

# grpo05: GRPO steps of a random Qwen2.5-0.5B-shaped policy (full
# vocabulary) in bfloat16 on recal.toml's task, CUDA graphs on and off:
# rollout and update time per step (summary.py).
if has grpo05; then
  run init-05b 120 ./bin/recal policy init --preset qwen2.5-0.5b --out runs/init/05b --tokenizer tokenizer/qwen2.5 --seed 0
  for mode in ${GRPO05_MODES:-graphs eager}; do
    eager=false
    [ $mode = eager ] && eager=true
    rm -rf "runs/gpu-05b-$mode"
    run "train-05b-$mode" 200 ./bin/recal train --config recal.toml --run-dir "runs/gpu-05b-$mode" --set policy.checkpoint=runs/init/05b \
      --set policy.device=cuda --set policy.dtype=bfloat16 --set sft.steps=0 --set train.steps="${GRPO05_STEPS:-3}" \
      --set train.warmup_steps=0 --set policy.eager_decode=$eager
    python3 bench/gpu/summary.py "runs/gpu-05b-$mode" "$LOGS/train-05b-$mode.log"
  done
fi

# kernels: bench/gpu/speed with the policy's kernel choices off (-kernels
# 0: the arithmetic before them) and on (the default), alternating on the
# same card: bfloat16 decode of the 0.5B and 3B shapes at batch 1 and 64,
# float32 prefill of small and 0.5B.
if has kernels; then
  go build -o bin/speed ./bench/gpu/speed || exit 1
  kflags=(-min-time "${SPEED_MIN_TIME:-0.3s}")
  for rep in 1 ${KERNELS_REPS:-}; do
    for k in 0 7; do
      run "kernels-$k-bf16-$rep" 120 ./bin/speed -device cuda -dtype bfloat16 -models 0.5b,3b -batches 1,64 -no-train 0.5b,3b -kernels $k "${kflags[@]}" &&
        cat "$LOGS/kernels-$k-bf16-$rep.log"
    done
    for k in 0 7; do
      run "kernels-$k-f32-$rep" 90 ./bin/speed -device cuda -dtype float32 -models small,0.5b -batches 1 -no-train small,0.5b -kernels $k "${kflags[@]}" &&
        cat "$LOGS/kernels-$k-f32-$rep.log"
    done
  done
fi

# grpo: GRPO steps of random Qwen2.5-0.5B- and 3B-shaped policies (full
# vocabulary) in bfloat16 on recal.toml's task (8 questions × 4 responses,
# the simulated pool), one run per GRPO_RUNS entry SHAPE:CHECKPOINTING:MICRO
# (shape 05b or 3b, checkpointing on or off, train.micro_batch): first the
# dry run of the same settings (its memory plan per phase, the card's memory
# read), then the run, stopped (SIGKILL) once GRPO_STEPS steps are in
# metrics.jsonl, since the final checkpoint (3B: 6 GB of weights and 35 GB of
# optimizer state) is not what is measured. Each step's line gives the
# rollout, scoring and update seconds and each phase's device-memory peak.
if has grpo; then
  for spec in ${GRPO_RUNS:-3b:on:16 05b:on:16 05b:off:16 3b:off:2}; do
    IFS=: read -r shape ck mb <<<"$spec"
    preset=qwen2.5-0.5b
    [ "$shape" = 3b ] && preset=qwen2.5-3b
    onoff=false
    [ "$ck" = on ] && onoff=true
    name=$shape-$ck-$mb
    if [ ! -f "runs/init/$shape/model.safetensors" ]; then
      run "init-$shape" 150 ./bin/recal policy init --preset "$preset" --out "runs/init/$shape" --tokenizer tokenizer/qwen2.5 --seed 0 || continue
    fi
    sets=(--set policy.checkpoint="runs/init/$shape" --set policy.device=cuda --set policy.dtype=bfloat16 --set sft.steps=0
      --set train.steps=100 --set train.warmup_steps=0 --set policy.gradient_checkpointing=$onoff --set train.micro_batch="$mb")
    rm -rf "runs/gpu-$name"
    run "dry-$name" 60 ./bin/recal train --config recal.toml --dry-run --run-dir "runs/gpu-$name" "${sets[@]}"
    grep -A6 '^memory' "$LOGS/dry-$name.log"
    steps=${GRPO_STEPS:-3}
    run "train-$name" 240 bash -c '
      m=$1/metrics.jsonl; shift
      "$@" & pid=$!
      while kill -0 $pid 2>/dev/null; do
        if [ -f "$m" ] && [ "$(wc -l <"$m")" -ge '"$steps"' ]; then kill -9 $pid; wait $pid; exit 0; fi
        sleep 0.5
      done
      wait $pid' _ "runs/gpu-$name" ./bin/recal train --config recal.toml --run-dir "runs/gpu-$name" "${sets[@]}"
    python3 bench/gpu/summary.py "runs/gpu-$name" "$LOGS/train-$name.log"
    cp "runs/gpu-$name/metrics.jsonl" "$LOGS/metrics-$name.jsonl" 2>/dev/null
    rm -rf "runs/gpu-$name"
  done
fi

# headers: libtorch's and CUDA's headers of this machine's pip torch, packed
# into $OUT/headers.tar.xz.* (15 MB pieces), for compile checks of the CUDA
# code on a machine without a CUDA libtorch (-fsyntax-only).
if has headers; then
  (cd "$SITE" && tar -cf - torch/include nvidia/*/include torch/version.py 2>/dev/null) | xz -T0 -6 | split -b 15M - "$OUT/headers.tar.xz."
  say "headers: $(du -ch "$OUT"/headers.tar.xz.* | tail -1)"
fi

INITFLAGS="--tokenizer tokenizer/qwen2.5 --seed 0 --trim-corpus data/qa --trim-corpus router --trim-corpus recal.toml --trim-vocab 4000 --copy-circuit"
# train DEV NAME EXTRA...: recal train of recal.toml on DEV into runs/gpu-NAME.
train() {
  local dev=$1 name=$2
  shift 2
  local extra=(--set policy.device="$dev")
  [ "$dev" = cpu ] && extra+=(--set policy.threads="$CPU_THREADS")
  rm -rf "runs/gpu-$name"
  run "train-$name" 420 ./bin/recal train --config recal.toml --run-dir "runs/gpu-$name" \
    --set sft.steps="$SFT_STEPS" --set train.steps="$GRPO_STEPS" --set train.warmup_steps=0 "${extra[@]}" "$@"
  python3 bench/gpu/summary.py "runs/gpu-$name" "$LOGS/train-$name.log"
}

if has train; then
  run init-tiny 120 ./bin/recal policy init --preset tiny --out runs/init/tiny $INITFLAGS
  train cuda cuda
  train cpu cpu
  if [ -d runs/gpu-cuda/checkpoints/last ]; then
    tar -C runs/gpu-cuda/checkpoints -chzf "$OUT/ckpt-cuda.tgz" --exclude=optimizer.safetensors last
  fi
  xz -T0 -6 -c bin/recal | split -b 15M - "$OUT/recal.xz."
fi

# The checkpoint eval and serve use: .gpu/ckpt-trained.tgz (a folder last/,
# e.g. make train's runs/recal/checkpoints/last, trained elsewhere) when
# there is one, else the cuda run's (this call's train, or .gpu/ckpt-cuda.tgz).
CKPT=runs/gpu-cuda/checkpoints/last
if has eval || has serve || has bf16; then
  if [ -f .gpu/ckpt-trained.tgz ]; then
    mkdir -p runs/gpu-trained && tar -C runs/gpu-trained -xzf .gpu/ckpt-trained.tgz && CKPT=runs/gpu-trained/last
  elif [ ! -d "$CKPT" ] && [ -f .gpu/ckpt-cuda.tgz ]; then
    mkdir -p runs/gpu-cuda/checkpoints && tar -C runs/gpu-cuda/checkpoints -xzf .gpu/ckpt-cuda.tgz
  fi
  say "eval and serve: $CKPT ($(head -c 200 "$CKPT/trainer_state.json" 2>/dev/null | tr -d '\n ' | cut -c1-60))"
fi

if has eval; then
  for dev in cuda cpu; do
    extra=(--set policy.device="$dev")
    [ "$dev" = cpu ] && extra+=(--set policy.threads="$CPU_THREADS")
    rm -rf "runs/eval-gpu-$dev"
    t=$SECONDS
    run "eval-$dev" 300 ./bin/recal eval --config recal.toml --checkpoint "$CKPT" --split "$EVAL_SPLIT" \
      --routers policy --set data.test_per_dataset="$EVAL_N" --out "runs/eval-gpu-$dev" "${extra[@]}"
    say "eval-$dev: $EVAL_N questions per dataset ($EVAL_SPLIT) in $((SECONDS - t)) s (loading included)"
    cat "runs/eval-gpu-$dev/table.md" 2>/dev/null
  done
fi

if has serve; then
  for dev in cuda cpu; do
    extra=(--set policy.device="$dev")
    [ "$dev" = cpu ] && extra+=(--set policy.threads="$CPU_THREADS")
    run "serve-$dev" 240 python3 bench/gpu/serve_probe.py --label "$dev" --sequential 8 --clients 32 --requests 4 -- \
      ./bin/recal serve --config recal.toml --checkpoint "$CKPT" --addr 127.0.0.1:0 "${extra[@]}"
    grep '^{' "$LOGS/serve-$dev.log"
  done
fi

if has small; then
  run init-small 120 ./bin/recal policy init --preset small --out runs/init/small $INITFLAGS
  SFT_STEPS=${SMALL_SFT_STEPS:-30} GRPO_STEPS=${SMALL_GRPO_STEPS:-5} train cuda small-cuda --set policy.checkpoint=runs/init/small
  SFT_STEPS=${SMALL_SFT_STEPS:-30} GRPO_STEPS=${SMALL_GRPO_STEPS:-5} train cpu small-cpu --set policy.checkpoint=runs/init/small
fi

if has bf16; then
  [ -f runs/init/tiny/model.safetensors ] || run init-tiny 120 ./bin/recal policy init --preset tiny --out runs/init/tiny $INITFLAGS
  [ -d runs/gpu-cuda ] || train cuda cuda
  train cuda cuda-bf16 --set policy.dtype=bfloat16
  rm -rf runs/eval-gpu-cuda-bf16
  t=$SECONDS
  run eval-cuda-bf16 300 ./bin/recal eval --config recal.toml --checkpoint "$CKPT" --split "$EVAL_SPLIT" \
    --routers policy --set data.test_per_dataset="$EVAL_N" --out runs/eval-gpu-cuda-bf16 --set policy.device=cuda --set policy.dtype=bfloat16
  say "eval-cuda-bf16: $EVAL_N questions per dataset ($EVAL_SPLIT) in $((SECONDS - t)) s (loading included)"
  cat runs/eval-gpu-cuda-bf16/table.md 2>/dev/null
fi
