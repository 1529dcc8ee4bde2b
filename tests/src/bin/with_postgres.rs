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

use std::process::ExitCode;

use lock_tests::PostgresServer;
use lock_tests::with_server::run_with_server;

fn main() -> ExitCode {
    run_with_server(
        "with_postgres",
        PostgresServer::start,
        "DATABASE_URL",
        |server| server.url(),
    )
}
