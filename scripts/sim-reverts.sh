#!/usr/bin/env bash
# Proof that the simulation bites: each patch in docs/reverts/ undoes one earlier safety fix.
# For each, in a scratch worktree of HEAD, this applies the patch and runs the simulation on
# seeds 1..20000 (the CI budget is about 10,000), expecting a failing seed. Prints the first
# failing seed and what the checker said; exits non-zero if any revert goes unnoticed.
#
#   ./scripts/sim-reverts.sh              # every patch (about 2 minutes each here)
#   ./scripts/sim-reverts.sh f10          # patches whose name starts with f10
#
# Not part of scripts/test.sh (each patch costs a release build). Builds go to
# target/reverts (REVERTS_TARGET_DIR), so the main target dir keeps its artifacts.
set -euo pipefail

root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
tree="$work/tree"
git -C "$root" worktree add -q --detach "$tree" HEAD
cleanup() {
    git -C "$root" worktree remove --force "$tree" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
export CARGO_TARGET_DIR="${REVERTS_TARGET_DIR:-$root/target/reverts}"

status=0
found=0
for patch in "$root"/docs/reverts/"${1:-}"*.patch; do
    name=$(basename "$patch" .patch)
    git -C "$tree" checkout -q -- .
    git -C "$tree" apply "$patch"
    started=$(date +%s)
    if out=$(cd "$tree" && SIM_SEEDS=1..20001 cargo test --release -q --locked \
        -p lock-tests --test simulation simulated_runs 2>&1); then
        echo "$name: NOT FOUND in seeds 1..20000"
        status=1
    else
        seed=$(grep -m1 -o 'seed [0-9]* broke a promise' <<<"$out" || true)
        if [ -z "$seed" ]; then
            echo "$name: the run failed without a verdict:"
            tail -20 <<<"$out"
            status=1
            continue
        fi
        echo "$name: found, $seed ($(($(date +%s) - started)) s)"
        grep -m1 '^- ' <<<"$out" | cut -c1-300 | sed 's/^/    /'
        found=$((found + 1))
    fi
done
echo "reverted fixes found: $found"
exit $status
