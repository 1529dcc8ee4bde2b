//! The leases held by the current task, for `current_lease()` and re-entrant locked calls.

use std::future::Future;
use std::sync::Arc;

use crate::Lease;

tokio::task_local! {
    static HELD: Arc<Vec<Lease>>;
}

/// The innermost lease held by a `#[distributed_lock]` body running in this task, or `None`
/// outside one.
///
pub fn current_lease() -> Option<Lease> {
    HELD.try_with(|held| held.last().cloned()).ok().flatten()
}

/// Runs `fut` with `lease` pushed onto this task's held leases.
pub(crate) fn with_lease<F: Future>(lease: Lease, fut: F) -> impl Future<Output = F::Output> {
    let mut held: Vec<Lease> = HELD
        .try_with(|held| held.as_ref().clone())
        .unwrap_or_default();
    held.push(lease);
    HELD.scope(Arc::new(held), fut)
}

/// The lease this task already holds for `key` in runtime `runtime_id` (which fixes the
/// namespace), if any.
pub(crate) fn held_lease(runtime_id: u64, key: &str) -> Option<Lease> {
    HELD.try_with(|held| {
        held.iter()
            .rev()
            .find(|l| l.state.runtime_id == runtime_id && l.state.names.key() == key)
            .cloned()
    })
    .ok()
    .flatten()
}
