#!/usr/bin/env bash
# readme-check.sh runs every command of README.md's ```sh blocks, as the
# README shows it, and fails when one fails. `make test` runs it.
#
# The commands run against a short stand-in of `make train`'s run, made in
# a scratch folder laid out like a fresh clone (the repository's data,
# router templates, tokenizer, configs and bin/ linked in, runs/ empty), so
# an existing runs/recal is never touched:
#   - recal.toml there is the repository's, with the run shortened (no
#     warm-up, 2 GRPO steps validated and checkpointed, 4 test questions per
#     dataset) and serve.addr on a free port; each edit must apply, so a
#     change to recal.toml that breaks one fails here;
#   - `make train` is replaced by `recal train --config recal.toml --run-dir
#     runs/recal` with that recal.toml, starting from the warmed-up tiny
#     policy of cmd/recal/testdata/serve-policy as runs/init/tiny (a random
#     policy warmed up for a few steps never calls the pool, and some
#     commands, such as eval's knn router, need logged calls);
#   - `make test` is skipped (this script is part of it); other make lines
#     run in the repository itself;
#   - the README's port 8080 becomes the free port.
# Each block runs as one bash script (set -e), in the README's order, so a
# block may start a server in the background and stop it; a background job
# must exit 0. Only ```sh blocks are checked: illustrative text belongs in
# other blocks. Takes under a minute on 2 cores after `make build`.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
readme=${README:-$root/README.md}
python=${PYTHON:-/usr/bin/python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/recal-readme.XXXXXX")
trap 'rm -rf "$work"' EXIT
log=$work/log

fail() { echo "readme-check: $*" >&2; exit 1; }
command -v curl >/dev/null || fail "curl is not installed, and the README's serve example uses it (apt-get install curl)"

make -C "$root" --no-print-directory build >"$log" 2>&1 || { cat "$log" >&2; fail "make build failed"; }
for f in data router tokenizer configs bin; do ln -s "$root/$f" "$work/$f"; done
mkdir "$work/runs" "$work/blocks"
port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# The stand-in recal.toml.
"$python" - "$root/recal.toml" "$work/recal.toml" "$port" <<'EOF'
import re, sys
src, dst, port = sys.argv[1:]
text = open(src).read()
edits = [  # (table, key, new value)
    ("sft", "steps", "0"),
    ("train", "steps", "2"),
    ("train", "validate_every", "2"),
    ("train", "checkpoint_every", "2"),
    ("train", "log_every", "1"),
    ("data", "test_per_dataset", "4"),
    ("data", "val_per_dataset", "4"),
    ("serve", "addr", '"127.0.0.1:%s"' % port),
]
for table, key, value in edits:
    m = re.search(r"^\[%s\][^\n]*\n(.*?)(?=^\[)" % re.escape(table), text, re.S | re.M)
    if not m:
        sys.exit("readme-check: recal.toml has no [%s] table" % table)
    body, n = re.subn(r"^(%s\s*=\s*)[^#\n]*?(\s*(#.*)?)$" % re.escape(key), lambda k: k.group(1) + value + k.group(2), m.group(1), count=1, flags=re.M)
    if n != 1:
        sys.exit("readme-check: recal.toml: no %s.%s to shorten" % (table, key))
    text = text[:m.start(1)] + body + text[m.end(1):]
open(dst, "w").write(text)
EOF

# The README's sh blocks, continuation lines joined, one script per block.
"$python" - "$readme" "$work/blocks" "$port" <<'EOF'
import re, sys
readme, out, port = sys.argv[1:]
blocks, cur, n = [], None, 0
for line in open(readme):
    s = line.rstrip("\n")
    if cur is None and s.strip() == "```sh":
        cur = []
    elif cur is not None and s.strip().startswith("```"):
        blocks.append(cur); cur = None
    elif cur is not None:
        cur.append(s)
if cur is not None:
    sys.exit("readme-check: an sh block is not closed")
for i, b in enumerate(blocks):
    text = re.sub(r"\\\n\s*", " ", "\n".join(b) + "\n")
    lines = []
    for l in text.splitlines():
        cmd = l.split("#", 1)[0].strip() if not l.strip().startswith("curl") else l.strip()
        if re.match(r"make (train|test)\b", cmd):
            lines.append(": skipped: " + cmd)
        else:
            lines.append(l.replace("8080", port))
    with open("%s/%02d.sh" % (out, i), "w") as f:
        f.write("\n".join(lines) + "\n")
print(len(blocks), "blocks", file=sys.stderr)
EOF
ls "$work"/blocks/*.sh >/dev/null 2>&1 || fail "no sh block in $readme"

cd "$work"
# make train, shortened, with the stand-in recal.toml.
echo "readme-check: stand-in run (make train, shortened) in $work" >&2
policy=$root/cmd/recal/testdata/serve-policy
[ -f "$policy/model.safetensors" ] || fail "$policy (the stand-in run's starting policy) is missing"
mkdir -p runs/init
cp -r "$policy" runs/init/tiny
./bin/recal train --config recal.toml --run-dir runs/recal >"$log" 2>&1 \
	|| { cat "$log" >&2; fail "the stand-in recal train failed"; }

make() { command make -C "$root" --no-print-directory "$@"; }
export -f make
export root
for b in blocks/*.sh; do
	echo "readme-check: block $(basename "$b" .sh):" >&2
	sed 's/^/    /' "$b" >&2
	start=$SECONDS
	# Background jobs must exit 0: the block's last act is to wait for each.
	# A failed command leaves no background job behind (the EXIT trap).
	if ! bash -e -o pipefail -c 'trap "kill \$(jobs -p) 2>/dev/null || true" EXIT
'"$(cat "$b")"'
for p in $(jobs -p); do wait "$p" || { echo "a background command exited $?" >&2; exit 1; }; done' >"$log" 2>&1; then
		tail -n 40 "$log" >&2
		fail "a command of README.md failed (block above)"
	fi
	echo "readme-check: ok ($((SECONDS - start)) s)" >&2
done
echo "readme-check: every command of README.md ran" >&2
