use lock_runtime::{distributed_lock, scheduled};

#[scheduled(every = "5m", fixed_delay = "1m")]
#[distributed_lock(key = "job")]
async fn job() {}

fn main() {}
