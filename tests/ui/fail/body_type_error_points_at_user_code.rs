use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", on_contention = "error")]
async fn job() -> Result<u32, lock_runtime::LockError> {
    Ok("seven")
}

fn main() {}
