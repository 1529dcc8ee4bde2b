//! Where a pair's Redis server time goes (`--script-costs`): the real acquire and release
//! scripts of lock-runtime, pipelined on one connection, against what dispatch alone costs,
//! against the raw two-command lock, batched N to a script (what group commit could save),
//! and with one of their inner calls taken out (what each call costs; those variants are not
//! safe, they are only measured). Each figure is the server process's CPU time (INFO cpu) over
//! N uncontended pairs on fresh keys, median of the rounds, variants rotating between rounds.

use anyhow::Context;
use lock_tests::RedisServer;
use redis::aio::MultiplexedConnection;
use serde_json::json;

const ACQUIRE: &str = concat!(
    include_str!("../../lock-runtime/src/store/redis/lua/record.lua"),
    include_str!("../../lock-runtime/src/store/redis/lua/acquire.lua")
);
const RELEASE: &str = concat!(
    include_str!("../../lock-runtime/src/store/redis/lua/release.lua"),
    include_str!("../../lock-runtime/src/store/redis/lua/record.lua"),
    include_str!("../../lock-runtime/src/store/redis/lua/release_rest.lua")
);
const FENCE: &str = include_str!("../../lock-runtime/src/store/redis/lua/fence.lua");
const RELEASE_GROUP: &str =
    include_str!("../../lock-runtime/src/store/redis/lua/release_group.lua");

/// What one variant sends per pair.
#[derive(Clone)]
enum Pair {
    /// What the store sends for a plain request: SET NX PX of the record, the fence script
    /// when `fence` is given (a holder that asks for its fence), then the release script;
    /// with `marked`, the record carries a waiters mark (someone waited: the release reads its
    /// fields and publishes, to no subscriber here).
    Ours {
        release: String,
        fence: Option<String>,
        marked: bool,
    },
    /// A plain request's SET NX PX per pair, and its release in groups of this many records
    /// per call of this script (`release_group.lua`, the group commit of plain releases).
    OursGrouped(String, usize),
    /// `acquire` and `release` scripts (SHA), called once per pair.
    Scripts(String, String),
    /// Batch scripts carrying this many pairs' acquires, then their releases.
    Batched(String, String, usize),
    /// SET NX PX, then this compare-and-delete script (the raw lock of the benchmark).
    Raw(String),
    /// SET NX PX, then DEL: no script at all.
    Native,
}

struct Variant {
    label: &'static str,
    pair: Pair,
    /// Whether each pair leaves its fence counter behind (the acquire script ran through).
    counters: bool,
}

/// Replaces `old` in `text`, which must contain it: a variant must change what it says.
fn without(text: &str, old: &str, new: &str) -> anyhow::Result<String> {
    anyhow::ensure!(text.contains(old), "the script no longer contains {old:?}");
    Ok(text.replace(old, new))
}

/// A script that applies `body` (a script of `keys` keys and `args` arguments) to each group of
/// keys and arguments in turn and returns the answers in order.
fn batch_of(body: &str, keys: usize, args: usize) -> String {
    let mut inner: String = body
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    for i in 1..=8 {
        inner = inner
            .replace(&format!("KEYS[{i}]"), &format!("K[{i}]"))
            .replace(&format!("ARGV[{i}]"), &format!("A[{i}]"));
    }
    let k: Vec<String> = (1..=keys).map(|i| format!("KEYS[{keys}*i+{i}]")).collect();
    let a: Vec<String> = (1..=args).map(|i| format!("ARGV[{args}*i+{i}]")).collect();
    format!(
        "local function one(K, A)\n{inner}\nend\nlocal out = {{}}\nfor i = 0, #KEYS / {keys} - 1 do\n  out[#out + 1] = one({{{}}}, {{{}}})\nend\nreturn out\n",
        k.join(", "),
        a.join(", ")
    )
}

async fn load(conn: &mut MultiplexedConnection, script: &str) -> anyhow::Result<String> {
    Ok(redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script)
        .query_async(conn)
        .await?)
}

