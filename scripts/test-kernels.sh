#!/usr/bin/env bash
# test-kernels.sh CORE... — the determinism tests under several OpenBLAS
# kernels (`make test-kernels`, part of `make test`).
#
# recal's bit-for-bit guarantees (a rollout row's log-probs whatever rows
# share its decode call; N data-parallel ranks = one process; rollout
# workers = one worker; resume = uninterrupted; a shared warm-up = the
# combined run) must not hold on one BLAS kernel only. `make test` runs them
# once under the environment's own choice; this script runs them again
# under each OpenBLAS core type named (OPENBLAS_CORETYPE, "default" = the
# library's own choice for this CPU, with OPENBLAS_CORETYPE and
# OPENBLAS_L2_SIZE unset), each set in its own sub-command's environment
# only. A core type this CPU cannot run (OpenBLAS falls back to another) is
# reported and skipped; two names OpenBLAS maps to the same kernel run once.
#
# Needs the cgo environment of the Makefile's GOENV (CGO_CFLAGS,
# CGO_LDFLAGS) in the environment.
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A TESTS=(
  [torchbridge]='^(TestLogpIndependentOfBatching|TestCheckKernels)$'
  [trainer]='^(TestTrainDataParallel|TestRolloutWorkers|TestResumeMatchesUninterrupted|TestPPOResumeMatchesUninterrupted)$'
  [experiments/ablate]='^TestAblateSharedWarmupEqualsCombinedRun$'
)
PKGS=(torchbridge trainer experiments/ablate)

out=build/test-kernels
mkdir -p "$out"
for pkg in "${PKGS[@]}"; do
  go test -c -o "$out/$(basename "$pkg").test" "./$pkg"
done

# core_env CORE: the environment assignments (for env) that select CORE.
core_env() {
  if [ "$1" = default ]; then
    echo "-u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE"
  else
    echo "OPENBLAS_CORETYPE=$1"
  fi
}

# The kernel OpenBLAS loads under CORE, as it reports it (OPENBLAS_VERBOSE=2
# prints "Core: NAME" when the library loads).
loaded_core() {
  # shellcheck disable=SC2046
  (cd torchbridge && env $(core_env "$1") OPENBLAS_VERBOSE=2 "../$out/torchbridge.test" -test.run '^$' 2>&1 |
    sed -n 's/^Core: //p' | head -n1)
}

declare -A seen=()
status=0
for core in "$@"; do
  got=$(loaded_core "$core")
  if [ -z "$got" ]; then
    echo "test-kernels: $core: OpenBLAS did not report its kernel (not the BLAS libtorch links to?); running anyway"
    got="?$core"
  elif [ "$core" != default ] && [ "${got,,}" != "${core,,}" ]; then
    echo "test-kernels: $core: this CPU cannot run it (OpenBLAS loads $got instead): skipped"
    continue
  fi
  if [ -n "${seen[$got]:-}" ]; then
    echo "test-kernels: $core: OpenBLAS runs $got, already tested as ${seen[$got]}: skipped"
    continue
  fi
  seen[$got]=$core
  echo "test-kernels: OpenBLAS kernel $got (OPENBLAS_CORETYPE=${core/default/unset})"
  for pkg in "${PKGS[@]}"; do
    start=$(date +%s)
    # shellcheck disable=SC2046
    if (cd "$pkg" && env $(core_env "$core") "$OLDPWD/$out/$(basename "$pkg").test" \
          -test.run "${TESTS[$pkg]}" -test.count=1 >"$OLDPWD/$out/$(basename "$pkg")-$core.log" 2>&1); then
      echo "  ok    $pkg ($(( $(date +%s) - start )) s)"
    else
      echo "  FAIL  $pkg under $got: the log follows"
      tail -n 60 "$out/$(basename "$pkg")-$core.log"
      status=1
    fi
  done
done
exit $status
