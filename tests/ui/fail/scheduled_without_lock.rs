use lock_runtime::scheduled;

#[scheduled(every = "5m")]
async fn job() {}

fn main() {}
