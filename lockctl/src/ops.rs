//! Reading and deleting lock records: the record format of lock-runtime (`<ns>:{<key>}`, a
//! hash with token, owner, fence, acquired_at_ms), on one server or every master of a Cluster.

use std::time::Duration;

use anyhow::{Context, bail};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

/// One held lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockRow {
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) fence: u64,
    pub(crate) age: Option<Duration>,
    pub(crate) ttl: Option<Duration>,
}

/// The servers to read: one, or every master of a Cluster.
pub(crate) struct Store {
    masters: Vec<MultiplexedConnection>,
    cluster: Option<redis::cluster_async::ClusterConnection>,
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

async fn connect_one(url: &str) -> anyhow::Result<MultiplexedConnection> {
    let client = redis::Client::open(url).map_err(|e| anyhow::anyhow!("bad Redis URL: {e}"))?;
    tokio::time::timeout(CONNECT_TIMEOUT, client.get_multiplexed_async_connection())
        .await
        .context("no answer from Redis within 5 s")?
        .context("cannot connect to Redis")
}

impl Store {
    pub(crate) async fn connect(urls: &[String], cluster: bool) -> anyhow::Result<Self> {
        let Some(first) = urls.first() else {
            bail!("give at least one --url");
        };
        if !cluster {
            if urls.len() > 1 {
                bail!("several --url given without --cluster");
            }
            return Ok(Store {
                masters: vec![connect_one(first).await?],
                cluster: None,
            });
        }
        // SCAN walks one server's keys: connect to every master the cluster reports.
        let mut seed = connect_one(first).await?;
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut seed)
            .await
            .context("CLUSTER NODES")?;
        let info = redis::IntoConnectionInfo::into_connection_info(first.as_str())?;
        let mut masters = Vec::new();
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(addr), Some(flags)) = (fields.get(1), fields.get(2)) else {
                continue;
            };
            if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                continue;
            }
            let host_port = addr.split('@').next().unwrap_or_default();
            let Some((host, port)) = host_port.rsplit_once(':') else {
                continue;
            };
            let port: u16 = port.parse().context("a port in CLUSTER NODES")?;
            let node = info
                .clone()
                .set_addr(redis::ConnectionAddr::Tcp(host.to_owned(), port));
            let client = redis::Client::open(node)?;
            masters.push(
                tokio::time::timeout(CONNECT_TIMEOUT, client.get_multiplexed_async_connection())
                    .await
                    .context("a cluster master did not answer")??,
            );
        }
        let cluster_client = redis::cluster::ClusterClient::new(urls.to_vec())?;
        let cluster_conn = cluster_client.get_async_connection().await?;
        Ok(Store {
            masters,
            cluster: Some(cluster_conn),
        })
    }

    /// Every lock record whose key matches `pattern`.
    pub(crate) async fn list(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> anyhow::Result<Vec<LockRow>> {
        let scan_match = format!("{namespace}:{{{pattern}}}");
        let mut rows = Vec::new();
        for master in &self.masters {
            let mut conn = master.clone();
            let mut cursor: u64 = 0;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&scan_match)
                    .arg("COUNT")
                    .arg(1000)
                    .arg("TYPE")
                    .arg("hash")
                    .query_async(&mut conn)
                    .await
                    .context("SCAN")?;
                for record in keys {
                    let Some(key) = user_key(namespace, &record) else {
                        continue;
                    };
                    if let Some(row) = read(&mut conn, &record, key).await? {
                        rows.push(row);
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        rows.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(rows)
    }

    pub(crate) async fn show(&self, namespace: &str, key: &str) -> anyhow::Result<Option<LockRow>> {
        let record = format!("{namespace}:{{{key}}}");
        match &self.cluster {
            Some(cluster) => read(&mut cluster.clone(), &record, key.to_owned()).await,
            None => read(&mut self.masters[0].clone(), &record, key.to_owned()).await,
        }
    }

    /// Deletes the record and publishes the release, as the runtime's own release does.
    pub(crate) async fn force_release(&self, namespace: &str, key: &str) -> anyhow::Result<bool> {
        let record = format!("{namespace}:{{{key}}}");
        let channel = format!("{record}:released");
        let deleted: i64 = match &self.cluster {
            Some(cluster) => {
                let mut conn = cluster.clone();
                let deleted = conn.del(&record).await?;
                // Sharded pub/sub, as the runtime's waiters on a Cluster listen.
                let _: i64 = redis::cmd("SPUBLISH")
                    .arg(&channel)
                    .arg("lockctl")
                    .query_async(&mut conn)
                    .await?;
                deleted
            }
            None => {
                let mut conn = self.masters[0].clone();
                let deleted = conn.del(&record).await?;
                let _: i64 = conn.publish(&channel, "lockctl").await?;
                deleted
            }
        };
        Ok(deleted > 0)
    }
}

/// The application's key inside `<ns>:{<key>}`.
fn user_key(namespace: &str, record: &str) -> Option<String> {
    record
        .strip_prefix(namespace)?
        .strip_prefix(":{")?
        .strip_suffix('}')
        .map(str::to_owned)
}

async fn read<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    record: &str,
    key: String,
) -> anyhow::Result<Option<LockRow>> {
    let (owner, fence, acquired): (Option<String>, Option<u64>, Option<u64>) = redis::cmd("HMGET")
        .arg(record)
        .arg("owner")
        .arg("fence")
        .arg("acquired_at_ms")
        .query_async(conn)
        .await
        .with_context(|| format!("reading `{record}`"))?;
    let (Some(owner), Some(fence)) = (owner, fence) else {
        return Ok(None);
    };
    let pttl: i64 = redis::cmd("PTTL").arg(record).query_async(conn).await?;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
    let now_ms = secs * 1000 + micros / 1000;
    Ok(Some(LockRow {
        key,
        owner,
        fence,
        age: acquired.map(|a| Duration::from_millis(now_ms.saturating_sub(a))),
        ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
    }))
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_owned(), |d| format!("{:.1}s", d.as_secs_f64()))
}

/// A plain-text table.
pub(crate) fn table(rows: &[LockRow]) -> String {
    let mut cells = vec![[
        "KEY".to_owned(),
        "OWNER".into(),
        "FENCE".into(),
        "AGE".into(),
        "TTL".into(),
    ]];
    for r in rows {
        cells.push([
            r.key.clone(),
            r.owner.clone(),
            r.fence.to_string(),
            secs(r.age),
            secs(r.ttl),
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|c| {
            cells
                .iter()
                .map(|row| row[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in &cells {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// JSON rows: key, owner, fence, age_ms, ttl_ms.
pub(crate) fn to_json(rows: &[LockRow]) -> serde_json::Value {
    serde_json::Value::Array(
        rows.iter()
            .map(|r| {
                serde_json::json!({
                    "key": r.key,
                    "owner": r.owner,
                    "fence": r.fence,
                    "age_ms": r.age.map(|d| d.as_millis() as u64),
                    "ttl_ms": r.ttl.map(|d| d.as_millis() as u64),
                })
            })
            .collect(),
    )
}
