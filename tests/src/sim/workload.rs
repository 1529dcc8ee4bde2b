//! One simulated run: a few runtimes (service instances) on one simulated store, workers that
//! lock, hold, write through a fenced storage and let go in every way the API offers, and a
//! fault driver. Everything is drawn from one seed.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, PoisonError};
use std::time::Duration;

use lock_runtime::{
    Lease, LockError, LockGuard, LockRuntime, RedlockStore, current_lease, distributed_lock,
};
use tokio::time::Instant;

use super::history::{FaultKind, History, Verdict};
use super::store::SimStore;
use super::world::{Leases, NetFaults, World};
use crate::rng::XorShift;

/// The client-side timeout of one store call.
const TIMEOUT: Duration = Duration::from_millis(100);

/// Lease lengths the workers pick from.
const TTLS: [Duration; 4] = [
    Duration::from_millis(60),
    Duration::from_millis(150),
    Duration::from_millis(400),
    Duration::from_millis(1000),
];

/// Lease lengths the workers pick from on a store of whole-second leases (etcd), where the
/// ones above are all one second: a lease longer than the next `extend` asks for is what the
/// renewal rule must handle.
const WHOLE_SECOND_TTLS: [Duration; 4] = [
    Duration::from_millis(400),
    Duration::from_secs(1),
    Duration::from_millis(2_000),
    Duration::from_millis(3_000),
];

/// What one seed's run found.
#[derive(Debug)]
pub struct SimReport {
    /// The seed.
    pub seed: u64,
    /// Leases handed to callers.
    pub acquisitions: usize,
    /// Writes the fenced storage accepted and refused.
    pub writes: (u64, u64),
    /// The checker's verdict.
    pub verdict: Verdict,
    /// On a violation: the recent history of the first offending key.
    pub story: Option<String>,
    /// Digest of the run ([`History::fingerprint`]).
    pub fingerprint: u64,
}

thread_local! {
    static PANICS: Cell<u64> = const { Cell::new(0) };
}

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.with(|p| p.set(p.get() + 1));
            previous(info);
        }));
    });
}

/// Runs seed `seed` for `length` of simulated time on a fresh current-thread runtime with
/// paused time, and checks its history.
pub fn run_seed(seed: u64, length: Duration) -> SimReport {
    count_panics();
    let panics_before = PANICS.with(Cell::get);
    lock_runtime::__private::seed_jitter(Some(seed));
    let report = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
    {
        Ok(rt) => {
            let report = rt.block_on(simulate(seed, length));
            drop(rt);
            report
        }
        Err(e) => SimReport {
            seed,
            acquisitions: 0,
            writes: (0, 0),
            verdict: Verdict {
                violations: vec![format!("could not start a runtime: {e}")],
                ..Verdict::default()
            },
            story: None,
            fingerprint: 0,
        },
    };
    lock_runtime::__private::seed_jitter(None);
    let mut report = report;
    let panics = PANICS.with(Cell::get) - panics_before;
    if panics > 0 {
        report
            .verdict
            .violations
            .push(format!("{panics} panic(s) during the run"));
    }
    report
}

/// Shared by the tasks of one run.
struct Ctx {
    world: Arc<Mutex<World>>,
    keys: u64,
    stop: AtomicBool,
    /// No network faults and no failovers: every store call is answered in time.
    calm: bool,
    /// How the store counts a lease's time.
    leases: Leases,
    /// Added to every bound on an operation under Redlock: an acquire there takes up to three
    /// rounds of calls (the grant, the fence lift, the give-back of a failed quorum).
    slack: Duration,
}

impl Ctx {
    fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn history<T>(&self, f: impl FnOnce(&mut History) -> T) -> T {
        f(&mut self.world().history)
    }

    fn violation(&self, what: String) {
        self.history(|h| h.violation(what));
    }

    fn pick_ttl(&self, rng: &mut XorShift) -> Duration {
        let ttls = match self.leases {
            Leases::Exact => &TTLS,
            Leases::WholeSeconds => &WHOLE_SECOND_TTLS,
        };
        ttls[rng.below(ttls.len() as u64) as usize]
    }

