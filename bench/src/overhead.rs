//! Where the attribute's overhead goes (`--macro-overhead`): row 6 on the memory store, where
//! a pair costs a few microseconds and any fixed cost of the generated code shows, taken
//! apart. Each variant adds one thing the generated code does to the programmatic pair (the
//! runtime's task-local scope, the tracing span, the two boxed store calls) or is the
//! attribute itself, scoped as in row 6 or through the installed runtime. One task, fresh
//! process (no earlier rows), the variants rotating between rounds; median ns per pair.
//! `--redis` runs the same variants against a private redis-server.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockRuntime, MemoryStore, distributed_lock};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

#[distributed_lock(key = "{key}", ttl = "10s")]
async fn attribute_pair(key: &str) -> Option<()> {
    Some(())
}

#[derive(Clone, Copy, Debug)]
enum Variant {
    Programmatic,
    InScope,
    Boxed,
    AttributeScoped,
    AttributeInstalled,
}

const VARIANTS: [(Variant, &str); 5] = [
    (Variant::Programmatic, "programmatic pair"),
    (Variant::InScope, "programmatic, inside runtime.scope"),
    (Variant::Boxed, "programmatic, both calls boxed"),
    (Variant::AttributeScoped, "attribute, scoped (row 6)"),
    (Variant::AttributeInstalled, "attribute, installed runtime"),
];

async fn programmatic(runtime: &LockRuntime, key: &str) -> anyhow::Result<()> {
    let guard = runtime.lock(key).ttl(TTL).try_acquire().await?;
    let guard = guard.ok_or_else(|| anyhow::anyhow!("an uncontended key was held"))?;
    guard.release().await?;
    Ok(())
}

async fn boxed(runtime: &LockRuntime, key: &str) -> anyhow::Result<()> {
    let acquire: Pin<Box<dyn Future<Output = _> + Send>> =
        Box::pin(runtime.lock(key).ttl(TTL).try_acquire());
    let guard = acquire
        .await?
        .ok_or_else(|| anyhow::anyhow!("an uncontended key was held"))?;
    let release: Pin<Box<dyn Future<Output = _> + Send>> = Box::pin(guard.release());
    release.await?;
    Ok(())
}

async fn one(variant: Variant, runtime: &LockRuntime, key: &str) -> anyhow::Result<()> {
    match variant {
        Variant::Programmatic => programmatic(runtime, key).await,
        Variant::InScope => runtime.scope(programmatic(runtime, key)).await,
        Variant::Boxed => boxed(runtime, key).await,
        Variant::AttributeScoped => runtime
            .scope(attribute_pair(key))
            .await
            .ok_or_else(|| anyhow::anyhow!("an uncontended key was held")),
        Variant::AttributeInstalled => attribute_pair(key)
            .await
            .ok_or_else(|| anyhow::anyhow!("an uncontended key was held")),
    }
}

/// Pairs per second of `variant` for `slice`, one task.
async fn rate(
    variant: Variant,
    runtime: &Arc<LockRuntime>,
    slice: Duration,
    key: String,
) -> anyhow::Result<f64> {
    let runtime = runtime.clone();
    tokio::spawn(async move {
        let started = Instant::now();
        let stop = started + slice;
        let mut pairs = 0u64;
        while Instant::now() < stop {
            one(variant, &runtime, &key).await?;
            pairs += 1;
        }
        Ok(pairs as f64 / started.elapsed().as_secs_f64())
    })
    .await?
}

/// What `breakdown` measured.
pub(crate) struct Breakdown {
    /// (label, median ns per pair) per variant, the programmatic pair first.
    pub(crate) medians: Vec<(&'static str, f64)>,
    /// The size of a `try_acquire` future, which the attribute boxes.
    pub(crate) acquire_future_bytes: usize,
}

/// Measures and prints the breakdown: on the memory store, or on `redis` when given (where a
/// pair is a round trip or two and the fixed costs show only as a share of it).
pub(crate) async fn breakdown(
    rounds: usize,
    slice: Duration,
    redis: Option<&lock_tests::RedisServer>,
) -> anyhow::Result<Breakdown> {
    let builder = LockRuntime::builder();
    let (runtime, store) = match redis {
        Some(server) => (builder.redis(server.url()).build().await?, "redis"),
        None => (
            builder.memory(MemoryStore::new()).build().await?,
            "memory store",
        ),
    };
    runtime.clone().install()?;
    let runtime = Arc::new(runtime);
    let (acquire_size, release_size, attribute_size) = {
        let acquire = runtime.lock("size").try_acquire();
        let attribute = attribute_pair("size");
        let guard = runtime
            .lock("size")
            .try_acquire()
            .await?
            .ok_or_else(|| anyhow::anyhow!("`size` was held"))?;
        let release = guard.release();
        let release_size = std::mem::size_of_val(&release);
        release.await?;
        (
            std::mem::size_of_val(&acquire),
            release_size,
            std::mem::size_of_val(&attribute),
        )
    };
    // What the boxing moves to the heap on every call.
    println!(
        "future sizes: try_acquire {acquire_size} B, release {release_size} B; an annotated call {attribute_size} B (its store calls boxed)"
    );
    let mut ns = vec![Vec::new(); VARIANTS.len()];
    for round in 0..rounds {
        for i in (0..VARIANTS.len()).map(|k| (k + round) % VARIANTS.len()) {
            let pairs_per_s = rate(VARIANTS[i].0, &runtime, slice, format!("o-{i}")).await?;
            ns[i].push(1e9 / pairs_per_s.max(1.0));
        }
    }
    let medians: Vec<(&'static str, f64)> = VARIANTS
        .iter()
        .zip(ns)
        .map(|((_, label), samples)| (*label, crate::rows::median(samples)))
        .collect();
    let base = medians[0].1;
    println!("{store}, 1 task, median of {rounds} rounds of {slice:?}:");
    for (label, ns) in &medians {
        println!(
            "  {label:<38} {ns:>8.0} ns/pair  (+{:>5.0} ns; {:.3}x the programmatic rate)",
            ns - base,
            base / ns
        );
    }
    runtime.shutdown().await;
    Ok(Breakdown {
        medians,
        acquire_future_bytes: acquire_size,
    })
}
