//! The behaviour suite and the attribute suite on real ZooKeeper: a one-member server per
//! case, and a three-member ensemble per case.
lock_testkit::behaviour_suite!(lock_tests::TestStore::zookeeper());
lock_testkit::attribute_suite!(lock_tests::TestStore::zookeeper());

mod three_members {
    lock_testkit::behaviour_suite!(lock_tests::TestStore::zookeeper_ensemble());
    lock_testkit::attribute_suite!(lock_tests::TestStore::zookeeper_ensemble());
}
