use lock_runtime::distributed_lock;

#[derive(Debug)]
pub struct MyError;

#[distributed_lock(key = "job", on_contention = "error")]
async fn job() -> Result<(), MyError> {
    Ok(())
}

fn main() {}
