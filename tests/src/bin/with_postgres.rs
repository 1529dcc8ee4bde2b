//! Runs a command with `DATABASE_URL` set to a PostgreSQL server started for it (the tests'
//! own: a copy of the `initdb` template on a free loopback port, as the `postgres` user when
//! run as root), then stops the server. The test command runs the demos on PostgreSQL with it.
//!
//! Usage: with_postgres COMMAND [ARGS...]
//!
//! ```text
//! cargo run -p lock-tests --bin with_postgres -- \
//!     cargo run -p lock-examples --example multi_process
//! ```

use std::process::{Command, ExitCode};

use lock_tests::PostgresServer;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(program) = args.next() else {
        eprintln!("usage: with_postgres COMMAND [ARGS...]");
        return ExitCode::from(2);
    };
    let server = PostgresServer::start();
    let status = Command::new(&program)
        .args(args)
        .env("DATABASE_URL", server.url())
        .status();
    // Stopped (by its PID) before this process exits, whatever the command did.
    drop(server);
    match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!(
                "with_postgres: {} ended with {status}",
                program.to_string_lossy()
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!(
                "with_postgres: cannot run {}: {e}",
                program.to_string_lossy()
            );
            ExitCode::FAILURE
        }
    }
}
