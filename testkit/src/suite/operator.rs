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
    // Asked while held: a store that computes fences on demand gives none after the forced
    // release.
    let one_fence = one.lease().fence().await.expect("a fence");
    let two = take("ops:two", Duration::from_secs(20)).await;
    let two_fence = two.lease().fence().await.expect("a fence");
    let other = take("other", Duration::from_secs(20)).await;
    let keys = |listed: &[LockInfo]| listed.iter().map(|l| l.key.clone()).collect::<Vec<_>>();

    let listed = b.list("ops:*").await.expect("list");
    assert_eq!(keys(&listed), ["ops:one", "ops:two"]);
    let shown = &listed[1];
    assert_eq!(shown.owner, a.owner());
    assert_eq!(shown.fence, Some(two_fence));
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
    assert!(taken.lease().fence().await.expect("a fence") > one_fence);
    // The same forced release again (a retry, or a call arriving late) names the fence it was
    // meant for: the new holder keeps the lock.
    assert!(
        !b.force_release_fence("ops:one", one_fence)
            .await
            .expect("force release with an old fence")
    );
    let still = b.inspect("ops:one").await.expect("inspect").expect("held");
    assert_eq!(
        still.fence,
        Some(taken.lease().fence().await.expect("a fence")),
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
    assert_eq!(
        listed[0].fence,
        Some(taken.lease().fence().await.expect("a fence"))
    );

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

/// Every holding has its own holder id, the same on each read while it lasts: a forced
/// release naming the id frees that holding and no later one, even a later one of the same
/// owner; `force_release` reads the id and frees the holding it read.
pub async fn force_release_names_one_holding<H: Harness>(store: &H) {
    let (a, b) = two_runtimes(store).await;
    let lock = || a.lock("ops:holding").ttl(Duration::from_secs(20));
    let first = lock().try_acquire().await.free();
    let seen = b
        .inspect("ops:holding")
        .await
        .expect("inspect")
        .expect("held");
    assert!(!seen.holder.is_empty(), "{seen:?}");
    let again = b
        .inspect("ops:holding")
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(again.holder, seen.holder, "one holding, one id");
    let listed = b.list("ops:*").await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].holder, seen.holder, "list and inspect agree");
    assert!(first.release().await.expect("release"));

    // The same owner takes the lock again: a new holding, with its own id.
    let second = lock().try_acquire().await.free();
    let now = b
        .inspect("ops:holding")
        .await
        .expect("inspect")
        .expect("held");
    assert_ne!(now.holder, seen.holder, "a new holding has a new id");
    assert!(
        !b.force_release_holder("ops:holding", &seen.holder)
            .await
            .expect("a forced release naming the first holding"),
        "the first holding is gone: nothing is removed"
    );
    let kept = b
        .inspect("ops:holding")
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(kept.holder, now.holder, "the second holding was left alone");
    assert!(
        b.force_release_holder("ops:holding", &now.holder)
            .await
            .expect("a forced release naming the second holding")
    );
    assert!(b.inspect("ops:holding").await.expect("inspect").is_none());
    assert!(
        !second
            .release()
            .await
            .expect("release of a forced-out lease")
    );
    // The same call again (retried, or late) finds nothing of that holding.
    assert!(
        !b.force_release_holder("ops:holding", &now.holder)
            .await
            .expect("the forced release again")
    );
}
