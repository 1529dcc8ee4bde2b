//! `crate = "..."` for a renamed dependency.
#![deny(warnings)]

use lock_runtime as locks;

#[locks::distributed_lock(key = "renamed", crate = "locks")]
async fn job() -> Option<u32> {
    Some(1)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let rt = locks::LockRuntime::builder()
        .memory(locks::MemoryStore::new())
        .build()
        .await
        .expect("build");
    assert_eq!(rt.scope(job()).await, Some(1));
}
