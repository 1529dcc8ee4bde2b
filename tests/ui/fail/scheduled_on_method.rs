use lock_runtime::{distributed_lock, scheduled};

struct Reports;

impl Reports {
    #[scheduled(every = "5m")]
    #[distributed_lock(key = "reports")]
    async fn nightly() {}
}

fn main() {
    let _ = Reports;
}
