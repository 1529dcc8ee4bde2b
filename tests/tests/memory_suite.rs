//! The behaviour suite on the in-process memory store.
lock_tests::behaviour_suite!(lock_tests::TestStore::memory());
lock_tests::attribute_suite!(lock_tests::TestStore::memory());
