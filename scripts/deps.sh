#!/usr/bin/env bash
# Installs what recal needs and is missing, idempotently: Debian's libtorch
# (CPU), Gloo's headers and OpenBLAS for building and running, python3-torch
# and numpy for the reference scripts and benchmarks, curl for the README's
# serving example. With LIBTORCH set to
# another libtorch, only the Python side and curl are checked.
set -euo pipefail
pkgs=()
need() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed" || pkgs+=("$1"); }
if [ -z "${LIBTORCH:-}" ]; then
  need libtorch-dev
  need libgloo-dev  # Gloo's headers, for c10d's ProcessGroupGloo (cgo/recal_dist.cc)
  need libopenblas0-pthread
fi
need python3-torch
need python3-numpy
need curl  # the README's serving example, which make test runs (scripts/readme-check.sh)
if [ ${#pkgs[@]} -eq 0 ]; then exit 0; fi
echo "deps: installing ${pkgs[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${pkgs[@]}"
