//! The behaviour suite and the attribute suite on real ZooKeeper: a one-member server per
//! case.
lock_testkit::behaviour_suite!(lock_tests::TestStore::zookeeper());
lock_testkit::attribute_suite!(lock_tests::TestStore::zookeeper());
