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
}
