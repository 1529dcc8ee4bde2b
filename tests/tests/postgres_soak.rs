//! The mixed soak and its real-process exclusion checker on PostgreSQL: worker processes
//! (several tasks each) take random keys through the runtime on one PostgreSQL server, reached
//! through a fault proxy, and increment each key's fenced counter in a resource redis-server.
//! Faults come at random from a printed seed: proxy stalls, dropped connections and latency,
//! every runtime connection terminated with `pg_terminate_backend`, workers paused with
//! SIGSTOP and killed with SIGKILL, and the server itself killed (SIGKILL) and restarted
//! (crash recovery from its WAL).
//!
//! One server and no failover, so nothing is excused: no two holders of a key may believe
//! their leases valid at one instant, fences of consecutive leases increase, every refusal by
//! the resource has a newer lease behind it, no update is lost (`lock_tests::fleet`).
//!
//! About 10 s by default. `PG_SOAK_SECS=600` for a long run; `PG_SOAK_SEED=<n>` replays a
//! fault schedule; `PG_SOAK_RESULTS=<file>` writes the figures as JSON.

use lock_tests::fleet::StoreSoak;
use lock_tests::postgres::{PG_PASSWORD, PG_USER};
use lock_tests::{FaultProxy, PostgresServer};

/// Terminates every connection of the lock runtimes (commands and listening).
fn terminate_backends(server: &PostgresServer) -> i64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let admin = server.client().await;
        admin
            .query_one(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE application_name = 'lock-runtime') t",
                &[],
            )
            .await
            .map_or(0, |row| row.get(0))
    })
}

#[test]
fn postgres_soak_keeps_exclusion_fences_and_counters() {
    let soak = StoreSoak::from_env("PG", "postgres");
    let mut server = PostgresServer::start();
    let proxy = FaultProxy::start(server.port());
    let url = format!(
        "postgres://{PG_USER}:{PG_PASSWORD}@127.0.0.1:{}/postgres",
        proxy.port()
    );
    let worker = env!("CARGO_BIN_EXE_soak_worker");
    soak.run(worker, "postgres", url, &proxy, 2, |kind, _| match kind {
        0 => {
            terminate_backends(&server);
            "pg_terminate_backend of every runtime connection"
        }
        _ => {
            server.restart();
            "server SIGKILL + restart"
        }
    });
    drop(server);
}
