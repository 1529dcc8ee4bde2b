//! The operators' calls, `LockRuntime::list` and `LockRuntime::force_release` (what lockctl
//! shows and does), on every store.

use crate::short::{Free, two_runtimes};
use std::time::Duration;

use lock_runtime::LockInfo;
use tokio::time::Instant;

use crate::Harness;

/// `list` shows the held locks of the namespace that match the pattern, with owner, fence and
/// time left; `force_release` frees a held lock at once: a waiter gets it within seconds
/// rather than the holder's ttl, the holder learns at its next renewal that it lost it, and
/// the fence keeps rising; a forced release naming an earlier holder's fence leaves the new
/// holder alone.
pub async fn list_and_force_release<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let take = |key: &'static str, ttl: Duration| {
        let a = a.clone();
        async move { a.lock(key).ttl(ttl).try_acquire().await.free() }
    };
    let one = take("ops:one", Duration::from_secs(3)).await;
    let two = take("ops:two", Duration::from_secs(20)).await;
    let other = take("other", Duration::from_secs(20)).await;
    let keys = |listed: &[LockInfo]| listed.iter().map(|l| l.key.clone()).collect::<Vec<_>>();

    let listed = b.list("ops:*").await.expect("list");
    assert_eq!(keys(&listed), ["ops:one", "ops:two"]);
    let shown = &listed[1];
    assert_eq!(shown.owner, a.owner());
    assert_eq!(shown.fence, two.lease().fence());
    let remaining = shown.remaining.expect("a lease has an expiry");
    assert!(remaining > Duration::from_secs(10) && remaining <= Duration::from_secs(20));
    assert!(shown.quorum.is_none_or(|q| q.has_quorum()), "{shown:?}");
    assert_eq!(keys(&b.list("ops:?ne").await.expect("list")), ["ops:one"]);
    assert_eq!(
        keys(&b.list("*").await.expect("list")),
        ["ops:one", "ops:two", "other"]
    );
    assert!(b.list("none:*").await.expect("list").is_empty());

    // A waiter in b, then the lock forced free: the waiter gets it long before the 3 s ttl
    // could run out and be renewed away.
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            let guard = b
                .lock("ops:one")
                .ttl(Duration::from_secs(20))
                .acquire_timeout(Duration::from_secs(15))
                .await
                .expect("the waiter gets the lock");
            (Instant::now(), guard)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the lock is held: the waiter waits");
    let forced = Instant::now();
    assert!(b.force_release("ops:one").await.expect("force release"));
    let (woke, taken) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is woken")
        .expect("the waiter task");
    assert!(
        woke.duration_since(forced) < Duration::from_secs(2),
        "woken {:?} after the forced release",
        woke.duration_since(forced)
    );
    assert!(taken.lease().fence() > one.lease().fence());
    // The same forced release again (a retry, or a call arriving late) names the fence it was
    // meant for: the new holder keeps the lock.
    assert!(
        !b.force_release_fence("ops:one", one.lease().fence())
            .await
            .expect("force release with an old fence")
    );
    let still = b.inspect("ops:one").await.expect("inspect").expect("held");
    assert_eq!(
        still.fence,
        taken.lease().fence(),
        "the new holder was left alone"
    );
    // The old holder renews every second (ttl / 3) and finds the record gone or another's.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !one.lease().is_lost() {
        assert!(
            Instant::now() < deadline,
            "the forced-out holder did not learn it lost the lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let listed = a.list("ops:*").await.expect("list");
    assert_eq!(keys(&listed), ["ops:one", "ops:two"]);
    assert_eq!(listed[0].owner, b.owner());
    assert_eq!(listed[0].fence, taken.lease().fence());

    assert!(
        !a.force_release("free-key")
            .await
            .expect("force release of a free lock")
    );
    // `?` stands for one character, however many bytes it takes.
    let wide = take("uni:é", Duration::from_secs(20)).await;
    assert_eq!(keys(&b.list("uni:?").await.expect("list")), ["uni:é"]);
    assert!(wide.release().await.expect("release"));
    assert!(taken.release().await.expect("release"));
    assert!(two.release().await.expect("release"));
    assert!(other.release().await.expect("release"));
    assert!(!one.release().await.expect("release of a lost lease"));
    assert!(a.list("*").await.expect("list").is_empty());
}
