//! The builder's store-specific setters, deprecated since their options moved onto the store
//! types (`RedisStore`, `RedlockStore`, `PostgresStore`, `EtcdStore`), still do what they did:
//! each is forwarded to the chosen store. (Their refusals on a store they do not fit are in
//! bad_input_matrix, postgres_store and etcd_store.)
#![allow(deprecated)]

use lock_tests::Built;
use lock_tests::TakeFree;
use std::time::Duration;

use lock_runtime::{LockRuntime, MemoryStore};
use lock_tests::PostgresServer;

#[tokio::test]
async fn redlock_stores_and_node_timeout_still_build_a_quorum() {
    let members: Vec<MemoryStore> = (0..3).map(|_| MemoryStore::new()).collect();
    let runtime = LockRuntime::builder()
        .redlock_stores(members.iter().cloned())
        .node_timeout(Duration::from_millis(100))
        .built()
        .await;
    let guard = runtime.take_default_ttl("forwarded").await;
    // The lock is on every member: each of them, alone, finds it held.
    for member in &members {
        let alone = LockRuntime::builder().memory(member.clone()).built().await;
        let held = alone.lock("forwarded").try_acquire().await.expect("try");
        assert!(held.is_none(), "a member does not hold the quorum's lock");
    }
    assert!(guard.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_table_still_names_the_table() {
    let server = PostgresServer::start();
    let runtime = LockRuntime::builder()
        .postgres(server.url())
        .postgres_table("forwarded_locks")
        .built()
        .await;
    let guard = runtime.take_default_ttl("in-its-table").await;
    let rows: i64 = server
        .client()
        .await
        .query_one("SELECT count(*) FROM forwarded_locks", &[])
        .await
        .expect("the table the setter named exists")
        .get(0);
    assert_eq!(rows, 1, "the lock's row is in the table the setter named");
    assert!(guard.release().await.expect("release"));
}
