//! The behaviour suite and the attribute suite on real etcd: a one-member cluster per case,
//! and a three-member cluster per case.
lock_testkit::behaviour_suite!(lock_tests::TestStore::etcd());
lock_testkit::attribute_suite!(lock_tests::TestStore::etcd());

mod three_members {
    lock_testkit::behaviour_suite!(lock_tests::TestStore::etcd_cluster());
    lock_testkit::attribute_suite!(lock_tests::TestStore::etcd_cluster());
}
