use lock_runtime::{distributed_lock, scheduled};

#[scheduled(every = "5m")]
#[distributed_lock(key = "job:{day}")]
async fn job(day: u32) {
    let _ = day;
}

fn main() {}
