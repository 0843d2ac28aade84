#!/usr/bin/env bash
# bench/cpu.sh measures where recal's CPU time goes on the offline default:
# user and kernel (sys) seconds of the whole command,
# seconds per step or per question, and the sched_yield and futex calls of
# all its threads.
#
#   bench/cpu.sh [sft] [train] [grpo] [eval]     (default: all, in this order)
#
#   sft    60 warm-up steps from the tiny initial policy, no GRPO
#   train  8 GRPO steps from the tiny initial policy, no warm-up
#   grpo   8 GRPO steps from sft's last checkpoint, which calls the pool, so
#          advantages are not all zero (needs sft's run in OUT)
#   eval   the policy router of sft's last checkpoint on 150 NQ + 150
#          HotpotQA test questions (needs sft's run in OUT)
#
# Each workload runs twice: under /usr/bin/time for the times, then under
# `strace -f -c` for the counts (strace slows the traced run; its times are
# not reported). "work" is the work's own time per step or question
# (metrics.jsonl's step times, the warm-up's took=, the evaluation's log),
# without start-up. The last column is the MD5 of what the run computed
# (train, grpo: rollouts.jsonl; sft: model.safetensors; eval:
# results-policy.jsonl, sorted; both without the pool's latencies): two
# settings computed the same iff it is equal. The environment is passed through, so
# `OPENBLAS_NUM_THREADS=2 bench/cpu.sh` measures with OpenBLAS's own thread
# pool, as before recal set it to 1. Variables: BIN (bin/recal), INIT
# (runs/init/tiny; `make runs/init/tiny/model.safetensors` makes it), OUT
# (/tmp/recal-cpu; the workloads' folders in it are replaced), STRACE (1; 0
# skips the counts).
set -euo pipefail

BIN=$(realpath "${BIN:-bin/recal}")
INIT=$(realpath "${INIT:-runs/init/tiny}")
OUT=$(realpath -m "${OUT:-/tmp/recal-cpu}")
STRACE=${STRACE:-1}
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- sft train grpo eval
if [ "$STRACE" = 1 ] && ! command -v strace >/dev/null; then
	echo "bench/cpu.sh: strace not found (apt-get install strace, or STRACE=0)" >&2
	exit 2
fi

# args WORKLOAD RUNDIR prints the recal arguments of a workload.
args() {
	case $1 in
	sft) echo "train --config recal.toml --run-dir $2 --set policy.checkpoint=$INIT --set sft.steps=60 --set train.steps=0" ;;
	train) echo "train --config recal.toml --run-dir $2 --set policy.checkpoint=$INIT --set sft.steps=0 --set train.steps=8" ;;
	grpo) echo "train --config recal.toml --run-dir $2 --set policy.checkpoint=$OUT/sft/checkpoints/last --set sft.steps=0 --set train.steps=8" ;;
	eval) echo "eval --config recal.toml --checkpoint $OUT/sft/checkpoints/last --routers policy --datasets nq,hotpotqa --set data.test_per_dataset=150 --out $2" ;;
	*) echo "bench/cpu.sh: unknown workload $1 (sft, train, grpo, eval)" >&2; exit 2 ;;
	esac
}

# seconds DURATION converts a Go duration (1m5.2s, 46s, 980ms) to seconds.
seconds() {
	awk -v d="$1" 'BEGIN {
		while (match(d, /^[0-9.]+(h|ms|m|s)/)) {
			t = substr(d, 1, RLENGTH); d = substr(d, RLENGTH + 1)
			u = t; sub(/^[0-9.]+/, "", u); v = t + 0
			s += u == "h" ? v * 3600 : u == "m" ? v * 60 : u == "ms" ? v / 1000 : v
		}
		print s
	}'
}

# per_unit WORKLOAD RUNDIR LOG prints the work's seconds per step or question.
per_unit() {
	case $1 in
	sft) awk -v s="$(seconds "$(grep -o 'took=[^ ]*' "$3" | tail -1 | cut -d= -f2)")" 'BEGIN { printf "%.2f s/step", s / 60 }' ;;
	train | grpo) grep -o '"step_time_s":[0-9.e+-]*' "$2/metrics.jsonl" | cut -d: -f2 |
		awk '{ s += $1; n++ } END { printf "%.2f s/step", s / n }' ;;
	eval)
		local t0 t1
		t0=$(date -d "$(grep -m1 'msg=evaluating' "$3" | sed 's/^time=\([^ ]*\).*/\1/')" +%s.%N)
		t1=$(date -d "$(grep 'msg="router done"' "$3" | tail -1 | sed 's/^time=\([^ ]*\).*/\1/')" +%s.%N)
		awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f s/question", (b - a) / 300 }' ;;
	esac
}

# digest WORKLOAD RUNDIR prints the MD5 of what the run computed.
digest() {
	case $1 in
	sft) md5sum <"$2/checkpoints/last/model.safetensors" ;;
	train | grpo) sed 's/"latency_ns":[0-9]*//g' "$2/rollouts.jsonl" | md5sum ;;
	eval) sed 's/"latency_ns":[0-9]*//g' "$2/results-policy.jsonl" | sort | md5sum ;;
	esac | cut -c1-12
}

mkdir -p "$OUT"
printf '%-6s %8s %8s %8s %18s %12s %10s  %s\n' workload user_s sys_s wall_s work sched_yield futex md5
for w in "$@"; do
	run=$OUT/$w
	rm -rf "$run" "$run-strace"
	# shellcheck disable=SC2046 # args is split into words on purpose
	/usr/bin/time -f '%U %S %e' -o "$run.time" "$BIN" $(args "$w" "$run") >"$run.log" 2>&1 ||
		{ echo "bench/cpu.sh: $w failed, see $run.log" >&2; exit 1; }
	read -r user sys wall <"$run.time"
	yields=- futexes=-
	if [ "$STRACE" = 1 ]; then
		# shellcheck disable=SC2046
		strace -f -c -o "$run.strace" -e trace=sched_yield,futex "$BIN" $(args "$w" "$run-strace") >/dev/null 2>&1
		yields=$(awk '$NF == "sched_yield" { print $4 }' "$run.strace")
		futexes=$(awk '$NF == "futex" { print $4 }' "$run.strace")
	fi
	printf '%-6s %8s %8s %8s %18s %12s %10s  %s\n' "$w" "$user" "$sys" "$wall" "$(per_unit "$w" "$run" "$run.log")" \
		"${yields:-0}" "${futexes:-0}" "$(digest "$w" "$run")"
done
