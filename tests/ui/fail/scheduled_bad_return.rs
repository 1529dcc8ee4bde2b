use lock_runtime::scheduled;

#[scheduled(every = "5m", local = true)]
async fn job() -> u32 {
    7
}

fn main() {}
