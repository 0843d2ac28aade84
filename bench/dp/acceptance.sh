#!/usr/bin/env bash
# bench/dp/acceptance.sh — issue 11's acceptance (data-parallel training on
# c10d) on the offline default, on this machine's CPU, one thread per rank:
#
#   (a) recal train --nproc 2 against one process: 5 GRPO steps from a short
#       warm-up; rollouts.jsonl and metrics.jsonl (timings and cost aside)
#       equal, the weights of checkpoints/last within 1e-5;
#   (b) the same with two processes started by hand with torchrun's
#       variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
#       MASTER_ADDR, MASTER_PORT);
#   (c) kill -9 of rank 1 in the middle of a step of such a job: rank 0 exits
#       non-zero within dist.timeout, naming rank 1; --resume with 2 ranks
#       (equal to (a)'s uninterrupted 2-rank run) and with 1 rank finish;
#   (d) recal eval --nproc 2 against one process: the same tables.
#
# Prints PASS or FAIL per item and exits non-zero if any failed.
#   bash bench/dp/acceptance.sh            (after make build; ~20 min on 2 busy cores)
# Environment: RECAL (binary, bin/recal), CONFIG (recal.toml), OUT (work
# folder, default a new temporary one, kept), SFT_STEPS (30), STEPS (5),
# EVAL_PER_DATASET (100), PYTHON (/usr/bin/python3, with numpy).
set -u
RECAL=${RECAL:-bin/recal}
CONFIG=${CONFIG:-recal.toml}
OUT=${OUT:-$(mktemp -d /tmp/recal-acceptance-XXXXXX)}
SFT_STEPS=${SFT_STEPS:-30}
STEPS=${STEPS:-5}
EVAL_PER_DATASET=${EVAL_PER_DATASET:-100}
PYTHON=${PYTHON:-/usr/bin/python3}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
echo "acceptance: $RECAL at commit $(git rev-parse --short HEAD 2>/dev/null) in $OUT, $(date '+%F %T')"
fails=0
result() { # item PASS|FAIL detail
  echo "$1: $2 — $3"
  [ "$2" = PASS ] || fails=$((fails + 1))
}
free_port() { $PYTHON -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
compare() { $PYTHON "$here/compare_runs.py" "$@"; }

# The warm-up, once: every run below starts GRPO from its policy.
echo "warm-up: $SFT_STEPS supervised steps…"
$RECAL --threads 1 --log-level warn train --config "$CONFIG" --run-dir "$OUT/warm" \
  --set sft.steps="$SFT_STEPS" --set train.steps=0 >"$OUT/warm.log" 2>&1 || { echo "warm-up failed: see $OUT/warm.log"; exit 1; }
SETS=(--set policy.checkpoint="$OUT/warm/checkpoints/sft" --set sft.steps=0 --set train.steps="$STEPS"
  --set train.validate_every="$STEPS" --set train.checkpoint_every=1 --set dist.timeout=60s)

run() { # name, args…: one recal train, timed
  local name=$1; shift
  local t0=$(date +%s.%N)
  $RECAL --threads 1 --log-level warn train --config "$CONFIG" --run-dir "$OUT/$name" "${SETS[@]}" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  printf '  %-8s exit %d after %.0f s\n' "$name" $rc "$(echo "$(date +%s.%N) - $t0" | bc)"
  return $rc
}
# hand name [kill-after-step]: two processes with torchrun's variables.
hand() {
  local name=$1 killat=${2:-} port=$(free_port) pids=() t0=$(date +%s.%N)
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      $RECAL --threads 1 --log-level warn train --config "$CONFIG" --run-dir "$OUT/$name" "${SETS[@]}" \
      >"$OUT/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  if [ -n "$killat" ]; then
    # Wait for step killat's metrics, then half a step's time into the next.
    until [ "$(cat "$OUT/$name/metrics.jsonl" 2>/dev/null | wc -l)" -ge "$killat" ]; do
      kill -0 "${pids[1]}" 2>/dev/null || break
      sleep 0.2
    done
    sleep "${KILL_DELAY:-2}"
    kill -9 "${pids[1]}"
    local tk=$(date +%s.%N)
    wait "${pids[0]}"; local rc0=$?
    local tx=$(date +%s.%N)
    { wait "${pids[1]}"; } 2>/dev/null
    KILL_RC=$rc0
    KILL_TOOK=$(echo "$tx - $tk" | bc)
    printf '  %-8s rank 1 killed during step %d; rank 0 exited %d after %.1f s\n' "$name" $((killat + 1)) $rc0 "$KILL_TOOK"
    return 0
  fi
  wait "${pids[0]}"; local rc0=$?
  wait "${pids[1]}"; local rc1=$?
  printf '  %-8s ranks exited %d %d after %.0f s\n' "$name" $rc0 $rc1 "$(echo "$(date +%s.%N) - $t0" | bc)"
  [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ]
}

echo "(a) one process against recal train --nproc 2…"
run one && run nproc2 --nproc 2
if [ -f "$OUT/nproc2/metrics.jsonl" ] && d=$(compare "$OUT/one" "$OUT/nproc2" --weights 1e-5); then
  result "(a) train --nproc 2 = one process" PASS "$d"
else result "(a) train --nproc 2 = one process" FAIL "${d:-a run failed, see $OUT/*.log}"; fi

echo "(b) two processes started by hand (torchrun's variables)…"
if hand hand && d=$(compare "$OUT/one" "$OUT/hand" --weights 1e-5); then
  result "(b) 2 ranks by hand = one process" PASS "$d"
else result "(b) 2 ranks by hand = one process" FAIL "${d:-see $OUT/hand.rank*.log}"; fi

echo "(c) kill -9 of rank 1 during step 3, then --resume with 2 ranks and with 1…"
KILL_RC=0 KILL_TOOK=0
hand kill 2
msg=$(grep -m1 'lost rank 1' "$OUT/kill.rank0.log")
if [ "$KILL_RC" -ne 0 ] && [ -n "$msg" ] && [ "$(echo "$KILL_TOOK < 60" | bc)" = 1 ]; then
  result "(c) kill -9" PASS "rank 0 exited $KILL_RC after ${KILL_TOOK%???????} s: ${msg:0:300}"
else result "(c) kill -9" FAIL "rank 0 exited $KILL_RC after $KILL_TOOK s; message: ${msg:-none naming rank 1, see $OUT/kill.rank0.log}"; fi
cp -r "$OUT/kill" "$OUT/resume2"; cp -r "$OUT/kill" "$OUT/resume1"
if run resume2 --nproc 2 --resume && d=$(compare "$OUT/nproc2" "$OUT/resume2" --weights 0); then
  result "(c) --resume, 2 ranks = uninterrupted 2 ranks" PASS "$d"
else result "(c) --resume, 2 ranks = uninterrupted 2 ranks" FAIL "${d:-see $OUT/resume2.log}"; fi
if run resume1 --resume && d=$(compare "$OUT/nproc2" "$OUT/resume1" --weights 1e-5); then
  result "(c) --resume, 1 rank finishes" PASS "and matches the uninterrupted 2-rank run: $d"
elif [ -f "$OUT/resume1/checkpoints/step-$STEPS/model.safetensors" ]; then
  result "(c) --resume, 1 rank finishes" PASS "(differs from the 2-rank run: $d)"
else result "(c) --resume, 1 rank finishes" FAIL "see $OUT/resume1.log"; fi

echo "(d) recal eval --nproc 2 against one process…"
EVAL=(--checkpoint "$OUT/nproc2/checkpoints/last" --routers policy,random,knn --datasets nq,hotpotqa
  --set data.test_per_dataset="$EVAL_PER_DATASET")
ok=1
for n in 1 2; do
  t0=$(date +%s.%N)
  $RECAL --threads 1 --log-level warn eval --config "$CONFIG" "${EVAL[@]}" --nproc $n --out "$OUT/eval$n" >"$OUT/eval$n.log" 2>&1 || ok=0
  printf '  eval --nproc %d: %.0f s\n' $n "$(echo "$(date +%s.%N) - $t0" | bc)"
done
if [ $ok = 1 ] && cmp -s "$OUT/eval1/table.json" "$OUT/eval2/table.json" && cmp -s "$OUT/eval1/table.md" "$OUT/eval2/table.md" \
  && cmp -s "$OUT/eval1/table.csv" "$OUT/eval2/table.csv"; then
  d=$(compare --eval "$OUT/eval1" "$OUT/eval2")
  result "(d) eval --nproc 2 = one process" PASS "table.{json,csv,md} identical; $d"
else result "(d) eval --nproc 2 = one process" FAIL "tables differ or a run failed (see $OUT/eval*.log)"; fi

echo "acceptance: $fails item(s) failed; runs kept in $OUT"
[ $fails -eq 0 ]
