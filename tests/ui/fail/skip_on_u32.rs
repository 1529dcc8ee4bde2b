use lock_runtime::distributed_lock;

#[distributed_lock(key = "job")]
async fn job() -> u32 {
    7
}

fn main() {}
