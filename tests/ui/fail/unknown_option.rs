use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", lock_at_most_for = "10s")]
async fn job() {}

fn main() {}
