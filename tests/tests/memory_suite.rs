//! The behaviour suite on the in-process memory store, called directly (`.memory(..)`),
//! through the public `LockStore` trait (`.store(..)`), the way a third-party store is, and as
//! the three members of a Redlock quorum (`RedlockStore::over(..)`).
lock_testkit::behaviour_suite!(lock_tests::TestStore::memory());
lock_testkit::attribute_suite!(lock_tests::TestStore::memory());

mod through_the_store_trait {
    lock_testkit::behaviour_suite!(lock_tests::TestStore::plugged());
    lock_testkit::attribute_suite!(lock_tests::TestStore::plugged());
}

mod fenced_on_demand {
    lock_testkit::behaviour_suite!(lock_tests::TestStore::on_demand());
    lock_testkit::attribute_suite!(lock_tests::TestStore::on_demand());
}

mod as_a_redlock_quorum {
    lock_testkit::behaviour_suite!(lock_tests::TestStore::redlock_memory());
    lock_testkit::attribute_suite!(lock_tests::TestStore::redlock_memory());
}

mod quorum_members {
    use std::time::Duration;

    use lock_runtime::store::{
        AcquireOutcome, AcquireRequest, ExtendItem, KeyNames, LockStore, RecordView,
        ReleaseOutcome, ReleaseWatch, Renewal,
    };
    use lock_runtime::{LockError, LockRuntime, MemoryStore, RedlockStore};
    use lock_tests::{Built, Free, TakeFree};

    /// A store that keeps every promise but cannot lift fences (the trait's default).
    #[derive(Clone, Default)]
    struct NoLift(MemoryStore);

