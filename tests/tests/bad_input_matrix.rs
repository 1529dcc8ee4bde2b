//! The bad-input matrix: every kind of bad input to the builder, the programmatic API and the
//! attribute's runtime path gets a clear `LockError` (or a clear `false`), never a panic. Run
//! with `--nocapture` to print the table that docs/guarantees.md shows.

use lock_tests::Built;
use std::future::Future;
use std::net::TcpListener;
use std::pin::Pin;
use std::time::Duration;

use lock_runtime::{LockError, LockRuntime, MemoryStore, RedisStore, distributed_lock};
use lock_tests::RedisServer;

type Case = Pin<Box<dyn Future<Output = Result<String, LockError>> + Send>>;

fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

async fn memory() -> LockRuntime {
    LockRuntime::builder()
        .memory(MemoryStore::new())
        .built()
        .await
}

fn build(builder: lock_runtime::LockRuntimeBuilder) -> Case {
    Box::pin(async move { builder.build().await.map(|_| "built".to_owned()) })
}

fn try_lock(f: impl FnOnce(LockRuntime) -> lock_runtime::LockRequest + Send + 'static) -> Case {
    Box::pin(async move {
        let rt = memory().await;
        f(rt)
            .try_acquire()
            .await
            .map(|g| format!("acquired: {}", g.is_some()))
    })
}

