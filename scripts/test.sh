#!/usr/bin/env bash
# Runs every check and test of the workspace on a fresh Debian machine.
# Installs redis-server (Debian package) when it is missing: the tests start their own
# redis-server processes on free loopback ports and never use a system service.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis-server not found; installing it from Debian's packages" >&2
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y redis-server
fi
redis-server --version

cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The runtime alone, without the test packages' features (the `metrics` feature off).
cargo clippy -p lock-runtime --lib --locked -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
cargo test --workspace --locked

# The demos check their own outcome (exactly one run per night / per tick) and exit non-zero
# otherwise.
cargo run -q --locked -p lock-examples --example interest_posting
cargo run -q --locked -p lock-examples --example multi_process

# The benchmark harness in quick mode, so it cannot rot (a debug build: its numbers are not
# quoted anywhere; the README's table comes from a full release run).
cargo run -q --locked -p lock-bench -- --quick
