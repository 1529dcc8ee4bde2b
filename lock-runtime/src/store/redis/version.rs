//! What the servers can do, found out once when a store connects: the version (a server too
//! old for the runtime is refused), and whether a Cluster's waiters can use sharded pub/sub.

use redis::Value;

/// The oldest Redis the stores accept. The runtime needs RESP3 pushes (6.0) for its
/// subscriber; 6.2 is the oldest release it is tested on (the server matrix of the test
/// suite), so anything older is refused at `build()` rather than failing in some later call.
pub(crate) const MINIMUM: (u32, u32) = (6, 2);

/// A server version as `major.minor.patch`.
pub(crate) type Version = (u32, u32, u32);

/// The lowest `redis_version` in an `INFO server` reply. Through a Cluster connection INFO
/// goes to every primary, which answer in a map of node to text; during a rolling upgrade
/// they differ, and the oldest decides what every node can be asked. (Replicas are not asked:
/// a replica older than its primary, promoted later, is not seen.) Valkey reports the Redis
/// version it is compatible with there (7.2.4 for Valkey 7 and 8). `None` when no version
/// can be read.
pub(crate) fn lowest(reply: &Value) -> Option<Version> {
    let mut texts = Vec::new();
    collect_texts(reply, &mut texts);
    texts.iter().filter_map(|text| parse(text)).min()
}

/// Whether the servers take SPUBLISH (Redis 7.0 and newer, Valkey): one SPUBLISH to a channel
/// nobody listens on, inside the runtime's namespace (the documented ACL rule lets every lock
/// user publish there). An unknown command (6.2) means classic pub/sub, which every version
/// has: on a Cluster it is broadcast to every node, slower but never wrong. Asked rather than
/// read from INFO, which least-privilege users often may not run (`@dangerous`): runtimes
/// whose users differ there must still choose alike, since a sharded release never reaches a
/// classic subscriber. For the same reason a refusal by the user's rights (`NOPERM`) is an
/// error, not "no": a user with narrower rights would otherwise settle on classic pub/sub
/// while the others use sharded. A connection that fails meanwhile is an error too.
pub(crate) async fn answers_spublish<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    namespace: &str,
) -> redis::RedisResult<bool> {
    match redis::cmd("SPUBLISH")
        .arg(format!("{namespace}:lock-runtime-probe"))
        .arg("")
        .query_async::<i64>(conn)
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if e.code() == Some("NOPERM") => Err(e),
        Err(e) if e.code().is_some() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether the server takes `DELIFEQ key value` (Valkey 9.0 and newer: delete only while the
/// value is exactly this) from this user: one on a key of the runtime's namespace that does
/// not exist. Unlike sharded pub/sub, runtimes may differ here (both ways of releasing are
/// atomic and agree), so anything the server refuses, an unknown command or the user's
/// rights, is "no"; a connection that fails meanwhile is an error.
pub(crate) async fn answers_delifeq<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    namespace: &str,
) -> redis::RedisResult<bool> {
    match redis::cmd("DELIFEQ")
        .arg(format!("{namespace}:lock-runtime-probe"))
        .arg("")
        .query_async::<i64>(conn)
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if e.code().is_some() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether `version` is too old for the runtime.
pub(crate) fn too_old(version: Option<Version>) -> bool {
    version.is_some_and(|(major, minor, _)| (major, minor) < MINIMUM)
}

fn collect_texts(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::BulkString(bytes) => out.push(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => out.push(text.clone()),
        Value::VerbatimString { text, .. } => out.push(text.clone()),
        Value::Array(items) | Value::Set(items) => {
            for item in items {
                collect_texts(item, out);
            }
        }
        Value::Map(pairs) => {
            for (_, item) in pairs {
                collect_texts(item, out);
            }
        }
        _ => {}
    }
}

fn parse(info: &str) -> Option<Version> {
    let line = info
        .lines()
        .find_map(|line| line.trim().strip_prefix("redis_version:"))?;
    let mut parts = line.split('.').map(|p| p.trim().parse::<u32>().ok());
    let major = parts.next()??;
    let minor = parts.next().flatten().unwrap_or(0);
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn reads_the_version_of_one_server() {
        let info = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(lowest(&bulk(info)), Some((7, 0, 15)));
    }

    #[test]
    fn valkey_reports_its_compatible_redis_version() {
        let info =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.8\r\n";
        assert_eq!(lowest(&bulk(info)), Some((7, 2, 4)));
    }

    #[test]
    fn a_cluster_answers_with_its_oldest_node() {
        let reply = Value::Map(vec![
            (bulk("127.0.0.1:7000"), bulk("redis_version:7.0.15\r\n")),
            (bulk("127.0.0.1:7001"), bulk("redis_version:6.2.14\r\n")),
            (bulk("127.0.0.1:7002"), bulk("redis_version:7.2.4\r\n")),
        ]);
        let version = lowest(&reply);
        assert_eq!(version, Some((6, 2, 14)));
        assert!(!too_old(version));
    }

    #[test]
    fn gates_follow_the_versions() {
        assert!(too_old(Some((6, 0, 20))));
        assert!(too_old(Some((5, 0, 7))));
        assert!(!too_old(Some((6, 2, 0))));
        assert!(!too_old(None));
    }

    #[test]
    fn no_version_in_the_reply_is_unknown() {
        assert_eq!(lowest(&bulk("# Server\r\nuptime_in_seconds:3\r\n")), None);
        assert_eq!(lowest(&Value::Nil), None);
        assert_eq!(lowest(&bulk("redis_version:x.y\r\n")), None);
    }
}
