use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", ttl = "10m", max_hold = "5m")]
async fn job() {}

fn main() {}
