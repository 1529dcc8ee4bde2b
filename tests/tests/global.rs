//! The process-global runtime: its own test binary, since install() can happen once.

use lock_runtime::{LockError, LockRuntime, MemoryStore};
use lock_tests::Built;

#[tokio::test]
async fn not_configured_then_installed_then_already_configured() {
    assert!(matches!(
        LockRuntime::global(),
        Err(LockError::NotConfigured)
    ));
    assert!(matches!(
        LockRuntime::current(),
        Err(LockError::NotConfigured)
    ));
    let message = LockError::NotConfigured.to_string();
    assert!(
        message.contains("install"),
        "the error says what to do: {message}"
    );

    let store = MemoryStore::new();
    let global = LockRuntime::builder()
        .memory(store.clone())
        .owner("global")
        .built()
        .await;
    global.install().expect("first install");
    assert_eq!(LockRuntime::global().expect("installed").owner(), "global");

    let second = LockRuntime::builder().memory(store.clone()).built().await;
    assert!(matches!(
        second.install(),
        Err(LockError::AlreadyConfigured)
    ));

    // A scoped runtime takes precedence over the global one inside its scope only.
    let scoped = LockRuntime::builder()
        .memory(store)
        .owner("scoped")
        .built()
        .await;
    let inside = scoped
        .scope(async { LockRuntime::current().expect("scoped").owner().to_owned() })
        .await;
    assert_eq!(inside, "scoped");
    assert_eq!(LockRuntime::current().expect("global").owner(), "global");
}
