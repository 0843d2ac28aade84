#!/usr/bin/env bash
# bundle.sh — packs what a machine without Go needs to build and test recal
# (a GPU machine, say) into .gpu/ at the repository's root, ignored by git
# (.git/info/exclude) and carried to that machine beside the working tree:
#
#   .gpu/go.tar.xz    a trimmed Go toolchain: bin/go, the tools go build and
#                     go test run (compile, link, asm, cgo, vet, cover), the
#                     standard library's sources without testdata and cmd/
#   .gpu/vendor.tar.xz  the modules' packages (go mod vendor -o), for -mod=vendor
#   .gpu/gloo-include/  Gloo's headers, for GLOO_INC
#   .gpu/src.tar.xz   the committed tree (git archive HEAD) and .gpu/src.commit:
#                     run.sh builds and runs that, not the working tree, so
#                     that others' uncommitted edits do not travel into it
#
# bench/gpu/run.sh unpacks and uses them. Run from the repository's root.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
goroot=$(go env GOROOT)
out=.gpu
mkdir -p .git/info "$out"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude

# The toolchain.
tar -C "$goroot" -cJf "$out/go.tar.xz" \
  --exclude='src/cmd' --exclude='testdata' --exclude='*_test.go' \
  VERSION go.env bin/go pkg/include \
  pkg/tool/linux_amd64/compile pkg/tool/linux_amd64/link pkg/tool/linux_amd64/asm \
  pkg/tool/linux_amd64/cgo pkg/tool/linux_amd64/vet pkg/tool/linux_amd64/cover \
  src

# The modules: go mod vendor's copy of the packages the build and the tests
# need (no testdata), which run.sh unpacks at vendor/ there (-mod=vendor).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go mod vendor -o "$tmp/vendor"
tar -C "$tmp" -cJf "$out/vendor.tar.xz" vendor

# Gloo's headers (Debian's libgloo-dev, which make deps installs): pip wheels
# ship none, and the bridge's process group needs them (GLOO_INC).
rm -rf "$out/gloo-include"
mkdir -p "$out/gloo-include"
cp -r /usr/include/gloo "$out/gloo-include/"

git archive --format=tar HEAD | xz -T0 >"$out/src.tar.xz"
git rev-parse HEAD >"$out/src.commit"
du -sh "$out"/*
