use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "job", on_contention = "skip")]
async fn job() -> Result<u32, LockError> {
    Ok(7)
}

fn main() {}
