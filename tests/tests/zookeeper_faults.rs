//! The ZooKeeper store under faults, on real ensembles: the leader killed mid-lease, a holder
//! process paused past its session (within its ttl, and past it), and a holder cut off from
//! the ensemble behind the fault proxy. In each, the holder keeps its lease (and its fence)
//! or knows it lost it before anyone else gets the lock; never two holders; and a runtime
//! whose session expired works again with a new one.

use std::time::Duration;

use lock_runtime::{LockRuntime, ZooKeeperStore};
use lock_tests::{Built, FaultProxy, Free, Helper, RedisServer, TakeFree, ZooKeeperEnsemble};
use tokio::time::Instant;

/// The session timeout the paused holders ask for, and how the servers' log says they
/// expired such a session (`Expiring session 0x.., timeout of 1500ms exceeded`); no other
/// session in these tests has it.
const HOLDER_SESSION_MS: u64 = 1500;

/// Waits (up to 30 s) until the one-member `ensemble` expired the paused holder's session.
async fn wait_session_expired(ensemble: &ZooKeeperEnsemble) {
    let said = format!("timeout of {HOLDER_SESSION_MS}ms exceeded");
    let until = Instant::now() + Duration::from_secs(30);
    while !ensemble.log(0).contains(&said) {
        assert!(
            Instant::now() < until,
            "the paused holder's session did not expire within 30 s; log:\n{}",
            ensemble.log(0)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `<fence>` of a helper's line `<word> <fence>`.
fn fence_in(line: &str, word: &str) -> u64 {
    line.strip_prefix(word)
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or_else(|| panic!("expected `{word} <fence>`, the helper said {line:?}"))
}

/// The leader of a three-member ensemble killed while a lease is held: the lease lives on
/// (its renewals ride out the election), nobody else gets the lock meanwhile, and the next
/// holder's fence is greater than every fence before the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_outlives_the_leaders_death_and_fences_keep_increasing() {
    let mut ensemble = ZooKeeperEnsemble::start(3);
    let a = LockRuntime::builder()
        .zookeeper(ensemble.connect_string())
        .owner("a")
        .built()
        .await;
    let b = LockRuntime::builder()
        .zookeeper(ensemble.connect_string())
        .owner("b")
        .built()
        .await;
    let mut fences = Vec::new();
    for _ in 0..3 {
        let guard = a.take_default_ttl("through-election").await;
        fences.push(guard.lease().fence().await.expect("fence"));
        assert!(guard.release().await.expect("release"));
    }
    let held = a
        .lock("through-election")
        .ttl(Duration::from_secs(12))
        .try_acquire()
        .await
        .free();
    fences.push(held.lease().fence().await.expect("fence"));
    let leader = ensemble.leader().expect("a leader");
    ensemble.kill(leader);
    // Past the 12 s ttl (an election of up to 5 s and reconnections under load fit in it):
    // the survivors elect a leader and the renewals go on.
    let until = tokio::time::Instant::now() + Duration::from_secs(14);
    while tokio::time::Instant::now() < until {
        if let Ok(Some(stolen)) = b.lock("through-election").try_acquire().await {
            panic!(
                "b took a lock a still held (a lost: {}), fence {:?}",
                held.lease().is_lost(),
                stolen.lease().fence().await
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        !held.lease().is_lost(),
        "the lease lived through the election"
    );
    assert!(held.release().await.expect("release"));
    let next = b.take_default_ttl("through-election").await;
    let fence = next.lease().fence().await.expect("fence");
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    assert!(
        fences.iter().all(|&f| f < fence),
        "{fence} after {fences:?}"
    );
    assert!(next.release().await.expect("release"));
    ensemble.restart(leader);
}

/// A holder process stopped (SIGSTOP) past its 1.5 s session and past its 2 s ttl: the
/// servers expire its session, another process takes the lock with a greater fence and
/// writes to the fenced ledger; resumed, the holder's first look says its lease is lost, its
/// careless write is refused, and its runtime, on a new session, takes another lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_session_and_ttl_knows_it_lost_before_working_again() {
    let ensemble = ZooKeeperEnsemble::start(1);
    let connect = ensemble.connect_string();
    let ledger = RedisServer::start();
    let mut holder = Helper::start_with_stdin(
        env!("CARGO_BIN_EXE_fenced_writer"),
        &[
            format!("zookeeper:{connect}"),
            "ledger-job".into(),
            "2000".into(),
            ledger.url(),
        ],
        &[(
            "ZOOKEEPER_SESSION_TIMEOUT_MS",
            HOLDER_SESSION_MS.to_string(),
        )],
    );
    let mut stdin = holder.stdin();
    let old_fence = fence_in(&holder.next_line().await, "acquired");
    // Said just after the acquire: its 2 s ttl runs out no earlier than about 2 s from here.
    let acquired = Instant::now();
    holder.signal("-STOP");
    wait_session_expired(&ensemble).await;
    let contender = LockRuntime::builder()
        .zookeeper(connect.as_str())
        .owner("contender")
        .built()
        .await;
    let guard = contender
        .lock("ledger-job")
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("the paused holder's lease ran out");
    assert!(
        acquired.elapsed() >= Duration::from_millis(1700),
        "taken {:?} after the paused holder said it acquired, before its 2 s ttl ran out",
        acquired.elapsed()
    );
    let fence = guard.lease().fence().await.expect("a fence");
    assert!(fence > old_fence, "{fence} after {old_fence}");
    let mut conn = ledger.conn().await;
    lock_tests::fenced::new_holder_writes_and_the_paused_one_is_refused(
        &mut conn,
        fence,
        &mut holder,
        &mut stdin,
    )
    .await;
    let again = holder
        .next_line_within(Duration::from_secs(30))
        .await
        .expect("the resumed holder's runtime takes another lock within 30 s");
    assert!(fence_in(&again, "again") > fence, "{again} after {fence}");
    assert!(guard.release().await.expect("release"));
}

/// A holder process stopped past its 1.5 s session but well within its 12 s ttl: the servers
/// expire the session, yet the lease does not ride on the session. Resumed,
/// the holder renews on a new session: nobody else gets the lock for longer than the ttl,
/// the holder is never told it lost it, and its shutdown releases it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_past_the_session_but_within_the_ttl_keeps_the_lease() {
    let ensemble = ZooKeeperEnsemble::start(1);
    let connect = ensemble.connect_string();
    let mut holder = Helper::start(
        env!("CARGO_BIN_EXE_lock_holder"),
        &[
            format!("zookeeper:{connect}"),
            "kept".into(),
            "12000".into(),
        ],
        &[(
            "ZOOKEEPER_SESSION_TIMEOUT_MS",
            HOLDER_SESSION_MS.to_string(),
        )],
    );
    let fence = fence_in(&holder.next_line().await, "acquired");
    let acquired = Instant::now();
    holder.signal("-STOP");
    wait_session_expired(&ensemble).await;
    holder.signal("-CONT");
    assert!(
        acquired.elapsed() < Duration::from_secs(8),
        "the pause outlasted the session and stayed well within the ttl"
    );
    let contender = LockRuntime::builder()
        .zookeeper(connect.as_str())
        .owner("contender")
        .built()
        .await;
    // Past the 12 s the lease had when it was taken: only renewals made after the pause keep it.
    while acquired.elapsed() < Duration::from_secs(16) {
        if let Some(stolen) = contender.try_take("kept").await {
            panic!(
                "the contender took the lock (fence {:?}) the resumed holder should have kept; \
                 the holder said {:?}",
                stolen.lease().fence().await,
                holder.next_line_within(Duration::from_secs(1)).await
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if let Some(said) = holder.next_line_within(Duration::from_millis(200)).await {
        panic!("the resumed holder said {said:?}; it kept its lease");
    }
    holder.signal("-TERM");
    assert_eq!(
        holder.next_line().await,
        "shut down",
        "the holder released on its new session"
    );
    let next = contender.take_default_ttl("kept").await;
    assert!(next.lease().fence().await.expect("a fence") > fence);
    assert!(next.release().await.expect("release"));
}

/// A holder whose only way to the ensemble is one member behind the fault proxy, cut off
/// (every byte held, new connections refused) while it holds a 3 s lease: a contender on the
/// other two members gets the lock only once the holder counts it lost. Healed, the holder's
/// late release of its old guard leaves the contender's holding alone, and its runtime (on a
/// new session: the old one expired in the partition) takes the lock again with a greater
/// fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_behind_the_proxy_is_told_before_anyone_else_gets_the_lock() {
    let ensemble = ZooKeeperEnsemble::start(3);
    let proxy = FaultProxy::start(ensemble.members[0].port());
    let holder = LockRuntime::builder()
        .store(
            ZooKeeperStore::new(format!("127.0.0.1:{}", proxy.port()))
                .session_timeout(Duration::from_secs(2)),
        )
        .owner("holder")
        .command_timeout(Duration::from_secs(2))
        .built()
        .await;
    let others = format!(
        "{},{}",
        ensemble.members[1].address(),
        ensemble.members[2].address()
    );
    let contender = LockRuntime::builder()
        .zookeeper(others)
        .owner("contender")
        .built()
        .await;
    let guard = holder.take("cut-off", Duration::from_secs(3)).await;
    let lease = guard.lease().clone();
    let fence = lease.fence().await.expect("a fence");

    proxy.refuse(true);
    proxy.stall();
    let until = Instant::now() + Duration::from_secs(8);
    let mut fences = Vec::new();
    while Instant::now() < until {
        if let Some(taken) = contender.try_take("cut-off").await {
            assert!(
                lease.is_lost(),
                "the contender got the lock while the cut-off holder still believed it held it"
            );
            fences.push(taken.lease().fence().await.expect("a fence"));
            assert!(taken.release().await.expect("release"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!fences.is_empty(), "the cut-off holder's 3 s lease ran out");
    assert!(lease.is_lost(), "the cut-off holder counts its lease lost");
    let kept = contender.take_default_ttl("cut-off").await;
    let kept_fence = kept.lease().fence().await.expect("a fence");
    fences.push(kept_fence);
    assert!(
        fences.iter().all(|&f| f > fence),
        "{fences:?} after {fence}"
    );

    proxy.drop_connections_and_what_they_hold();
    proxy.resume();
    proxy.refuse(false);
    // The old guard's release, late (a failed one goes on in the background): it must not
    // touch the contender's holding. The holder's runtime answering again, on a new session,
    // and a second more, give the background release its time.
    let _ = guard.release().await;
    let healed = Instant::now() + Duration::from_secs(30);
    while holder.inspect("cut-off").await.is_err() {
        assert!(
            Instant::now() < healed,
            "the healed holder's runtime answers within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        contender
            .inspect("cut-off")
            .await
            .expect("inspect")
            .is_some_and(|record| record.fence == Some(kept_fence)),
        "the contender still holds"
    );
    assert!(kept.release().await.expect("release"));
    let back = holder
        .lock("cut-off")
        .acquire_timeout(Duration::from_secs(30))
        .await
        .expect("the healed holder's runtime takes the lock again");
    let back_fence = back.lease().fence().await.expect("a fence");
    assert!(back_fence > kept_fence, "{back_fence} after {kept_fence}");
    assert!(back.release().await.expect("release"));
}
