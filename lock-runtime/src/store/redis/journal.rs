//! The run journal on Redis: one stream per job, `<ns>:runs:{<job>}` (the job's name is the
//! hash tag, so in a Cluster the stream and its trimming are one slot's business), appended
//! with `XADD .. MAXLEN` (the count bound), trimmed with `XTRIM .. MINID` (the age bound) and
//! expired as a whole with `PEXPIRE` (a job that stopped running leaves nothing behind).

use redis::Value;

use super::RedisBackend;
use super::reply::value_text;
use crate::LockError;
use crate::store::Retention;

/// The stream of `job` in `namespace`.
fn stream(namespace: &str, job: &str) -> String {
    format!("{namespace}:runs:{{{job}}}")
}

/// `text` as a SCAN pattern that matches only itself.
fn glob_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '[' | ']' | '\\' | '*' | '?') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl RedisBackend {
    pub(super) async fn append_run_to_stream(
        &self,
        namespace: &str,
        job: &str,
        entry: &str,
        keep: &Retention,
    ) -> Result<(), LockError> {
        let key = stream(namespace, job);
        let age_ms = millis(keep.max_age).max(1);
        // The age bound on the client's clock: the stream's ids are the server's milliseconds,
        // and a skew of seconds against a retention of days does not matter.
        let now_ms = crate::config::unix_ms(std::time::SystemTime::now());
        let mut pipe = redis::pipe();
        pipe.cmd("XADD")
            .arg(&key)
            .arg("MAXLEN")
            .arg(keep.max_runs.max(1))
            .arg("*")
            .arg("run")
            .arg(entry)
            .ignore()
            .cmd("XTRIM")
            .arg(&key)
            .arg("MINID")
            .arg(now_ms.saturating_sub(age_ms))
            .ignore()
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(age_ms)
            .ignore();
        let mut conn = self.conn.clone();
        pipe.query_async::<()>(&mut conn)
            .await
            .map_err(|e| self.error(&format!("appending to the journal of `{job}`"), e))
    }

    pub(super) async fn runs_of_stream(
        &self,
        namespace: &str,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, LockError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.conn.clone();
        let reply: Value = redis::cmd("XREVRANGE")
            .arg(stream(namespace, job))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(limit)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.error(&format!("reading the journal of `{job}`"), e))?;
        let mut runs = Vec::new();
        let Value::Array(entries) = reply else {
            return Ok(runs);
        };
        for entry in entries {
            // [id, [field, value, ...]]
            let Value::Array(parts) = entry else { continue };
            let Some(Value::Array(fields)) = parts.get(1) else {
                continue;
            };
            for pair in fields.chunks(2) {
                if let [name, value] = pair
                    && value_text(name) == "run"
                {
                    runs.push(value_text(value));
                }
            }
        }
        Ok(runs)
    }

    pub(super) async fn jobs_with_streams(
        &self,
        namespace: &str,
    ) -> Result<Vec<String>, LockError> {
        let prefix = format!("{namespace}:runs:{{");
        let keys = self
            .scan_keys(
                &format!("{}*}}", glob_literal(&prefix)),
                "stream",
                "the run journals",
            )
            .await?;
        Ok(keys
            .iter()
            .filter_map(|k| k.strip_prefix(&prefix)?.strip_suffix('}'))
            .map(str::to_owned)
            .collect())
    }
}
