use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", ttl = "60")]
async fn job() {}

fn main() {}
