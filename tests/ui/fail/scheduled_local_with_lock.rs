use lock_runtime::{distributed_lock, scheduled};

#[scheduled(every = "5m", local = true)]
#[distributed_lock(key = "job")]
async fn job() {}

fn main() {}
