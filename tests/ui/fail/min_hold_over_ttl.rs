use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", ttl = "10s", min_hold = "1m")]
async fn job() {}

fn main() {}