    impl LockStore for NoLift {
        async fn acquire(&self, r: AcquireRequest<'_>) -> Result<AcquireOutcome, LockError> {
            self.0.acquire(r).await
        }
        async fn release(
            &self,
            names: &KeyNames,
            token: &str,
            done_retention: Option<Duration>,
        ) -> Result<ReleaseOutcome, LockError> {
            self.0.release(names, token, done_retention).await
        }
        async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
            self.0.extend(items).await
        }
        async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
            self.0.inspect(names).await
        }
        async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
            self.0.watch_releases(names).await
        }
        async fn list(
            &self,
            ns: &str,
            pattern: &str,
        ) -> Result<Vec<(String, RecordView)>, LockError> {
            self.0.list(ns, pattern).await
        }
        async fn force_release(&self, names: &KeyNames, fence: u64) -> Result<bool, LockError> {
            self.0.force_release(names, fence).await
        }
    }

    /// A quorum of stores that cannot lift fences says so at the first acquire (a final
    /// error naming `raise_fence`), rather than answering "held" forever; nothing is left
    /// taken.
    #[tokio::test]
    async fn a_quorum_of_stores_without_raise_fence_says_so() {
        let members: Vec<NoLift> = (0..3).map(|_| NoLift::default()).collect();
        let runtime = LockRuntime::builder()
            .store(RedlockStore::over(members.iter().cloned()))
            .built()
            .await;
        let err = runtime
            .lock("unliftable")
            .try_acquire()
            .await
            .expect_err("members without raise_fence cannot make a quorum");
        assert!(
            matches!(&err, LockError::Backend(e) if !e.is_transient()),
            "{err:?}"
        );
        assert!(err.to_string().contains("raise_fence"), "{err}");
        let names = KeyNames::new("lock", "unliftable");
        for member in &members {
            assert!(
                member.0.inspect(&names).await.expect("inspect").is_none(),
                "given back"
            );
        }
    }

    /// How a [`Scripted`] member answers renewals.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Answer {
        AsItIs,
        Unknown,
        Error,
    }

    /// A memory store whose renewals answer as told, and whose releases fail (a transient
    /// error) while told to; everything else as the store does.
    #[derive(Clone)]
    pub(super) struct Scripted(
        MemoryStore,
        std::sync::Arc<std::sync::Mutex<Answer>>,
        std::sync::Arc<std::sync::atomic::AtomicBool>,
    );

    impl Scripted {
        pub(super) fn new() -> Self {
            Scripted(
                MemoryStore::new(),
                std::sync::Arc::new(std::sync::Mutex::new(Answer::AsItIs)),
                std::sync::Arc::default(),
            )
        }

        fn answer(&self, answer: Answer) {
            *self.1.lock().expect("answer") = answer;
        }

        pub(super) fn fail_releases(&self, fail: bool) {
            self.2.store(fail, std::sync::atomic::Ordering::SeqCst);
        }

        pub(super) fn store(&self) -> &MemoryStore {
            &self.0
        }
    }

    impl LockStore for Scripted {
        async fn acquire(&self, r: AcquireRequest<'_>) -> Result<AcquireOutcome, LockError> {
            self.0.acquire(r).await
        }
        async fn release(
            &self,
            names: &KeyNames,
            token: &str,
            done_retention: Option<Duration>,
        ) -> Result<ReleaseOutcome, LockError> {
            if self.2.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(lock_runtime::BackendError::transient("releases fail").into());
            }
            self.0.release(names, token, done_retention).await
        }
        async fn extend(&self, items: &[ExtendItem]) -> Result<Vec<Renewal>, LockError> {
            let answer = *self.1.lock().expect("answer");
            match answer {
                Answer::AsItIs => self.0.extend(items).await,
                Answer::Unknown => Ok(items
                    .iter()
                    .map(|_| Renewal::Unknown("this member cannot tell".to_owned()))
                    .collect()),
                Answer::Error => Err(lock_runtime::BackendError::transient("unreachable").into()),
            }
        }
        async fn inspect(&self, names: &KeyNames) -> Result<Option<RecordView>, LockError> {
            self.0.inspect(names).await
        }
        async fn watch_releases(&self, names: &KeyNames) -> Result<ReleaseWatch, LockError> {
            self.0.watch_releases(names).await
        }
        async fn list(
            &self,
            ns: &str,
            pattern: &str,
        ) -> Result<Vec<(String, RecordView)>, LockError> {
            self.0.list(ns, pattern).await
        }
        async fn force_release(&self, names: &KeyNames, fence: u64) -> Result<bool, LockError> {
            self.0.force_release(names, fence).await
        }
        async fn raise_fence(
            &self,
            names: &KeyNames,
            token: &str,
            fence: u64,
            ttl: Duration,
        ) -> Result<bool, LockError> {
            self.0.raise_fence(names, token, fence, ttl).await
        }
    }

    /// A quorum's renewal that misses its quorum because members cannot tell (one renews, one
    /// answers "unknown", one errors) is unknown, not "not ours": no member said the lease is
    /// gone, so the holder is not told it lost the lock at that renewal; the watchdog tries
    /// again until the validity ends. Only enough members answering "not ours" that no quorum
    /// can renew any more is a loss.
    #[tokio::test]
    async fn a_quorum_renewal_that_cannot_tell_is_not_a_loss() {
        let members: Vec<Scripted> = (0..3).map(|_| Scripted::new()).collect();
        let runtime = LockRuntime::builder()
            .store(RedlockStore::over(members.iter().cloned()))
            .built()
            .await;
        let guard = runtime
            .lock("cannot-tell")
            .ttl(Duration::from_secs(30))
            .watchdog(false)
            .try_acquire()
            .await
            .free();
        members[1].answer(Answer::Unknown);
        members[2].answer(Answer::Error);
        let extended = guard.extend(Duration::from_secs(30)).await;
        assert!(
            extended.as_ref().is_err_and(LockError::is_transient),
            "one renewal of three, no member said \"not ours\": {extended:?}"
        );
        assert!(
            !guard.lease().is_lost(),
            "no member said the lease is gone: still valid until its ttl ends"
        );
        // Two members that say "not ours" leave no quorum that could renew it: lost.
        members[1].answer(Answer::AsItIs);
        members[2].answer(Answer::AsItIs);
        let names = KeyNames::new("lock", "cannot-tell");
        let record = members[1]
            .0
            .inspect(&names)
            .await
            .expect("inspect")
            .expect("held");
        assert!(
            members[1]
                .0
                .force_release_holder(&names, &record.holder)
                .await
                .expect("force")
        );
        let record = members[2]
            .0
            .inspect(&names)
            .await
            .expect("inspect")
            .expect("held");
        assert!(
            members[2]
                .0
                .force_release_holder(&names, &record.holder)
                .await
                .expect("force")
        );
        assert!(
            !guard.extend(Duration::from_secs(30)).await.expect("extend"),
            "two of three say the lease is gone"
        );
        assert!(guard.lease().is_lost());
        runtime.shutdown().await;
    }

    /// A quorum release that one member took while the others failed (a passing error) is a
    /// failure to retry, not a release: until a quorum of members no longer holds the record,
    /// nobody else can take the lock. Dropping the outcome there left the record on two of
    /// three members for the rest of its ttl.
    #[tokio::test]
    async fn a_release_a_quorum_did_not_take_is_tried_again() {
        let members: Vec<Scripted> = (0..3).map(|_| Scripted::new()).collect();
        let runtime = |owner: &'static str| {
            LockRuntime::builder()
                .store(RedlockStore::over(members.iter().cloned()))
                .owner(owner)
                .build()
        };
        let (a, b) = (
            runtime("a").await.expect("a"),
            runtime("b").await.expect("b"),
        );
        let guard = a.take("half-released", Duration::from_secs(30)).await;
        members[1].fail_releases(true);
        members[2].fail_releases(true);
        let released = guard.release().await;
        assert!(
            released.as_ref().is_err_and(LockError::is_transient),
            "one member of three released it: {released:?}"
        );
        members[1].fail_releases(false);
        members[2].fail_releases(false);
        let got = b
            .lock("half-released")
            .acquire_timeout(Duration::from_secs(5))
            .await;
        assert!(
            got.is_ok(),
            "the release, tried again, frees a quorum well before the 30 s ttl: {got:?}"
        );
        a.shutdown().await;
        b.shutdown().await;
    }
}

