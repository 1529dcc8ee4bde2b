//! The leases held by the current task, for `current_lease()` and re-entrant locked calls.

use std::future::Future;

use crate::Lease;

/// This task's held leases: the innermost one inline, so the common case (one annotated call,
/// nothing around it) costs no allocation; the enclosing ones, outermost first, only when
/// calls nest.
struct Held {
    innermost: Lease,
    enclosing: Vec<Lease>,
}

impl Held {
    /// Innermost first.
    fn iter(&self) -> impl Iterator<Item = &Lease> {
        std::iter::once(&self.innermost).chain(self.enclosing.iter().rev())
    }
}

tokio::task_local! {
    static HELD: Held;
}

/// The innermost lease held by a `#[distributed_lock]` body running in this task, or `None`
/// outside one.
pub fn current_lease() -> Option<Lease> {
    HELD.try_with(|held| held.innermost.clone()).ok()
}

/// Runs `fut` with `lease` pushed onto this task's held leases.
pub(crate) fn with_lease<F: Future>(lease: Lease, fut: F) -> impl Future<Output = F::Output> {
    let enclosing = HELD
        .try_with(|held| {
            // Outermost first: the enclosing ones, then the innermost, now enclosing too.
            let outer_first = held
                .enclosing
                .iter()
                .chain(std::iter::once(&held.innermost));
            outer_first.cloned().collect()
        })
        .unwrap_or_default();
    HELD.scope(
        Held {
            innermost: lease,
            enclosing,
        },
        fut,
    )
}

/// The lease this task already holds for `key` in runtime `runtime_id` (which fixes the
/// namespace), if any.
pub(crate) fn held_lease(runtime_id: u64, key: &str) -> Option<Lease> {
    HELD.try_with(|held| {
        held.iter()
            .find(|l| l.state.runtime_id == runtime_id && l.state.names.key() == key)
            .cloned()
    })
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LockRuntime, MemoryStore};

    fn key_of(lease: Option<Lease>) -> Option<String> {
        lease.map(|l| l.state.names.key().to_owned())
    }

    /// Nested calls for different keys: the innermost lease is the current one, an enclosing
    /// one is still found for its key, and each level's lease leaves with its scope.
    #[tokio::test]
    async fn nested_leases_are_found_innermost_first_and_leave_with_their_scope() {
        let runtime = LockRuntime::builder()
            .memory(MemoryStore::new())
            .build()
            .await
            .expect("a memory runtime");
        let id = runtime.inner.id;
        let a = runtime
            .lock("a")
            .try_acquire()
            .await
            .expect("a")
            .expect("a free");
        let b = runtime
            .lock("b")
            .try_acquire()
            .await
            .expect("b")
            .expect("b free");
        let (lease_a, lease_b) = (a.lease().clone(), b.lease().clone());
        assert_eq!(key_of(current_lease()), None, "outside any call");
        with_lease(lease_a, async move {
            assert_eq!(key_of(current_lease()).as_deref(), Some("a"));
            with_lease(lease_b, async move {
                assert_eq!(key_of(current_lease()).as_deref(), Some("b"));
                assert_eq!(key_of(held_lease(id, "a")).as_deref(), Some("a"));
                assert_eq!(key_of(held_lease(id, "b")).as_deref(), Some("b"));
                assert_eq!(key_of(held_lease(id, "c")), None);
                assert_eq!(key_of(held_lease(id + 1, "a")), None, "another runtime's");
            })
            .await;
            assert_eq!(key_of(current_lease()).as_deref(), Some("a"));
            assert_eq!(key_of(held_lease(id, "b")), None, "b's scope has ended");
        })
        .await;
        assert_eq!(key_of(current_lease()), None);
        a.release().await.expect("release a");
        b.release().await.expect("release b");
        runtime.shutdown().await;
    }
}
