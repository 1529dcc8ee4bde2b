use lock_runtime::{distributed_lock, scheduled};

#[scheduled(tz = "UTC")]
#[distributed_lock(key = "job")]
async fn job() {}

fn main() {}
