//! Bad input gets a clear `LockError`, never a panic; no password ever shows.

use lock_tests::Built;
use lock_tests::TakeFree;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use lock_runtime::{LockError, LockRuntime, MemoryStore};
use lock_tests::RedisServer;

async fn memory_runtime() -> LockRuntime {
    LockRuntime::builder()
        .memory(MemoryStore::new())
        .built()
        .await
}

fn assert_config(result: Result<impl std::fmt::Debug, LockError>, needle: &str) {
    match result {
        Err(LockError::Config(message)) => {
            assert!(
                message.contains(needle),
                "`{message}` should mention `{needle}`"
            )
        }
        other => panic!("expected a Config error mentioning `{needle}`, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_requests_are_config_errors() {
    let rt = memory_runtime().await;
    assert_config(rt.lock("").try_acquire().await, "must not be empty");
    assert_config(rt.lock("k".repeat(1025)).try_acquire().await, "1024 bytes");
    assert!(rt.try_take("k".repeat(1024)).await.is_some());
    assert_config(rt.lock("a{b}").try_acquire().await, "brace");
    // The operators' calls check their key or pattern the same way.
    assert_config(rt.list("").await, "must not be empty");
    assert_config(rt.list("a{*").await, "brace");
    assert_config(rt.force_release("").await, "must not be empty");
    assert_config(rt.force_release("x}").await, "brace");
    assert_config(rt.inspect("\u{7}").await, "control character");
    assert_config(
        rt.lock("line\nbreak").try_acquire().await,
        "control character",
    );
    assert_config(
        rt.lock("k").ttl(Duration::ZERO).try_acquire().await,
        "longer than zero",
    );
    assert_config(
        rt.lock("k")
            .ttl(Duration::from_secs(400 * 24 * 3600))
            .try_acquire()
            .await,
        "365 days",
    );
    assert_config(
        rt.lock("k")
            .ttl(Duration::from_secs(1))
            .min_hold(Duration::from_secs(2))
            .try_acquire()
            .await,
        "min_hold",
    );
    assert_config(
        rt.lock("k")
            .ttl(Duration::from_secs(10))
            .max_hold(Duration::from_secs(2))
            .acquire()
            .await,
        "max_hold",
    );
    assert_config(rt.inspect("").await, "must not be empty");
    let held = rt.take_default_ttl("ext").await;
    assert_config(held.extend(Duration::ZERO).await, "longer than zero");
}

#[tokio::test]
async fn bad_builders_are_config_errors() {
    assert_config(LockRuntime::builder().build().await, "no store configured");
    let memory = || LockRuntime::builder().memory(MemoryStore::new());
    let cases = [
        (memory().redis("redis://127.0.0.1:1"), "two stores"),
        (memory().namespace(""), "namespace must not be empty"),
        (memory().namespace("a{b"), "brace"),
        (memory().default_ttl(Duration::ZERO), "default_ttl"),
        (memory().owner(""), "owner must not be empty"),
        (
            LockRuntime::builder().redis("not a url"),
            "cannot use Redis URL",
        ),
        (
            LockRuntime::builder().redis("http://127.0.0.1:6379"),
            "cannot use Redis URL",
        ),
    ];
    for (builder, needle) in cases {
        assert_config(builder.build().await, needle);
    }
}

#[tokio::test]
async fn unreachable_server_fails_within_the_connect_timeout() {
    // A port that was free a moment ago: connection refused.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let start = Instant::now();
    let err = LockRuntime::builder()
        .redis(format!("redis://127.0.0.1:{port}"))
        .connect_timeout(Duration::from_secs(1))
        .build()
        .await
        .expect_err("nothing listens there");
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    assert!(err.to_string().contains("cannot connect"), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "took {:?}",
        start.elapsed()
    );

    // A listener that accepts and never answers: bounded by the timeout, too.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let start = Instant::now();
    let err = LockRuntime::builder()
        .redis(format!("redis://127.0.0.1:{port}"))
        .connect_timeout(Duration::from_secs(1))
        .build()
        .await
        .expect_err("a silent server");
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "took {:?}",
        start.elapsed()
    );
    drop(silent);
}

#[tokio::test]
async fn passwords_never_appear_in_errors_debug_or_logs() {
    const SECRET: &str = "s3cr3t-Pa55";
    let captured = lock_tests::LogCapture::default();
    let _default = captured.install();

    let server = RedisServer::start_with(&["--requirepass", SECRET]);
    let mut texts = Vec::new();

    // Wrong password, right server.
    let wrong = format!("redis://default:not-{SECRET}@127.0.0.1:{}", server.port());
    let builder = LockRuntime::builder().redis(wrong.clone());
    texts.push(format!("{builder:?}"));
    let err = builder.build().await.expect_err("wrong password");
    texts.push(err.to_string());
    texts.push(format!("{err:?}"));
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");

    // Right password on a closed port, percent-encoded too.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    for url in [
        format!("redis://user:{SECRET}@127.0.0.1:{port}"),
        format!("redis://:{SECRET}@127.0.0.1:{port}/0"),
        format!(
            "redis://user:{}@127.0.0.1:{port}",
            SECRET.replace('-', "%2D")
        ),
        format!("redis://user:{SECRET}@"),
        format!("bogus://user:{SECRET}@host"),
    ] {
        let err = LockRuntime::builder()
            .redis(url)
            .connect_timeout(Duration::from_millis(500))
            .build()
            .await
            .expect_err("nothing there");
        texts.push(err.to_string());
        texts.push(format!("{err:?}"));
        let mut source = std::error::Error::source(&err);
        while let Some(s) = source {
            texts.push(s.to_string());
            texts.push(format!("{s:?}"));
            source = s.source();
        }
    }

    // Every topology's connect errors, and their builders' Debug output.
    let closed = |i: u16| format!("redis://user:{SECRET}@127.0.0.1:{}", port.wrapping_add(i));
    let topologies = [
        LockRuntime::builder().redis_cluster([closed(0), closed(1)]),
        LockRuntime::builder().redis_sentinel("master", [closed(0)]),
        LockRuntime::builder().redlock([closed(0), closed(1), closed(2)]),
    ];
    for builder in topologies {
        texts.push(format!("{builder:?}"));
        let err = builder
            .connect_timeout(Duration::from_millis(500))
            .build()
            .await
            .expect_err("nothing there");
        texts.push(err.to_string());
        texts.push(format!("{err:?}"));
    }

    // The right password works, and its runtime's Debug shows no secret.
    let good = LockRuntime::builder()
        .redis(format!(
            "redis://default:{SECRET}@127.0.0.1:{}",
            server.port()
        ))
        .built()
        .await;
    // Its Debug names the store it locks in, the password masked: the check below has
    // something to look at.
    let shown = format!("{good:?}");
    assert!(
        shown.contains(&format!("127.0.0.1:{}", server.port())) && shown.contains("***"),
        "the runtime's Debug should show its server, masked: {shown}"
    );
    texts.push(shown);
    let guard = good.take_default_ttl("secretive").await;
    drop(guard);
    good.shutdown().await;

    let logs = captured.text();
    texts.push(logs);
    for text in &texts {
        assert!(!text.contains(SECRET), "a password leaked: {text}");
        assert!(
            !text.contains("s3cr3t%2DPa55"),
            "an encoded password leaked: {text}"
        );
    }
    assert!(
        texts.iter().any(|t| t.contains("***")),
        "URLs are shown redacted"
    );
}