#[distributed_lock(key = "report:{name}", on_contention = "error")]
async fn attribute_job(name: &str) -> Result<(), LockError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_gets_a_clear_error() {
    let secured = RedisServer::start_with(&["--requirepass", "right-password"]);
    let secured_port = secured.port();
    let fast = Duration::from_millis(700);
    let cases: Vec<(&str, Case)> = vec![
        ("builder: no store", build(LockRuntime::builder())),
        (
            "builder: two stores",
            build(
                LockRuntime::builder()
                    .memory(MemoryStore::new())
                    .redis("redis://127.0.0.1:1"),
            ),
        ),
        (
            "builder: empty namespace",
            build(
                LockRuntime::builder()
                    .memory(MemoryStore::new())
                    .namespace(""),
            ),
        ),
        (
            "builder: namespace with braces",
            build(
                LockRuntime::builder()
                    .memory(MemoryStore::new())
                    .namespace("a{b}"),
            ),
        ),
        (
            "builder: namespace with a control character",
            build(
                LockRuntime::builder()
                    .memory(MemoryStore::new())
                    .namespace("a\tb"),
            ),
        ),
        (
            "builder: 2 KiB namespace",
            build(
                LockRuntime::builder()
                    .memory(MemoryStore::new())
                    .namespace("n".repeat(2048)),
            ),
        ),
        (
            "builder: zero default_ttl",
            build(
                LockRuntime::builder()
                    .memory(MemoryStore::new())
                    .default_ttl(Duration::ZERO),
            ),
        ),
        (
            "builder: default_ttl of 400 days",
            build(
                LockRuntime::builder()
                    .memory(MemoryStore::new())
                    .default_ttl(Duration::from_secs(400 * 86_400)),
            ),
        ),
        (
            "builder: empty owner",
            build(LockRuntime::builder().memory(MemoryStore::new()).owner("")),
        ),
        (
            "builder: zero connect_timeout",
            build(
                LockRuntime::builder()
                    .memory(MemoryStore::new())
                    .connect_timeout(Duration::ZERO),
            ),
        ),
        (
            "URL: not a URL",
            build(LockRuntime::builder().redis("not a url")),
        ),
        (
            "URL: wrong scheme",
            build(LockRuntime::builder().redis("http://127.0.0.1:6379")),
        ),
        (
            "URL: malformed IPv6 host",
            build(LockRuntime::builder().redis("redis://[::1:6379")),
        ),
        (
            "URL: port out of range",
            build(LockRuntime::builder().redis("redis://127.0.0.1:99999")),
        ),
        (
            "URL: closed port",
            build(
                LockRuntime::builder()
                    .redis(format!("redis://127.0.0.1:{}", closed_port()))
                    .connect_timeout(fast),
            ),
        ),
        (
            "URL: wrong password",
            build(
                LockRuntime::builder()
                    .redis(format!("redis://:wrong-password@127.0.0.1:{secured_port}")),
            ),
        ),
        (
            "URL: password missing",
            Box::pin(async move {
                let rt = LockRuntime::builder()
                    .redis(format!("redis://127.0.0.1:{secured_port}"))
                    .build()
                    .await?;
                rt.lock("k")
                    .try_acquire()
                    .await
                    .map(|g| format!("acquired: {}", g.is_some()))
            }),
        ),
        (
            "cluster: no seed nodes",
            build(LockRuntime::builder().redis_cluster(Vec::<String>::new())),
        ),
        (
            "redlock: only 2 masters",
            build(LockRuntime::builder().redlock(["redis://127.0.0.1:1", "redis://127.0.0.1:2"])),
        ),
        (
            "sentinel: empty master name",
            build(LockRuntime::builder().redis_sentinel("", ["redis://127.0.0.1:1"])),
        ),
        (
            "replicated_acquire: 0 replicas",
            build(
                LockRuntime::builder()
                    .store(RedisStore::new("redis://127.0.0.1:1").replicated_acquire(0, fast)),
            ),
        ),
        (
            "replicated_acquire: 0 replicas, through Sentinel",
            build(
                LockRuntime::builder().store(
                    RedisStore::sentinel("mymaster", ["redis://127.0.0.1:1"])
                        .replicated_acquire(0, fast),
                ),
            ),
        ),
        // The deprecated builder setter, forwarded to the store: the same checks, and refused
        // where it does not apply (the store types do not offer it there).
        (
            "replicated_acquire (deprecated setter): 0 replicas",
            build(
                #[allow(deprecated)]
                LockRuntime::builder()
                    .redis("redis://127.0.0.1:1")
                    .replicated_acquire(0, fast),
            ),
        ),
        (
            "replicated_acquire (deprecated setter): on the memory store",
            build(
                #[allow(deprecated)]
                LockRuntime::builder()
                    .memory(MemoryStore::new())
                    .replicated_acquire(1, fast),
            ),
        ),
        ("key: empty", try_lock(|rt| rt.lock(""))),
        ("key: 1025 bytes", try_lock(|rt| rt.lock("k".repeat(1025)))),
        ("key: with braces", try_lock(|rt| rt.lock("a{b}c"))),
        ("key: binary (NUL byte)", try_lock(|rt| rt.lock("a\u{0}b"))),
        ("key: newline", try_lock(|rt| rt.lock("a\nb"))),
        ("ttl: zero", try_lock(|rt| rt.lock("k").ttl(Duration::ZERO))),
        (
            "ttl: 10 microseconds",
            try_lock(|rt| rt.lock("k").ttl(Duration::from_micros(10))),
        ),
        (
            "ttl: 400 days",
            try_lock(|rt| rt.lock("k").ttl(Duration::from_secs(400 * 86_400))),
        ),
        (
            "ttl: Duration::MAX",
            try_lock(|rt| rt.lock("k").ttl(Duration::MAX)),
        ),
        (
            "min_hold longer than ttl",
            try_lock(|rt| {
                rt.lock("k")
                    .ttl(Duration::from_secs(1))
                    .min_hold(Duration::from_secs(5))
            }),
        ),
        (
            "max_hold shorter than ttl",
            try_lock(|rt| {
                rt.lock("k")
                    .ttl(Duration::from_secs(10))
                    .max_hold(Duration::from_secs(1))
            }),
        ),
        (
            "once: zero retention",
            try_lock(|rt| rt.lock("k").once(Duration::ZERO)),
        ),
        (
            "inspect: empty key",
            Box::pin(async move { memory().await.inspect("").await.map(|i| format!("{i:?}")) }),
        ),
        (
            "extend: zero ttl",
            Box::pin(async move {
                let rt = memory().await;
                let guard = rt.lock("k").try_acquire().await?.expect("free");
                guard
                    .extend(Duration::ZERO)
                    .await
                    .map(|b| format!("extended: {b}"))
            }),
        ),
        (
            "extend: a lost lease",
            Box::pin(async move {
                let store = MemoryStore::new();
                let rt = LockRuntime::builder().memory(store.clone()).build().await?;
                let guard = rt.lock("k").try_acquire().await?.expect("free");
                store.clear();
                guard
                    .extend(Duration::from_secs(5))
                    .await
                    .map(|b| format!("extended: {b}"))
            }),
        ),
        (
            "release: a lease already taken over",
            Box::pin(async move {
                let store = MemoryStore::new();
                let rt = LockRuntime::builder().memory(store.clone()).build().await?;
                let guard = rt
                    .lock("k")
                    .ttl(Duration::from_millis(50))
                    .watchdog(false)
                    .try_acquire()
                    .await?
                    .expect("free");
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _other = rt.lock("k").try_acquire().await?.expect("expired");
                guard.release().await.map(|b| format!("released: {b}"))
            }),
        ),
        (
            "lock after shutdown",
            Box::pin(async move {
                let rt = memory().await;
                rt.shutdown().await;
                rt.lock("k")
                    .try_acquire()
                    .await
                    .map(|g| format!("acquired: {}", g.is_some()))
            }),
        ),
        (
            "attribute: no runtime configured",
            Box::pin(async move { attribute_job("daily").await.map(|()| "ran".to_owned()) }),
        ),
        (
            "attribute: placeholder value with braces",
            Box::pin(async move {
                let rt = memory().await;
                rt.scope(attribute_job("{evil}"))
                    .await
                    .map(|()| "ran".to_owned())
            }),
        ),
    ];
    let mut table = String::from("| bad input | result |\n|---|---|\n");
    let mut failures = Vec::new();
    let count = cases.len();
    for (name, case) in cases {
        // A panic inside would surface as a JoinError here, never abort the test silently.
        let outcome = tokio::spawn(case).await;
        let shown = match &outcome {
            Err(join) => {
                failures.push(format!("{name}: PANICKED: {join}"));
                "panic".to_owned()
            }
            Ok(Ok(value)) => {
                check(&mut failures, name, "Ok", value);
                format!("`Ok`: {value}")
            }
            Ok(Err(e)) => {
                let variant = format!("{e:?}");
                let variant = variant
                    .split(['(', ' ', '{'])
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                check(&mut failures, name, &variant, &e.to_string());
                format!("`{variant}`: {}", e.to_string().replace('|', "/"))
            }
        };
        table.push_str(&format!("| {name} | {shown} |\n"));
    }
    println!("{table}");
    assert!(
        count >= 30,
        "the matrix covers at least 30 kinds of bad input"
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// What each row must answer: the `LockError` variant (or `Ok` for a clear `false`) and the
/// words a reader needs to fix the input, matched case-insensitively.
fn expected(name: &str) -> Option<(&'static str, &'static [&'static str])> {
    Some(match name {
        "builder: no store" => (
            "Config",
            &["no store configured", ".redis(url)", ".memory("],
        ),
        "builder: two stores" => ("Config", &["two stores", "memory", "redis", "choose one"]),
        "builder: empty namespace" => ("Config", &["namespace", "empty"]),
        "builder: namespace with braces" => ("Config", &["namespace", "a{b}", "brace"]),
        "builder: namespace with a control character" => {
            ("Config", &["namespace", "control character"])
        }
        "builder: 2 KiB namespace" => ("Config", &["namespace", "2048 bytes", "1024"]),
        "builder: zero default_ttl" => ("Config", &["default_ttl", "longer than zero"]),
        "builder: default_ttl of 400 days" => ("Config", &["default_ttl", "365 days"]),
        "builder: empty owner" => ("Config", &["owner", "empty"]),
        "builder: zero connect_timeout" => ("Config", &["connect_timeout", "longer than zero"]),
        "URL: not a URL" => ("Config", &["redis url", "not a url", "did not parse"]),
        "URL: wrong scheme" => ("Config", &["redis url", "http://", "did not parse"]),
        "URL: malformed IPv6 host" => ("Config", &["redis url", "[::1:6379", "did not parse"]),
        "URL: port out of range" => ("Config", &["redis url", "99999", "did not parse"]),
        // Refused at once, and said so (redis-rs' connection manager retried until the
        // connect timeout and said "no answer within").
        "URL: closed port" => ("Backend", &["cannot connect", "127.0.0.1", "refused"]),
        "URL: wrong password" => ("Backend", &["cannot connect", ":***@", "authentication"]),
        "URL: password missing" => ("Backend", &["cannot connect", "noauth"]),
        "cluster: no seed nodes" => ("Config", &["redis_cluster", "seed node"]),
        "redlock: only 2 masters" => ("Config", &["redlock", "at least 3", "got 2"]),
        "sentinel: empty master name" => ("Config", &["sentinel master name", "empty"]),
        "replicated_acquire: 0 replicas"
        | "replicated_acquire: 0 replicas, through Sentinel"
        | "replicated_acquire (deprecated setter): 0 replicas" => {
            ("Config", &["replicated_acquire", "at least 1"])
        }
        "replicated_acquire (deprecated setter): on the memory store" => (
            "Config",
            &["replicated_acquire", ".redis(url)", ".redis_sentinel"],
        ),
        "key: empty" => ("Config", &["lock key", "empty"]),
        "key: 1025 bytes" => ("Config", &["lock key", "1025 bytes", "1024"]),
        "key: with braces" => ("Config", &["lock key", "a{b}c", "brace"]),
        "key: binary (NUL byte)" => ("Config", &["lock key", "control character"]),
        "key: newline" => ("Config", &["lock key", "control character"]),
        "ttl: zero" => ("Config", &["ttl", "longer than zero"]),
        "ttl: 10 microseconds" => ("Config", &["ttl", "10µs", "1 ms resolution"]),
        "ttl: 400 days" => ("Config", &["ttl", "365 days"]),
        "ttl: Duration::MAX" => ("Config", &["ttl", "365 days"]),
        "min_hold longer than ttl" => ("Config", &["min_hold (5s)", "longer than the ttl (1s)"]),
        "max_hold shorter than ttl" => ("Config", &["max_hold (1s)", "shorter than the ttl (10s)"]),
        "once: zero retention" => ("Config", &["once retention", "longer than zero"]),
        "inspect: empty key" => ("Config", &["lock key", "empty"]),
        "extend: zero ttl" => ("Config", &["extend ttl", "longer than zero"]),
        "extend: a lost lease" => ("Ok", &["extended: false"]),
        "release: a lease already taken over" => ("Ok", &["released: false"]),
        "lock after shutdown" => ("Shutdown", &["shut down"]),
        "attribute: no runtime configured" => (
            "NotConfigured",
            &["no lock runtime", "install()", "LockRuntime::scope"],
        ),
        "attribute: placeholder value with braces" => {
            ("Config", &["lock key", "report:{evil}", "brace"])
        }
        _ => return None,
    })
}

/// Records a failure unless `variant` and `text` are what `expected` says for `name`.
fn check(failures: &mut Vec<String>, name: &str, variant: &str, text: &str) {
    let Some((want_variant, words)) = expected(name) else {
        failures.push(format!("{name}: no expectation written for this row"));
        return;
    };
    if variant != want_variant {
        failures.push(format!(
            "{name}: expected `{want_variant}`, got `{variant}`: {text}"
        ));
    }
    let lower = text.to_lowercase();
    for word in words {
        if !lower.contains(&word.to_lowercase()) {
            failures.push(format!("{name}: the message lacks \"{word}\": {text}"));
        }
    }
}
