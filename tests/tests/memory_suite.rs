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