mod background_releases {
    use std::time::Duration;

    use lock_runtime::LockRuntime;
    use lock_runtime::store::{KeyNames, LockStore};
    use lock_tests::{Built, TakeFree};
    use tokio::time::Instant;

    use super::quorum_members::Scripted;

    /// A shutdown that begins while a dropped guard's background release pauses between two
    /// tries (100 ms doubling to 2 s) makes its last try at once, instead of holding the
    /// shutdown up for the rest of the pause. Paused time: the figures are the runtime's
    /// own timers, not the machine's speed.
    #[tokio::test(start_paused = true)]
    async fn a_shutdown_cuts_the_pause_between_release_tries_short() {
        let store = Scripted::new();
        let runtime = LockRuntime::builder().store(store.clone()).built().await;
        let guard = runtime.take("pausing", Duration::from_secs(60)).await;
        store.fail_releases(true);
        drop(guard);
        // Five tries have failed by now; the sixth waits out a pause of 1-2 s.
        tokio::time::sleep(Duration::from_secs(3)).await;
        store.fail_releases(false);
        let began = Instant::now();
        runtime.shutdown().await;
        let took = began.elapsed();
        assert!(
            took < Duration::from_millis(50),
            "shutdown waited {took:?} for a release pausing between tries"
        );
        let names = KeyNames::new("lock", "pausing");
        assert!(
            store
                .store()
                .inspect(&names)
                .await
                .expect("inspect")
                .is_none(),
            "the last try, made at the shutdown, released it"
        );
    }
}