async fn server_cpu(conn: &mut MultiplexedConnection) -> anyhow::Result<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok(field("used_cpu_sys:") + field("used_cpu_user:"))
}

/// The keys and arguments of pair `i`'s acquire.
fn acquire_args(i: usize) -> (Vec<String>, Vec<String>) {
    let key = format!("lock:{{c{i}}}");
    let keys = vec![key.clone(), format!("{key}:fence"), format!("{key}:done")];
    let args = [
        &format!("{i:032x}"),
        "bench-owner",
        "30000",
        "0",
        "0",
        "60000",
        &format!("{key}:released"),
        "0",
    ]
    .map(str::to_owned)
    .to_vec();
    (keys, args)
}

/// The keys and arguments of pair `i`'s release: with the value its lean acquire wrote when
/// `lean` (the release's one-comparison case), else with none (a scripted record).
fn release_args(i: usize, lean: bool) -> (Vec<String>, Vec<String>) {
    let key = format!("lock:{{c{i}}}");
    let token = format!("{i:032x}");
    let value = if lean {
        lean_value(&token)
    } else {
        String::new()
    };
    (vec![key], vec![token, value, "0".to_owned()])
}

/// The record a lean acquire of `token` writes.
fn lean_value(token: &str) -> String {
    format!("{token} - - 0 bench-owner")
}

/// The lean acquire: `SET key value NX PX 30000`.
fn lean_set(key: &str, value: &str) -> redis::Cmd {
    let mut set = redis::cmd("SET");
    set.arg(key).arg(value).arg("NX").arg("PX").arg(30_000);
    set
}

fn evalsha(sha: &str, keys: &[String], args: &[String]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(keys.len()).arg(keys).arg(args);
    cmd
}

/// The commands of pairs `range` in `pair`'s form.
fn commands(pair: &Pair, range: std::ops::Range<usize>) -> Vec<redis::Cmd> {
    let mut out = Vec::new();
    match pair {
        Pair::Ours {
            release,
            fence,
            marked,
        } => {
            for i in range {
                let key = format!("lock:{{c{i}}}");
                let token = format!("{i:032x}");
                let mark = if *marked { "\nw" } else { "" };
                out.push(lean_set(&key, &format!("{}{mark}", lean_value(&token))));
                if let Some(fence) = fence {
                    let keys = [key.clone(), format!("{key}:fence")];
                    out.push(evalsha(fence, &keys, &[token, "86400000".into()]));
                }
                let (k, a) = release_args(i, true);
                out.push(evalsha(release, &k, &a));
            }
        }
        Pair::OursGrouped(group, n) => {
            let all: Vec<usize> = range.collect();
            for chunk in all.chunks(*n) {
                // release_args(i, true): the record's key, and its lean value second.
                let records: Vec<_> = chunk.iter().map(|&i| release_args(i, true)).collect();
                let mut call = redis::cmd("EVALSHA");
                call.arg(group).arg(chunk.len());
                for (keys, args) in &records {
                    out.push(lean_set(&keys[0], &args[1]));
                    call.arg(&keys[0]);
                }
                for (_, args) in &records {
                    call.arg(&args[1]);
                }
                out.push(call);
            }
        }
        Pair::Scripts(acquire, release) => {
            for i in range {
                let (k, a) = acquire_args(i);
                out.push(evalsha(acquire, &k, &a));
                let (k, a) = release_args(i, false);
                out.push(evalsha(release, &k, &a));
            }
        }
        Pair::Batched(acquire, release, n) => {
            let all: Vec<usize> = range.collect();
            for group in all.chunks(*n) {
                let (mut keys, mut args) = (Vec::new(), Vec::new());
                for &i in group {
                    let (k, a) = acquire_args(i);
                    keys.extend(k);
                    args.extend(a);
                }
                out.push(evalsha(acquire, &keys, &args));
                let (mut keys, mut args) = (Vec::new(), Vec::new());
                for &i in group {
                    let (k, a) = release_args(i, false);
                    keys.extend(k);
                    args.extend(a);
                }
                out.push(evalsha(release, &keys, &args));
            }
        }
        Pair::Raw(release) => {
            for i in range {
                let (key, token) = (format!("raw:{i}"), format!("{i:032x}"));
                let mut set = redis::cmd("SET");
                set.arg(&key).arg(&token).arg("NX").arg("PX").arg(30_000);
                out.push(set);
                out.push(evalsha(release, &[key], &[token]));
            }
        }
        Pair::Native => {
            for i in range {
                let key = format!("raw:{i}");
                let mut set = redis::cmd("SET");
                set.arg(&key)
                    .arg(format!("{i:032x}"))
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000);
                out.push(set);
                let mut del = redis::cmd("DEL");
                del.arg(&key);
                out.push(del);
            }
        }
    }
    out
}

