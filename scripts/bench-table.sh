#!/usr/bin/env bash
# The benchmark table of docs/benchmarks.md, generated from the results file its marker names:
#
#   <!-- bench-table: bench/results-....json -->
#   ...generated lines...
#   <!-- /bench-table -->
#
#   scripts/bench-table.sh           rewrite the lines between the markers
#   scripts/bench-table.sh --check   fail if they differ from what the results file gives
#
# So no figure in the table is typed by hand. To publish a new run:
#   cargo run --release -p lock-bench -- --json bench/results-DATE-COMMIT.json
# then point the marker at it and run this script.
set -euo pipefail
cd "$(dirname "$0")/.."
file=$(sed -n 's/^<!-- bench-table: \([^ ]*\) -->$/\1/p' docs/benchmarks.md)
if [ -z "$file" ]; then
    echo "docs/benchmarks.md has no '<!-- bench-table: FILE -->' marker" >&2
    exit 1
fi
if [ "$(grep -c '^<!-- bench-table: ' docs/benchmarks.md)" != 1 ] || [ "$(grep -c '^<!-- /bench-table -->$' docs/benchmarks.md)" != 1 ]; then
    echo "docs/benchmarks.md needs exactly one '<!-- bench-table: FILE -->' and one '<!-- /bench-table -->' line" >&2
    exit 1
fi
table=$(mktemp)
readme=$(mktemp)
trap 'rm -f "$table" "$readme"' EXIT
cargo run -q --locked -p lock-bench -- --table "$file" > "$table"
awk -v table="$table" '
    /^<!-- bench-table: / { print; while ((getline line < table) > 0) print line; skip = 1; next }
    /^<!-- \/bench-table -->$/ { skip = 0 }
    !skip { print }
' docs/benchmarks.md > "$readme"
if [ "${1:-}" = "--check" ]; then
    if ! diff -u docs/benchmarks.md "$readme"; then
        echo "docs/benchmarks.md's benchmark table differs from $file: run scripts/bench-table.sh" >&2
        exit 1
    fi
    echo "docs/benchmarks.md's benchmark table matches $file"
else
    cp "$readme" docs/benchmarks.md
    echo "docs/benchmarks.md's benchmark table regenerated from $file"
fi
