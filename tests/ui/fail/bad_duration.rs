use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", ttl = "10 minutes")]
async fn job() {}

fn main() {}
