use lock_runtime::distributed_lock;

#[distributed_lock(key = "interest:{account")]
async fn post(account: u64) {
    let _ = account;
}

fn main() {}