    /// Records a new hold of `lease` and follows its loss.
    fn hold(self: &Arc<Self>, lease: &Lease, client: usize, renewed: bool) -> usize {
        let now = Instant::now();
        let id = self.history(|h| {
            h.hold(
                lease.key(),
                lease.token(),
                // The simulated store gives each lease its fence at acquire.
                lease.known_fence().expect("a fence given at acquire"),
                client,
                now,
                renewed,
            )
        });
        let ctx = self.clone();
        let watched = lease.clone();
        tokio::spawn(async move {
            watched.lost().await;
            let now = Instant::now();
            ctx.history(|h| h.lost(id, now));
        });
        id
    }

    fn write(&self, lease: &Lease, believed_valid: bool) {
        let now = Instant::now();
        self.history(|h| {
            h.write(
                lease.key(),
                lease.token(),
                // The simulated store gives each lease its fence at acquire.
                lease.known_fence().expect("a fence given at acquire"),
                believed_valid,
                now,
            )
        });
    }
}

/// Ends a hold when dropped: released, dropped, or stopped by `on_lost = "abort"`.
struct LetGo {
    ctx: Arc<Ctx>,
    id: usize,
}

impl Drop for LetGo {
    fn drop(&mut self) {
        let now = Instant::now();
        self.ctx.history(|h| h.unhold(self.id, now));
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn fraction(d: Duration, percent: u64) -> Duration {
    d * u32::try_from(percent).unwrap_or(100) / 100
}

async fn simulate(seed: u64, length: Duration) -> SimReport {
    let mut rng = XorShift::mixed(seed);
    let clients = 2 + rng.below(3) as usize;
    let keys = 1 + rng.below(3);
    // One run in five has a perfect network, so what a fault excuses is also seen without it.
    let calm = rng.below(5) == 0;
    let net = if calm {
        NetFaults {
            slow_reply: 0,
            lost_reply: 0,
            dropped_request: 0,
            sluggish_reply: 0,
            max_latency: Duration::from_micros(500),
        }
    } else {
        NetFaults {
            slow_reply: rng.below(15),
            lost_reply: rng.below(15),
            dropped_request: rng.below(15),
            sluggish_reply: rng.below(40),
            max_latency: Duration::from_micros(100 + rng.below(3000)),
        }
    };
    // One run in three locks by Redlock quorum over three deployments (the runtime's own
    // quorum code on simulated masters). Drawn apart from the run's generator, so a seed that
    // runs on one deployment goes exactly as it did before quorum runs existed.
    let nodes = if XorShift::mixed(seed ^ 0x0407_e5a3).below(3) == 0 {
        3
    } else {
        1
    };
    // One run of one deployment in five models etcd's whole-second leases. Drawn apart from
    // the run's generator too.
    let leases = if nodes == 1 && XorShift::mixed(seed ^ 0x0e7c_d5ec).below(5) == 0 {
        Leases::WholeSeconds
    } else {
        Leases::Exact
    };
    let world = Arc::new(Mutex::new(World::new(
        rng.next_u64(),
        clients,
        nodes,
        net,
        leases,
        TIMEOUT,
    )));
    let start = Instant::now();
    let end = start + length;
    let ctx = Arc::new(Ctx {
        world: world.clone(),
        keys,
        stop: AtomicBool::new(false),
        calm,
        leases,
        slack: if nodes > 1 { TIMEOUT } else { Duration::ZERO },
    });
    let mut runtimes = Vec::new();
    for client in 0..clients {
        let grace = ms(rng.below(400));
        let builder = if nodes == 1 {
            LockRuntime::builder().store(SimStore::new(world.clone(), client, 0))
        } else {
            LockRuntime::builder().store(RedlockStore::over(
                (0..nodes).map(|node| SimStore::new(world.clone(), client, node)),
            ))
        };
        match builder
            .owner(format!("sim-{client}"))
            .command_timeout(TIMEOUT)
            .shutdown_grace(grace)
            .build()
            .await
        {
            Ok(rt) => runtimes.push((rt, grace)),
            Err(e) => {
                ctx.violation(format!("build: {e}"));
                return report(seed, &ctx, Instant::now());
            }
        }
    }
    let mut workers = Vec::new();
    for (client, (rt, _)) in runtimes.iter().enumerate() {
        for _ in 0..2 + rng.below(2) {
            workers.push(tokio::spawn(worker(
                ctx.clone(),
                rt.clone(),
                client,
                rng.next_u64(),
            )));
        }
    }
    let faults =
        (!calm).then(|| tokio::spawn(fault_driver(ctx.clone(), clients, end, rng.next_u64())));
    // Subscriber connections drop in every faulty run and in half the calm ones, where the
    // wake-up rule has no other fault to excuse a waiter that slept through a release. Drawn
    // apart from the run's generator.
    let mut drops = XorShift::mixed(seed ^ 0x5ab_d409);
    let subscriber_drops = (!calm || drops.below(2) == 0).then(|| {
        tokio::spawn(subscriber_driver(
            ctx.clone(),
            clients,
            end,
            drops.next_u64(),
        ))
    });
    // Sometimes one instance shuts down in the middle of the run, and its process ends.
    if rng.below(3) == 0 {
        let client = rng.below(clients as u64) as usize;
        let (rt, grace) = runtimes[client].clone();
        let at = start + fraction(length, rng.below(100));
        let ctx = ctx.clone();
        workers.push(tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            ctx.history(|h| h.fault(Some(client), Instant::now(), FaultKind::Shutdown));
            shutdown_within(&ctx, &rt, grace, client).await;
            // Then its process ends, as a service's main returns after shutdown(): whatever
            // the runtime had not sent by then is never sent.
            ctx.world().end_process(client);
        }));
    }
    tokio::time::sleep_until(end).await;
    ctx.stop.store(true, Ordering::SeqCst);
    for f in [faults, subscriber_drops].into_iter().flatten() {
        f.abort();
    }
    for w in workers {
        match tokio::time::timeout(Duration::from_secs(60), w).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => ctx.violation(format!("a worker task failed: {e}")),
            Err(_) => {
                ctx.violation("liveness: a worker did not finish within 60 s of the end".into())
            }
        }
    }
    for (client, (rt, grace)) in runtimes.iter().enumerate() {
        shutdown_within(&ctx, rt, *grace, client).await;
    }
    // Let the background releases and the runtimes' tasks finish.
    tokio::time::sleep(Duration::from_secs(2)).await;
    report(seed, &ctx, Instant::now())
}

