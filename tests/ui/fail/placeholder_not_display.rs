use lock_runtime::distributed_lock;

pub struct Account {
    pub id: u64,
}

#[distributed_lock(key = "interest:{account}")]
async fn post(account: &Account) {
    let _ = account.id;
}

fn main() {}
