#!/usr/bin/env bash
# The fast tier, for day-to-day work: format, clippy, unit tests, the conformance kit on the
# memory store and on the example map store, the attribute's compile-error tests, the doc
# tests and the docs.
# It starts no server. ./scripts/test.sh is the full gate CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
# The etcd client's gRPC code is generated at build time.
if ! command -v protoc >/dev/null 2>&1 && [ -z "${PROTOC:-}" ]; then
    echo "check.sh needs protoc: apt-get install protobuf-compiler (or set PROTOC)" >&2
    exit 1
fi
# shellcheck source=scripts/lib/steps.sh
source scripts/lib/steps.sh

step "fmt" cargo fmt --all --check
step "no import cycle, no file over 600 lines (lock-runtime)" python3 scripts/import-cycles.py
step "clippy" cargo clippy --workspace --all-targets --locked -- -D warnings
step "unit tests" cargo test --workspace --lib --locked
step "kit on the memory store" cargo test -p lock-tests --test memory_suite --locked
step "kit on the example map store" cargo test -p lock-testkit --locked
step "attribute compile errors (trybuild)" cargo test -p lock-tests --test ui --locked
step "doc tests" cargo test --workspace --doc --locked
step "docs" env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
