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

use std::process::{Command, ExitCode};

use lock_tests::EtcdCluster;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(program) = args.next() else {
        eprintln!("usage: with_etcd COMMAND [ARGS...]");
        return ExitCode::from(2);
    };
    let server = EtcdCluster::start(1);
    let status = Command::new(&program)
        .args(args)
        .env("ETCD_ENDPOINTS", server.endpoints().join(","))
        .status();
    // Stopped (by its PID) before this process exits, whatever the command did.
    drop(server);
    match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!(
                "with_etcd: {} ended with {status}",
                program.to_string_lossy()
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("with_etcd: cannot run {}: {e}", program.to_string_lossy());
            ExitCode::FAILURE
        }
    }
}
