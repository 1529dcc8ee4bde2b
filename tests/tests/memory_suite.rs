//! The behaviour suite on the in-process memory store, called directly (`.memory(..)`),
//! through the public `LockStore` trait (`.store(..)`), the way a third-party store is, and as
//! the three members of a Redlock quorum (`.redlock_stores(..)`).
lock_testkit::behaviour_suite!(lock_tests::TestStore::memory());
lock_testkit::attribute_suite!(lock_tests::TestStore::memory());

mod through_the_store_trait {
    lock_testkit::behaviour_suite!(lock_tests::TestStore::plugged());
    lock_testkit::attribute_suite!(lock_tests::TestStore::plugged());
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
    use lock_runtime::{LockError, LockRuntime, MemoryStore};

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
            .redlock_stores(members.iter().cloned())
            .build()
            .await
            .expect("a runtime");
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

    /// How a [`Renews`] member answers renewals.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Answer {
        AsItIs,
        Unknown,
        Error,
    }

    /// A memory store whose renewals answer as told; everything else as the store does.
    #[derive(Clone)]
    struct Renews(MemoryStore, std::sync::Arc<std::sync::Mutex<Answer>>);

    impl Renews {
        fn new() -> Self {
            Renews(
                MemoryStore::new(),
                std::sync::Arc::new(std::sync::Mutex::new(Answer::AsItIs)),
            )
        }

        fn answer(&self, answer: Answer) {
            *self.1.lock().expect("answer") = answer;
        }
    }

    impl LockStore for Renews {
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
        let members: Vec<Renews> = (0..3).map(|_| Renews::new()).collect();
        let runtime = LockRuntime::builder()
            .redlock_stores(members.iter().cloned())
            .build()
            .await
            .expect("a runtime");
        let guard = runtime
            .lock("cannot-tell")
            .ttl(Duration::from_secs(30))
            .watchdog(false)
            .try_acquire()
            .await
            .expect("acquire")
            .expect("free");
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
                .force_release(&names, record.fence)
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
                .force_release(&names, record.fence)
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
}
