use lock_runtime::distributed_lock;

#[derive(Debug)]
pub struct MyError;

#[distributed_lock(key = "job")]
async fn job() -> Result<(), MyError> {
    Ok(())
}

fn main() {}
