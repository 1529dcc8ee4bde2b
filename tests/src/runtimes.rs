//! Runtimes the tests build again and again.

use std::time::Duration;

use lock_runtime::LockRuntime;

/// A runtime on the Redis server at `url` (often a fault proxy in front of one), with
/// `command_timeout` and a 2 s connect timeout.
pub async fn redis_runtime(url: String, command_timeout: Duration) -> LockRuntime {
    LockRuntime::builder()
        .redis(url)
        .command_timeout(command_timeout)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("build")
}
