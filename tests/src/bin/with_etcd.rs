//! Runs a command with `ETCD_ENDPOINTS` set to a one-member etcd cluster started for it (the
//! tests' own, on free loopback ports), then stops it. The test command runs the demos on
//! etcd with it.
//!
//! Usage: with_etcd COMMAND [ARGS...]
//!
//! ```text
//! cargo run -p lock-tests --bin with_etcd -- \
//!     cargo run -p lock-examples --example multi_process
//! ```

use std::process::ExitCode;

use lock_tests::EtcdCluster;
use lock_tests::with_server::run_with_server;

fn main() -> ExitCode {
    run_with_server(
        "with_etcd",
        || EtcdCluster::start(1),
        "ETCD_ENDPOINTS",
        |server| server.endpoints().join(","),
    )
}
