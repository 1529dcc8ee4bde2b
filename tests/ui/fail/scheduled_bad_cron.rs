use lock_runtime::{distributed_lock, scheduled};

#[scheduled(cron = "0 0 25 * * *")]
#[distributed_lock(key = "job")]
async fn job() {}

fn main() {}
