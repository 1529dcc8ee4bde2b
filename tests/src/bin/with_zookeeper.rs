//! Runs a command with `ZOOKEEPER_CONNECT` set to a one-member ZooKeeper started for it (the
//! tests' own, on a free loopback port, with TTL nodes), then stops it. The test command runs
//! the demos on ZooKeeper with it.
//!
//! Usage: with_zookeeper COMMAND [ARGS...]
//!
//! ```text
//! cargo run -p lock-tests --bin with_zookeeper -- \
//!     cargo run -p lock-examples --example multi_process
//! ```

use std::process::ExitCode;

use lock_tests::ZooKeeperEnsemble;
use lock_tests::with_server::run_with_server;

fn main() -> ExitCode {
    run_with_server(
        "with_zookeeper",
        || ZooKeeperEnsemble::start(1),
        "ZOOKEEPER_CONNECT",
        ZooKeeperEnsemble::connect_string,
    )
}
