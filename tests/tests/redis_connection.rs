//! The store's own connection to one Redis server (`store/redis/wire.rs`): its replies line
//! up with the requests that asked, also when a request gave up before its reply came.

use std::time::Duration;

use lock_tests::runtimes::redis_runtime;
use lock_tests::{FaultProxy, RedisServer};

/// A request that timed out leaves its connection up, and its reply, when it comes, must go
/// to no one: handed to the next request on the connection, the late "OK" of an acquire would
/// tell that request it holds a lock another runtime holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_comes_after_its_request_gave_up_goes_to_no_one_else() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let direct = redis_runtime(server.url(), Duration::from_secs(2)).await;
    let other = direct
        .lock("held-elsewhere")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .expect("acquire")
        .expect("the lock was free");

    let slow = redis_runtime(proxy.url(), Duration::from_millis(400)).await;
    proxy.set_reply_latency(Duration::from_millis(1_500));
    let timed_out = slow
        .lock("free")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await;
    assert!(timed_out.is_err(), "no reply within 400 ms: {timed_out:?}");
    proxy.set_reply_latency(Duration::ZERO);
    // Sent on the same connection behind the acquire whose "OK" is still on its way.
    let second = slow
        .lock("held-elsewhere")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .expect("an answer");
    assert!(
        second.is_none(),
        "told it holds a lock the other runtime holds"
    );
    // And the connection still works.
    let third = slow
        .lock("third")
        .ttl(Duration::from_secs(5))
        .try_acquire()
        .await
        .expect("an answer");
    assert!(third.is_some(), "a free lock is granted");
    drop(other);
}
