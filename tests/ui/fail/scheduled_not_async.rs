use lock_runtime::scheduled;

#[scheduled(every = "5m", local = true)]
fn job() {}

fn main() {}
