use lock_runtime::{distributed_lock, scheduled};

#[scheduled(every = "5m", tz = "Europe/Berlin")]
#[distributed_lock(key = "job")]
async fn job() {}

fn main() {}
