use lock_runtime::{distributed_lock, scheduled};

#[scheduled(cron = "0 0 2 * * *", every = "5m")]
#[distributed_lock(key = "job")]
async fn job() {}

fn main() {}
