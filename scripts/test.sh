#!/usr/bin/env bash
# Runs every check and test of the workspace on a fresh Debian machine.
# Installs redis-server, openssl, postgresql, etcd-server, zookeeper, protobuf-compiler,
# faketime, chromium and chromium-driver
# (Debian packages) when missing: the tests start their own redis-server, PostgreSQL, etcd and ZooKeeper processes
# on free loopback ports (PostgreSQL from its binaries in /usr/lib/postgresql/<version>/bin, as
# the `postgres` user when run as root) and never use a system service. protoc builds the etcd
# client's gRPC code.
set -euo pipefail
cd "$(dirname "$0")/.."

# The tests also use redis-cli (cluster creation, from redis-server's dependencies) and the
# openssl command (certificates for the TLS test).
MISSING=""
command -v redis-server >/dev/null 2>&1 || MISSING="$MISSING redis-server"
command -v openssl >/dev/null 2>&1 || MISSING="$MISSING openssl"
# pip fetches the server matrix's Redis 6.2, Valkey 8.1 and Valkey 9.1 (scripts/server-matrix.sh).
python3 -m pip --version >/dev/null 2>&1 || MISSING="$MISSING python3-pip"
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || [ -n "${PG_BIN_DIR:-}" ] || MISSING="$MISSING postgresql"
command -v etcd >/dev/null 2>&1 || [ -n "${ETCD_BIN:-}" ] || MISSING="$MISSING etcd-server"
command -v protoc >/dev/null 2>&1 || [ -n "${PROTOC:-}" ] || MISSING="$MISSING protobuf-compiler"
# ZooKeeper (with Java) for the ZooKeeper store's tests (tests/src/zookeeper.rs).
[ -f /usr/share/java/zookeeper.jar ] || [ -n "${ZOOKEEPER_JAR:-}" ] || MISSING="$MISSING zookeeper"
# faketime gives each process of the scheduled-jobs test a clock of its own.
command -v faketime >/dev/null 2>&1 || MISSING="$MISSING faketime"
# Headless Chromium, driven through WebDriver, checks lockctl's web page (lockctl/tests/serve.rs).
command -v chromium >/dev/null 2>&1 || [ -n "${CHROMIUM_BIN:-}" ] || MISSING="$MISSING chromium"
command -v chromedriver >/dev/null 2>&1 || [ -n "${CHROMEDRIVER_BIN:-}" ] || MISSING="$MISSING chromium-driver"
if [ -n "$MISSING" ]; then
    echo "installing from Debian's packages:$MISSING" >&2
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y $MISSING
fi
redis-server --version
PG_POSTGRES="${PG_BIN_DIR:-}/postgres"
if [ -z "${PG_BIN_DIR:-}" ]; then
    for candidate in /usr/lib/postgresql/*/bin/postgres; do PG_POSTGRES="$candidate"; done
fi
"$PG_POSTGRES" --version
# sed reads all of it: `head -1` could exit before etcd's second line, and under pipefail the
# SIGPIPE that etcd then gets ended the whole script (exit 141).
"${ETCD_BIN:-etcd}" --version | sed -n 1p

# One build from a clean clone: incremental compilation only adds its caches to the disk
# (several GB for this workspace) and saves nothing. Set CARGO_INCREMENTAL=1 to keep them.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# Each step is timed; the times are printed at the end.
# shellcheck source=scripts/lib/steps.sh
source scripts/lib/steps.sh

step "fmt" cargo fmt --all --check
step "no import cycle, no file over 600 lines (lock-runtime)" python3 scripts/import-cycles.py
step "clippy, workspace" cargo clippy --workspace --all-targets --locked -- -D warnings
# The runtime alone, without the test packages' features (the `metrics` feature off), and
# with PostgreSQL but without TLS (the test packages always turn `tls` on).
step "clippy, lock-runtime alone" cargo clippy -p lock-runtime --lib --locked -- -D warnings
step "clippy, lock-runtime + postgres" cargo clippy -p lock-runtime --lib --features postgres --locked -- -D warnings
step "clippy, lock-runtime + etcd" cargo clippy -p lock-runtime --lib --features etcd --locked -- -D warnings
step "unit tests, lock-runtime + postgres" cargo test -p lock-runtime --lib --features postgres --locked
step "docs" env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
# The publishable crates, packaged and each built from its package alone (as crates.io would
# get them; lock-macros and lock-runtime come from a temporary local registry).
# Cargo keeps what it unpacked from that temporary registry by name and version, so a second
# run on one machine would verify against the first run's sources: remove those copies first
# (only the ones from such a local registry, whose directory names start with `-`; crates.io's
# cache is left alone).
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/lock-macros-* \
    "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/lock-runtime-*
step "package" cargo package -p lock-macros -p lock-runtime -p lock-testkit --locked
# Every test, through cargo-nextest: each test in a process of its own, tests of different
# files side by side (.config/nextest.toml), which halves this step against `cargo test`.
# The simulation's debug pass stops at 20,000 leases (a smoke run; its full budget runs in the
# release build below). nextest does not run doc tests: the step after it does.
if ! cargo nextest --version >/dev/null 2>&1; then
    echo "installing cargo-nextest from crates.io (cargo install --locked cargo-nextest)" >&2
    cargo install --locked cargo-nextest
fi
# The simulation's release build starts now, beside the debug tests, at the lowest CPU
# priority: it takes what they leave idle (most of their time is spent waiting on servers and
# timeouts) and yields the cores whenever a test needs them. Its step below waits for it.
RELEASE_LOG="$(mktemp)"
nice -n 19 cargo test --release --locked -p lock-tests --test simulation --no-run \
    >"$RELEASE_LOG" 2>&1 &
RELEASE_BUILD=$!
# A failed step ends the script: the build is stopped (by its PID) rather than left running.
trap 'status=$?; kill "$RELEASE_BUILD" 2>/dev/null || true; (exit "$status"); report_times' EXIT
release_build() {
    if ! wait "$RELEASE_BUILD"; then
        cat "$RELEASE_LOG" >&2
        echo "the release build of the simulation failed (its output is above)" >&2
        return 1
    fi
}
step "every test (debug, nextest)" env SIM_ACQUISITIONS=20000 cargo nextest run --workspace --locked
step "doc tests" cargo test --workspace --doc --locked
# The server matrix: the standalone, Cluster, Sentinel and Redlock suites again on Redis 6.2,
# Valkey 8.1 and Valkey 9.1, the three at once (binaries from the Python package index, cached
# in ~/.cache/lock-servers).
step "server matrix" ./scripts/server-matrix.sh
# The deterministic simulation to its full budget (1,000,000 leases handed out across seeds) in
# a release build, about ten times faster than a debug one; seeds run on every core.
step "simulation: the rest of its release build" release_build
step "simulation (release)" cargo test --release --locked -p lock-tests --test simulation -- --nocapture

# The demos check their own outcome (exactly one run per night / per tick) and exit non-zero
# otherwise.
step "demo interest_posting" cargo run -q --locked -p lock-examples --example interest_posting
step "demo multi_process" cargo run -q --locked -p lock-examples --example multi_process
# The same two on PostgreSQL (a server started for them, DATABASE_URL pointing at it).
step "demos on PostgreSQL" cargo run -q --locked -p lock-tests --bin with_postgres -- \
    cargo run -q --locked -p lock-examples --example interest_posting
step "demos on PostgreSQL" cargo run -q --locked -p lock-tests --bin with_postgres -- \
    cargo run -q --locked -p lock-examples --example multi_process
# And on etcd (a one-member cluster started for them, ETCD_ENDPOINTS pointing at it).
step "demos on etcd" cargo run -q --locked -p lock-tests --bin with_etcd -- \
    cargo run -q --locked -p lock-examples --example interest_posting
step "demos on etcd" cargo run -q --locked -p lock-tests --bin with_etcd -- \
    cargo run -q --locked -p lock-examples --example multi_process
# And on ZooKeeper (a one-member server started for them, ZOOKEEPER_CONNECT pointing at it).
step "demos on ZooKeeper" cargo run -q --locked -p lock-tests --bin with_zookeeper -- \
    cargo run -q --locked -p lock-examples --example interest_posting
step "demos on ZooKeeper" cargo run -q --locked -p lock-tests --bin with_zookeeper -- \
    cargo run -q --locked -p lock-examples --example multi_process

# The benchmark table of docs/benchmarks.md is the one its results file gives (no hand edits).
step "benchmark table" ./scripts/bench-table.sh --check
# The benchmark harness in quick mode, so it cannot rot (a debug build: its numbers are not
# quoted anywhere; the table in docs/benchmarks.md comes from a full release run).
step "benchmarks (quick)" cargo run -q --locked -p lock-bench -- --quick
# Where a pair's server time goes, quick mode (it also checks that every variant did its work).
step "script costs (quick)" cargo run -q --locked -p lock-bench -- --script-costs --quick
