use lock_runtime::{distributed_lock, scheduled};

#[scheduled(cron = "0 0 2 * * *", tz = "Europe/Atlantis")]
#[distributed_lock(key = "job")]
async fn job() {}

fn main() {}
