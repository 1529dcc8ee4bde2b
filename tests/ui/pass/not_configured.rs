//! With no runtime installed or scoped, the call reports NotConfigured through its return type
//! and the body does not run (fail closed).
#![deny(warnings)]

use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "job", on_contention = "error")]
async fn as_result() -> Result<(), LockError> {
    panic!("the body must not run without a runtime");
}

#[distributed_lock(key = "job")]
async fn as_option() -> Option<()> {
    panic!("the body must not run without a runtime");
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    assert!(matches!(as_result().await, Err(LockError::NotConfigured)));
    assert_eq!(as_option().await, None);
}
