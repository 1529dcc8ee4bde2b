//! The behaviour suite on a real redis-server per test.
lock_tests::behaviour_suite!(lock_tests::TestStore::redis());
lock_tests::attribute_suite!(lock_tests::TestStore::redis());
