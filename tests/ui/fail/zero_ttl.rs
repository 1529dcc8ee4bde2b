use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", ttl = "0s")]
async fn job() {}

fn main() {}
