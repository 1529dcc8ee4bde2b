//! Every option, on free functions, methods, generics and type aliases, compiled with
//! `#![deny(warnings)]`, and run against the memory store.
#![deny(warnings)]

use std::fmt::Display;

use lock_runtime::{LockError, LockRuntime, MemoryStore, current_lease, distributed_lock};

type JobResult<T> = Result<T, LockError>;

#[distributed_lock(
    key = "interest:{account}",
    ttl = "1m30s",
    min_hold = "0s",
    max_hold = "2h",
    on_contention = "skip",
    watchdog = true,
    on_lost = "abort",
)]
async fn skip_unit(account: u64) {
    assert!(current_lease().is_some());
    let _ = account;
}

#[distributed_lock(key = "wait", on_contention = "wait", wait_timeout = "5s", on_lost = "continue")]
async fn wait_alias() -> JobResult<u32> {
    Ok(1)
}

#[distributed_lock(key = "wait-forever", on_contention = "wait", watchdog = false, ttl = "500ms")]
async fn wait_forever() -> anyhow::Result<u32> {
    Ok(2)
}

#[distributed_lock(key = "error", on_contention = "error")]
async fn error_policy() -> anyhow::Result<String> {
    Ok("three".to_owned())
}

#[distributed_lock(key = "option")]
async fn option_return() -> Option<u64> {
    current_lease()?.fence().await.ok()
}

#[distributed_lock(key = "once:{day}", once = "7d")]
async fn once_per_day(day: &str) -> anyhow::Result<Option<u32>> {
    Ok(Some(day.len() as u32))
}

#[distributed_lock(key = "generic:{item}", on_contention = "error")]
async fn generic<T: Display + Send + Sync>(item: &T) -> Result<String, LockError> {
    Ok(item.to_string())
}

struct Account {
    id: u64,
    balance: u64,
}

impl Account {
    #[distributed_lock(key = "account:{self.id}")]
    async fn read(&self) -> Option<u64> {
        Some(self.balance)
    }

    #[distributed_lock(key = "account:{self.id}", on_contention = "error")]
    async fn credit(&mut self, amount: u64) -> JobResult<u64> {
        self.balance += amount;
        Ok(self.balance)
    }
}

#[derive(Clone, Copy)]
struct Id(u32);

impl Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "id-{}", self.0)
    }
}

struct Order {
    id: Id,
}

#[distributed_lock(key = "order:{order.id}")]
async fn field_placeholder(order: &Order) -> Option<String> {
    Some(current_lease()?.key().to_owned())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let locks = LockRuntime::builder()
        .memory(MemoryStore::new())
        .build()
        .await
        .expect("build");
    locks
        .scope(async {
            skip_unit(7).await;
            assert_eq!(wait_alias().await.expect("ran"), 1);
            assert_eq!(wait_forever().await.expect("ran"), 2);
            assert_eq!(error_policy().await.expect("ran"), "three");
            assert!(option_return().await.is_some_and(|fence| fence > 0));
            assert_eq!(once_per_day("monday").await.expect("ran"), Some(6));
            assert_eq!(once_per_day("monday").await.expect("skipped"), None);
            assert_eq!(generic(&5).await.expect("ran"), "5");
            let mut account = Account { id: 1, balance: 10 };
            assert_eq!(account.read().await, Some(10));
            assert_eq!(account.credit(5).await.expect("ran"), 15);
            let order = Order { id: Id(9) };
            assert_eq!(field_placeholder(&order).await.as_deref(), Some("order:id-9"));
        })
        .await;
}
