//! The conformance kit (behaviour and attribute suites) on a real PostgreSQL server per test.
lock_testkit::behaviour_suite!(lock_tests::TestStore::postgres());
lock_testkit::attribute_suite!(lock_tests::TestStore::postgres());