/// Checks the history of the run that ended at `run_end`.
fn report(seed: u64, ctx: &Ctx, run_end: Instant) -> SimReport {
    let world = ctx.world();
    let verdict = world
        .history
        .check(run_end, 3 * TIMEOUT + ms(50) + ctx.slack);
    let story = verdict
        .violations
        .first()
        .map(|v| world.history.story(v, story_lines()));
    SimReport {
        seed,
        acquisitions: world.history.acquisitions(),
        writes: world.history.writes,
        verdict,
        story,
        fingerprint: world.history.fingerprint(),
    }
}

async fn shutdown_within(ctx: &Ctx, rt: &LockRuntime, grace: Duration, client: usize) {
    let bound = grace + 3 * TIMEOUT + Duration::from_secs(1);
    if tokio::time::timeout(bound, rt.shutdown()).await.is_err() {
        ctx.violation(format!(
            "liveness: client {client}: shutdown did not return within {bound:?}"
        ));
    }
}

async fn within<T>(
    ctx: &Ctx,
    client: usize,
    what: &str,
    bound: Duration,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    match tokio::time::timeout(bound, fut).await {
        Ok(v) => Some(v),
        Err(_) => {
            ctx.violation(format!(
                "liveness: client {client}: {what} did not return within {bound:?}"
            ));
            None
        }
    }
}

