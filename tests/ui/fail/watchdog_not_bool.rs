use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", watchdog = "yes")]
async fn job() {}

fn main() {}
