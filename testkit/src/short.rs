//! Shorthands of the cases.

use lock_runtime::{LockError, LockGuard, LockRuntime};

use crate::Harness;

/// `try_acquire`'s answer for a lock a test knows to be free: `lock.try_acquire().await.free()`.
pub trait Free {
    /// The guard, or a panic naming what came instead (an error, or the lock held).
    fn free(self) -> LockGuard;
}

impl Free for Result<Option<LockGuard>, LockError> {
    fn free(self) -> LockGuard {
        match self {
            Ok(Some(guard)) => guard,
            Ok(None) => panic!("the lock was expected free and is held"),
            Err(e) => panic!("acquiring a lock expected free: {e}"),
        }
    }
}

/// Two runtimes on the store, the cases' usual pair of instances.
pub(crate) async fn two_runtimes<H: Harness>(store: &H) -> (LockRuntime, LockRuntime) {
    (store.runtime().await, store.runtime().await)
}
