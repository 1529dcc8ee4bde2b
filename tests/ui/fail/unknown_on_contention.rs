use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", on_contention = "block")]
async fn job() {}

fn main() {}