/// Sends `pairs` pairs of `pair` in pipelines of about 1,000 commands on fresh keys; returns
/// the server's CPU microseconds per pair.
async fn measure(
    conn: &mut MultiplexedConnection,
    pair: &Pair,
    pairs: usize,
) -> anyhow::Result<f64> {
    let _: () = redis::cmd("FLUSHALL").query_async(conn).await?;
    let before = server_cpu(conn).await?;
    let chunk = match pair {
        Pair::Batched(_, _, n) | Pair::OursGrouped(_, n) => (500 / n).max(1) * n,
        _ => 500,
    };
    for start in (0..pairs).step_by(chunk) {
        let mut pipe = redis::pipe();
        for cmd in commands(pair, start..(start + chunk).min(pairs)) {
            pipe.add_command(cmd);
        }
        let replies: Vec<redis::Value> = pipe.query_async(conn).await?;
        if let Some(e) = replies
            .iter()
            .find(|v| matches!(v, redis::Value::ServerError(_)))
        {
            anyhow::bail!("a measured command failed: {e:?}");
        }
    }
    let after = server_cpu(conn).await?;
    Ok((after - before) * 1e6 / pairs as f64)
}

/// Keys left on the server: what each pair left behind.
async fn keys_left(conn: &mut MultiplexedConnection) -> anyhow::Result<usize> {
    Ok(redis::cmd("DBSIZE").query_async(conn).await?)
}

