//! What operators ask of the PostgreSQL store (`LockRuntime::list`, `force_release`,
//! lockctl): rare calls, so their statements are not prepared on every connection.

use super::super::listing::{key_of_record, like_pattern};
use super::super::{KeyNames, RecordView, Retention};
use super::{PostgresBackend, duration};
use crate::LockError;

impl PostgresBackend {
    /// The live records of `namespace` whose key matches `pattern`.
    pub(super) async fn list_records(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> Result<Vec<(String, RecordView)>, LockError> {
        let s = self.shared.session().await?;
        let rows = s
            .client
            .query(
                &self.shared.table.list(),
                &[&like_pattern(namespace, pattern)],
            )
            .await
            .map_err(|e| self.shared.error("listing failed", e))?;
        let mut listed = Vec::with_capacity(rows.len());
        for row in rows {
            let record: String = row.try_get(0).map_err(|e| self.decode(e))?;
            let Some(key) = key_of_record(namespace, &record) else {
                continue;
            };
            let owner: String = row.try_get(1).map_err(|e| self.decode(e))?;
            let fence: i64 = row.try_get(2).map_err(|e| self.decode(e))?;
            let left: i64 = row.try_get(3).map_err(|e| self.decode(e))?;
            let held: i64 = row.try_get(4).map_err(|e| self.decode(e))?;
            listed.push((
                key,
                RecordView::new(
                    owner,
                    u64::try_from(fence).unwrap_or(0),
                    Some(duration(left)),
                    duration(held),
                ),
            ));
        }
        Ok(listed)
    }

    /// Ends the lock's live row carrying `fence`, whatever its token, and announces the release.
    pub(super) async fn force_release_record(
        &self,
        names: &KeyNames,
        fence: u64,
    ) -> Result<bool, LockError> {
        let fence = i64::try_from(fence).unwrap_or(i64::MAX);
        let s = self.shared.session().await?;
        let rows = s
            .client
            .query(
                &self.shared.table.force_release(),
                &[&names.record(), &names.channel(), &fence],
            )
            .await
            .map_err(|e| {
                self.shared
                    .error(&format!("forced release of `{}` failed", names.key()), e)
            })?;
        Ok(!rows.is_empty())
    }

    /// Appends one run to the journal of `job`, trimmed to `keep`.
    pub(super) async fn append_run_row(
        &self,
        namespace: &str,
        job: &str,
        entry: &str,
        keep: &Retention,
    ) -> Result<(), LockError> {
        let s = self.shared.session().await?;
        let age_ms = i64::try_from(keep.max_age.as_millis()).unwrap_or(i64::MAX);
        let max_runs = i64::try_from(keep.max_runs.max(1)).unwrap_or(i64::MAX);
        s.client
            .execute(
                &self.shared.table.append_run(),
                &[&namespace, &job, &entry, &age_ms, &max_runs],
            )
            .await
            .map_err(|e| self.shared.error("appending to a run journal failed", e))?;
        Ok(())
    }

    /// The newest `limit` runs of `job`, newest first.
    pub(super) async fn run_rows(
        &self,
        namespace: &str,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, LockError> {
        let s = self.shared.session().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = s
            .client
            .query(&self.shared.table.runs(), &[&namespace, &job, &limit])
            .await
            .map_err(|e| self.shared.error("reading a run journal failed", e))?;
        rows.iter()
            .map(|row| row.try_get::<_, String>(0).map_err(|e| self.decode(e)))
            .collect()
    }

    /// The jobs of `namespace` with a journal.
    pub(super) async fn journal_jobs(&self, namespace: &str) -> Result<Vec<String>, LockError> {
        let s = self.shared.session().await?;
        let rows = s
            .client
            .query(&self.shared.table.journalled_jobs(), &[&namespace])
            .await
            .map_err(|e| self.shared.error("listing the run journals failed", e))?;
        rows.iter()
            .map(|row| row.try_get::<_, String>(0).map_err(|e| self.decode(e)))
            .collect()
    }
}