async fn worker(ctx: Arc<Ctx>, rt: LockRuntime, client: usize, seed: u64) {
    let mut rng = XorShift::mixed(seed);
    while !ctx.stop.load(Ordering::SeqCst) {
        let key = format!("k{}", rng.below(ctx.keys));
        let ttl = ctx.pick_ttl(&mut rng);
        if rng.below(10) == 0 {
            let nap = rng.below(100);
            let outcome = within(
                &ctx,
                client,
                "an annotated call",
                Duration::from_secs(3),
                rt.scope(annotated(ctx.clone(), key, client, nap)),
            )
            .await;
            match outcome {
                None | Some(Err(LockError::Shutdown)) => return,
                Some(_) => {}
            }
            continue;
        }
        let watchdog = rng.below(5) != 0;
        let mut request = rt.lock(key.clone()).ttl(ttl).watchdog(watchdog);
        let mut renewed = watchdog;
        if rng.below(8) == 0 {
            request = request.min_hold(fraction(ttl, rng.below(100)));
        }
        if rng.below(8) == 0 {
            request = request.max_hold(ttl * (1 + rng.below(4) as u32));
            renewed = false;
        }
        let started = Instant::now();
        let waits = rng.below(2) == 1;
        let got = if !waits {
            within(
                &ctx,
                client,
                "try_acquire",
                3 * TIMEOUT + ctx.slack,
                request.try_acquire(),
            )
            .await
        } else {
            let wait = ms(rng.below(2000));
            within(
                &ctx,
                client,
                "acquire_timeout",
                wait + 3 * TIMEOUT + ctx.slack,
                request.acquire_timeout(wait),
            )
            .await
            .map(|r| r.map(Some))
        };
        if waits {
            let now = Instant::now();
            ctx.history(|h| h.wakeups.wait(client, &key, started, now));
        }
        match got {
            None | Some(Err(LockError::Shutdown)) => return,
            Some(Ok(Some(guard))) => hold(&ctx, guard, client, ttl, renewed, &mut rng).await,
            Some(Err(e)) => {
                // A waiter rides out a store it cannot reach (every simulated failure is
                // transient) until its deadline: it ends in a guard, WaitTimeout or Shutdown.
                if waits && !matches!(e, LockError::WaitTimeout { .. }) {
                    ctx.violation(format!(
                        "liveness: key {key}: client {client}: acquire_timeout gave up before its deadline on a transient error: {e}"
                    ));
                }
                // With every call answered in time, an acquire fails only by its deadline or
                // the shutdown; anything else needs a fault of this instance (a pause) to
                // explain it. Pauses last at most 2.2 s.
                if ctx.calm && !matches!(e, LockError::WaitTimeout { .. }) {
                    let now = Instant::now();
                    let explained = ctx.history(|h| {
                        h.disturbed(
                            client,
                            started
                                .checked_sub(Duration::from_secs(3))
                                .unwrap_or(started),
                            now,
                        )
                    });
                    if !explained {
                        ctx.violation(format!(
                            "liveness: key {key}: client {client}: an acquire failed with every call answered in time: {e}"
                        ));
                    }
                }
                tokio::time::sleep(ms(1 + rng.below(20))).await;
            }
            Some(Ok(None)) => tokio::time::sleep(ms(1 + rng.below(20))).await,
        }
    }
}

/// Holds a lease for a few steps, writing through the fenced storage, then lets go.
async fn hold(
    ctx: &Arc<Ctx>,
    guard: LockGuard,
    client: usize,
    ttl: Duration,
    renewed: bool,
    rng: &mut XorShift,
) {
    let lease = guard.lease().clone();
    let id = ctx.hold(&lease, client, renewed);
    let mut seen_lost = false;
    for _ in 0..1 + rng.below(4) {
        // Now and then the whole instance stops (a GC or VM pause) for longer than the lease:
        // nothing goes out, renewals included. Afterwards the holder writes without looking;
        // the fence must refuse that write if a newer holder has written.
        let paused = rng.below(25) == 0;
        let nap = if paused {
            2 * ttl + ms(rng.below(200))
        } else {
            fraction(ttl, rng.below(70)) + ms(1)
        };
        if paused {
            let now = Instant::now();
            let mut world = ctx.world();
            world.history.fault(Some(client), now, FaultKind::Pause);
            world.partition(client, now, now + nap);
        }
        tokio::time::sleep(nap).await;
        if paused {
            ctx.world().heal(client, Instant::now());
        }
        let lost = lease.is_lost();
        if seen_lost && !lost {
            ctx.violation(format!(
                "lease: client {client}: is_lost() of fence {:?} went back to false",
                lease.known_fence()
            ));
        }
        seen_lost |= lost;
        if !lost {
            ctx.write(&lease, true);
        } else if paused {
            ctx.write(&lease, false);
        }
        // On whole-second leases, often, and to a ttl of its own: longer or shorter than
        // the lease's, which moves the key between leases.
        let (extends, to) = match ctx.leases {
            Leases::Exact => (rng.below(10) == 0, ttl),
            Leases::WholeSeconds => (rng.below(3) == 0, ctx.pick_ttl(rng)),
        };
        if !lost && extends {
            let _ = within(
                ctx,
                client,
                "extend",
                3 * TIMEOUT + ms(50),
                guard.extend(to),
            )
            .await;
        }
    }
    let now = Instant::now();
    ctx.history(|h| h.unhold(id, now));
    if rng.below(4) == 0 {
        drop(guard);
    } else {
        let _ = within(
            ctx,
            client,
            "release",
            3 * TIMEOUT + ms(50),
            guard.release(),
        )
        .await;
    }
    if seen_lost && !lease.is_lost() {
        ctx.violation(format!(
            "lease: client {client}: is_lost() of fence {:?} went back to false after its release",
            lease.known_fence()
        ));
    }
    if lease.is_held() {
        ctx.violation(format!(
            "lease: client {client}: is_held() of fence {:?} after its guard was let go",
            lease.known_fence()
        ));
    }
}

