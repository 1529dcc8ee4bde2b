use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", on_contention = "skip", wait_timeout = "30s")]
async fn job() {}

fn main() {}