/// The variants, their scripts loaded.
async fn variants(conn: &mut MultiplexedConnection) -> anyhow::Result<Vec<Variant>> {
    let acquire = load(conn, ACQUIRE).await?;
    let release = load(conn, RELEASE).await?;
    let null = load(conn, "return 1").await?;
    let raw = load(
        conn,
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end",
    )
    .await?;
    let batch_acquire = load(conn, &batch_of(ACQUIRE, 3, 8)).await?;
    let batch_release = load(conn, &batch_of(RELEASE, 1, 3)).await?;
    let no_time = load(
        conn,
        &without(
            ACQUIRE,
            "local t = redis.call('TIME')",
            "local t = {'1800000000', '0'}",
        )?,
    )
    .await?;
    let get_then_set = load(
        conn,
        &without(
            ACQUIRE,
            "local last = tonumber(redis.call('SET', KEYS[2], string.format('%d', now_us), 'PX', ARGV[6], 'GET')) or 0\nlocal fence = now_us\nif last >= now_us then\n  fence = last + 1\n  redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[6])\nend",
            "local fence = (tonumber(redis.call('GET', KEYS[2])) or 0) + 1\nif fence < now_us then\n  fence = now_us\nend\nredis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[6])",
        )?,
    )
    .await?;
    let fence = load(conn, FENCE).await?;
    let group = load(conn, RELEASE_GROUP).await?;
    let plain = |release: &str, fence: Option<&str>, marked: bool| Pair::Ours {
        release: release.to_owned(),
        fence: fence.map(str::to_owned),
        marked,
    };
    let ours = |a: &str, r: &str| Pair::Scripts(a.to_owned(), r.to_owned());
    Ok(vec![
        Variant {
            label: "SET NX PX + DEL, no script",
            pair: Pair::Native,
            counters: false,
        },
        Variant {
            label: "raw: SET NX PX + compare-and-delete script",
            pair: Pair::Raw(raw),
            counters: false,
        },
        Variant {
            label: "two scripts that only return (dispatch)",
            pair: ours(&null, &null),
            counters: false,
        },
        Variant {
            label: "ours, plain request: SET NX PX + release.lua",
            pair: plain(&release, None, false),
            counters: false,
        },
        Variant {
            label: "ours, plain request, releases in groups of 8 (release_group.lua)",
            pair: Pair::OursGrouped(group.clone(), 8),
            counters: false,
        },
        Variant {
            label: "ours, plain request, releases in groups of 32 (release_group.lua)",
            pair: Pair::OursGrouped(group, 32),
            counters: false,
        },
        Variant {
            label: "ours, plain request someone waited for (the record marked; PUBLISH)",
            pair: plain(&release, None, true),
            counters: false,
        },
        Variant {
            label: "ours, plain request + its fence asked (fence.lua)",
            pair: plain(&release, Some(&fence), false),
            counters: true,
        },
        Variant {
            label: "ours, scripted path (min_hold, once, replicated): acquire.lua + release.lua",
            pair: ours(&acquire, &release),
            counters: true,
        },
        Variant {
            label: "ours, scripted path, 16 pairs per script call",
            pair: Pair::Batched(batch_acquire, batch_release, 16),
            counters: true,
        },
        Variant {
            label: "ours, scripted path, fence counter by GET then SET (before 2026-12-01)",
            pair: ours(&get_then_set, &release),
            counters: true,
        },
        Variant {
            label: "ours, scripted path without TIME (unsafe)",
            pair: ours(&no_time, &release),
            counters: true,
        },
    ])
}

/// Runs every variant `rounds` times over `pairs` pairs on a private server; prints a table
/// and returns it as JSON.
pub(crate) async fn script_costs(pairs: usize, rounds: usize) -> anyhow::Result<serde_json::Value> {
    let server = RedisServer::start();
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .context("connecting to the private redis-server")?;
    let variants = variants(&mut conn).await?;
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for round in 0..rounds {
        // Rotate the order, so no variant always runs on a warmer (or fuller) server.
        for k in 0..variants.len() {
            let v = (k + round) % variants.len();
            samples[v].push(measure(&mut conn, &variants[v].pair, pairs).await?);
            // Every record released; with the scripts, one fence counter per pair stays:
            // proof that the measured work was done, not refused.
            let expected = if variants[v].counters { pairs } else { 0 };
            let left = keys_left(&mut conn).await?;
            anyhow::ensure!(
                left == expected,
                "{}: {left} keys left after {pairs} pairs, expected {expected}",
                variants[v].label
            );
        }
    }
    let raw = crate::rows::median(samples[1].clone());
    println!(
        "Server CPU per uncontended pair, {pairs} pairs pipelined, median of {rounds} rounds
"
    );
    println!("| variant | server CPU per pair (us) | spread | vs raw |");
    println!("|---|---|---|---|");
    let mut rows = Vec::new();
    for (v, sample) in variants.iter().zip(&samples) {
        let median = crate::rows::median(sample.clone());
        let (lo, hi) = sample
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
        println!(
            "| {} | {median:.2} | {lo:.2}-{hi:.2} | {:.2}x |",
            v.label,
            median / raw
        );
        rows.push(json!({
            "variant": v.label,
            "server_cpu_us_per_pair": median,
            "rounds": sample,
        }));
    }
    Ok(json!({ "pairs": pairs, "rounds": rounds, "variants": rows }))
}

/// For `--script-costs --quick`: few pairs, one round.
pub(crate) const QUICK_PAIRS: usize = 2_000;
/// The full run.
pub(crate) const FULL_PAIRS: usize = 100_000;
/// Rounds of a full run.
pub(crate) const FULL_ROUNDS: usize = 5;