#[distributed_lock(
    key = "{key}",
    ttl = "150ms",
    on_contention = "wait",
    wait_timeout = "300ms",
    on_lost = "abort"
)]
async fn annotated(
    ctx: Arc<Ctx>,
    key: String,
    client: usize,
    nap_ms: u64,
) -> Result<(), LockError> {
    let Some(lease) = current_lease() else {
        ctx.violation("attribute: no current lease inside an annotated body".into());
        return Ok(());
    };
    let id = ctx.hold(&lease, client, true);
    let _let_go = LetGo {
        ctx: ctx.clone(),
        id,
    };
    for _ in 0..3 {
        tokio::time::sleep(ms(nap_ms)).await;
        if lease.is_lost() {
            let at = ctx.world().since_start(Instant::now()).as_secs_f64();
            ctx.violation(format!(
                "attribute: key {key}: client {client}: on_lost = \"abort\" polled the body at {at:.3}s, after its lease (fence {:?}) was lost",
                lease.known_fence()
            ));
            return Ok(());
        }
        ctx.write(&lease, true);
    }
    Ok(())
}

/// Injects store-wide and per-client faults until `end`.
async fn fault_driver(ctx: Arc<Ctx>, clients: usize, end: Instant, seed: u64) {
    let mut rng = XorShift::mixed(seed);
    let rate = 1 + rng.below(4);
    while Instant::now() < end {
        tokio::time::sleep(ms(50 + rng.below(2000 / rate))).await;
        let now = Instant::now();
        let mut world = ctx.world();
        let nodes = world.nodes();
        match rng.below(10) {
            0 => {
                let node = pick(&mut rng, nodes);
                world.failover(node, now, ms(20 + rng.below(300)))
            }
            1 | 2 => {
                let client = rng.below(clients as u64) as usize;
                let until = now + ms(rng.below(1500));
                world.partition(client, now, until);
                drop(world);
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep_until(until).await;
                    ctx.world().heal(client, Instant::now());
                });
            }
            3 => {
                let node = pick(&mut rng, nodes);
                world.clock_step(node, now)
            }
            4 | 5 => {
                let node = pick(&mut rng, nodes);
                let lag = ms(rng.below(200));
                world.set_lag(node, now, lag);
            }
            _ => {
                let node = pick(&mut rng, nodes);
                world.set_lag(node, now, ms(rng.below(3)))
            }
        }
    }
}

/// Drops one client's subscriber connection to one deployment now and then; it comes back
/// after up to half a second, renewing its subscriptions.
async fn subscriber_driver(ctx: Arc<Ctx>, clients: usize, end: Instant, seed: u64) {
    let mut rng = XorShift::mixed(seed);
    while Instant::now() < end {
        tokio::time::sleep(ms(100 + rng.below(1500))).await;
        let client = rng.below(clients as u64) as usize;
        let now = Instant::now();
        let node = {
            let mut world = ctx.world();
            let node = pick(&mut rng, world.nodes());
            world.drop_subscriber(client, node, now);
            node
        };
        let back = now + ms(rng.below(500));
        let ctx = ctx.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(back).await;
            ctx.world()
                .reconnect_subscriber(client, node, Instant::now());
        });
    }
}

/// Which of `nodes` deployments a store fault hits; drawn only when there is a choice, so a
/// one-deployment run draws what it always drew.
fn pick(rng: &mut XorShift, nodes: usize) -> usize {
    if nodes > 1 {
        rng.below(nodes as u64) as usize
    } else {
        0
    }
}

/// How many lines of history a failure report shows (`SIM_STORY_LINES`, default 60).
fn story_lines() -> usize {
    std::env::var("SIM_STORY_LINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
}
