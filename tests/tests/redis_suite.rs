//! The behaviour suite on a real redis-server per test.
lock_testkit::behaviour_suite!(lock_tests::TestStore::redis());
lock_testkit::attribute_suite!(lock_tests::TestStore::redis());
