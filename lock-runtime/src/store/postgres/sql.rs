//! The statements of the PostgreSQL store, one per operation, for one table.
//!
//! Every time comes from the database's clock (`clock_timestamp()`, read once per statement in
//! the `now` CTE, which is materialized because the function is volatile), never the
//! client's. Durations travel as whole milliseconds (`bigint`).

/// How a table's name is checked: PostgreSQL folds unquoted names to lower case, and the
/// channel and sequence names derived from it must stay within 63 bytes.
pub(super) const MAX_TABLE_NAME: usize = 40;

/// The names derived from the table's.
#[derive(Debug, Clone)]
pub(super) struct Table {
    /// The table, as written in statements.
    pub(super) name: String,
    /// The channel releases are announced on.
    pub(super) channel: String,
    /// The sequence fences come from.
    pub(super) sequence: String,
    /// The run journals of scheduled jobs.
    pub(super) runs: String,
}

impl Table {
    /// Checks `name` (lower-case letters, digits and `_`, starting with a letter or `_`, at
    /// most [`MAX_TABLE_NAME`] bytes) and derives the other names.
    pub(super) fn new(name: &str) -> Result<Self, String> {
        let first_ok = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        let rest_ok = name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !first_ok || !rest_ok || name.len() > MAX_TABLE_NAME {
            return Err(format!(
                "PostgreSQL table name `{}` is not accepted: use lower-case letters, digits and \
                 `_`, starting with a letter or `_`, at most {MAX_TABLE_NAME} bytes (put it in \
                 another schema with the connection's search_path)",
                name.escape_debug()
            ));
        }
        Ok(Table {
            name: name.to_owned(),
            channel: format!("{name}_released"),
            sequence: format!("{name}_fence"),
            runs: format!("{name}_runs"),
        })
    }

    /// The table and the sequence, created if missing. Also the documented migration.
    pub(super) fn create(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                key            text PRIMARY KEY,
                token          text,
                owner          text NOT NULL,
                fence          bigint NOT NULL,
                acquired_at    timestamptz NOT NULL,
                expires_at     timestamptz NOT NULL,
                min_hold_until timestamptz NOT NULL,
                done_until     timestamptz,
                wanted         boolean NOT NULL DEFAULT false
            );
            ALTER TABLE {t} ADD COLUMN IF NOT EXISTS wanted boolean NOT NULL DEFAULT false;
            CREATE SEQUENCE IF NOT EXISTS {s};
            {j}",
            t = self.name,
            s = self.sequence,
            j = self.create_journal()
        )
    }

    /// The run journal's table and indexes, created if missing.
    pub(super) fn create_journal(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {r} (
                id          bigserial PRIMARY KEY,
                namespace   text NOT NULL,
                job         text NOT NULL,
                appended_at timestamptz NOT NULL,
                entry       text NOT NULL
            );
            CREATE INDEX IF NOT EXISTS {r}_job ON {r} (namespace, job, id);
            CREATE INDEX IF NOT EXISTS {r}_age ON {r} (namespace, appended_at);",
            r = self.runs
        )
    }

    /// `$1` namespace, `$2` job, `$3` entry, `$4` max age ms, `$5` max runs (at least 1).
    /// Appends the run, then drops the namespace's runs older than the age and this job's
    /// beyond the count (the delete does not see the new row: it keeps `$5 - 1` of the old).
    pub(super) fn append_run(&self) -> String {
        format!(
            "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t),
             added AS (INSERT INTO {r} (namespace, job, appended_at, entry)
                       SELECT $1, $2, now.t, $3 FROM now RETURNING id)
             DELETE FROM {r} USING now
             WHERE {r}.namespace = $1
               AND ({r}.appended_at < now.t - $4::bigint * interval '1 millisecond'
                    OR ({r}.job = $2 AND {r}.id <= (
                        SELECT old.id FROM {r} old WHERE old.namespace = $1 AND old.job = $2
                        ORDER BY old.id DESC OFFSET $5::bigint - 1 LIMIT 1)))",
            r = self.runs
        )
    }

    /// `$1` namespace, `$2` job, `$3` limit: the newest runs first.
    pub(super) fn runs(&self) -> String {
        format!(
            "SELECT entry FROM {r} WHERE namespace = $1 AND job = $2 ORDER BY id DESC LIMIT $3",
            r = self.runs
        )
    }

    /// `$1` namespace: the jobs with a journal.
    pub(super) fn journalled_jobs(&self) -> String {
        format!(
            "SELECT DISTINCT job FROM {r} WHERE namespace = $1",
            r = self.runs
        )
    }

    /// `$1` key, `$2` token, `$3` owner, `$4` ttl ms, `$5` min_hold ms, `$6` once.
    /// Answers one row, the new fence, when granted; none when the lock is held (or, with
    /// `once`, done).
    ///
    /// A free row (expired, or kept only for a done marker) is taken over in place; the
    /// `WHERE` of `DO UPDATE` is evaluated on the newest row version under its row lock, so two
    /// acquirers racing for a free row cannot both win. `nextval` never hands out a value
    /// twice, also across restarts; the acquires of one lock take a transaction-level advisory
    /// lock on its key before drawing one (the subquery runs first: its volatile calls keep
    /// it from being merged into the outer query), so they draw in the order they commit, and
    /// fences strictly increase per lock even though released rows are deleted. (Without it,
    /// an acquire that drew 10 and then waited could insert after one that drew 11 had come
    /// and gone.) A done marker lives on a row, so `once` is checked on the conflict alone.
    ///
    /// This is the statement every lock pays for, so it is one plain `INSERT`: each node and
    /// expression of a plan costs server time on every execution (measured: a statement
    /// built of CTEs cost four times this one).
    pub(super) fn acquire(&self) -> String {
        format!(
            "INSERT INTO {t} AS r
                (key, token, owner, fence, acquired_at, expires_at, min_hold_until)
            SELECT $1, $2, $3, nextval('{s}'), n.t,
                   n.t + $4::bigint * interval '1 millisecond',
                   n.t + $5::bigint * interval '1 millisecond'
            FROM (SELECT pg_advisory_xact_lock(hashtextextended($1, {salt})),
                         clock_timestamp() AS t OFFSET 0) n
            ON CONFLICT (key) DO UPDATE SET
                token = EXCLUDED.token, owner = EXCLUDED.owner, fence = EXCLUDED.fence,
                acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at,
                min_hold_until = EXCLUDED.min_hold_until
            WHERE r.expires_at <= EXCLUDED.acquired_at
              AND NOT ($6::boolean AND coalesce(r.done_until > EXCLUDED.acquired_at, false))
            RETURNING r.fence",
            t = self.name,
            s = self.sequence,
            salt = ADVISORY_SALT,
        )
    }

    /// `$1` key. After a refused acquire: sets `wanted`, so the holder's release announces
    /// itself, and answers the remaining ms of the record and of its done marker (zero or
    /// less: none), read under the row lock. No row: the lock was released meanwhile.
    ///
    /// The flag is on the row whose holder refused us, or on a later holder's (a release in
    /// between deleted ours, or a new acquire took the row over): either way the next
    /// release of this lock announces itself, or no row is found and the caller asks again
    /// at once. The flag lives as long as the row: a takeover in place (after an expiry, a
    /// min_hold, a done marker) keeps it, because the waiters that set it may be asleep
    /// until the old holder's expiry and only an announcement wakes them sooner (at worst
    /// one announcement nobody needed). A row deleted by a release goes with its flag, and
    /// waiters that lose the race after that wake-up set it again on the winner's new row.
    pub(super) fn mark(&self) -> String {
        format!(
            "UPDATE {t} r SET wanted = true WHERE r.key = $1
            RETURNING {left}, {done}",
            t = self.name,
            left = millis("r.expires_at - clock_timestamp()"),
            done = millis("r.done_until - clock_timestamp()"),
        )
    }

    /// `$1` key, `$2` token, `$3` channel payload. The release of a lock with nothing to
    /// keep (no min_hold left, no done marker): deletes the row if it is ours and live,
    /// announcing it when wanted. One row when released; none otherwise, and then
    /// [`Table::release`] decides.
    pub(super) fn release_plain(&self) -> String {
        format!(
            "DELETE FROM {t} r
            WHERE r.key = $1 AND r.token = $2 AND r.expires_at > clock_timestamp()
              AND r.min_hold_until <= clock_timestamp()
              AND (r.done_until IS NULL OR r.done_until <= clock_timestamp())
            RETURNING CASE WHEN r.wanted THEN pg_notify('{c}', $3) END IS NULL",
            t = self.name,
            c = self.channel,
        )
    }

    /// `$1` key, `$2` token, `$3` done retention ms (NULL: no marker), `$4` channel payload.
    /// Answers `released`, `kept` (min_hold) or `not_owner`, and announces a release.
    ///
    /// Three exclusive cases on the row: ours and nothing to keep (deleted); ours with a
    /// min_hold to honour or a done marker to keep (token cleared, expiry moved to the end of
    /// min_hold or now); not ours (only the marker is written, if asked). The marker is
    /// written in the same statement as the release, so no one can take the lock between the
    /// two and run the job again. A release, kept for min_hold or not, is announced (kept:
    /// waiters told the holder's whole ttl ask again and learn that it frees when min_hold
    /// ends), but only when an acquire found the row held (`wanted`): a `NOTIFY` serializes every committing transaction of the database
    /// that sends one, and wakes the listening connection of every runtime.
    pub(super) fn release(&self) -> String {
        format!(
            "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t),
            freed AS (
                DELETE FROM {t} r USING now
                WHERE r.key = $1 AND r.token = $2 AND r.expires_at > now.t
                  AND r.min_hold_until <= now.t AND $3::bigint IS NULL
                  AND (r.done_until IS NULL OR r.done_until <= now.t)
                RETURNING r.wanted
            ),
            kept AS (
                UPDATE {t} r SET
                    token = NULL,
                    expires_at = greatest(r.min_hold_until, now.t),
                    done_until = CASE WHEN $3::bigint IS NULL THEN r.done_until
                        ELSE greatest(r.done_until, now.t + $3::bigint * interval '1 millisecond')
                        END
                FROM now
                WHERE r.key = $1 AND r.token = $2 AND r.expires_at > now.t
                  AND NOT (r.min_hold_until <= now.t AND $3::bigint IS NULL
                           AND (r.done_until IS NULL OR r.done_until <= now.t))
                RETURNING r.expires_at > now.t AS held, r.wanted
            ),
            marked AS (
                INSERT INTO {t} AS r
                    (key, token, owner, fence, acquired_at, expires_at, min_hold_until,
                     done_until)
                SELECT $1, NULL, '', 0, now.t, now.t, now.t,
                       now.t + $3::bigint * interval '1 millisecond'
                FROM now
                WHERE $3::bigint IS NOT NULL
                  AND NOT EXISTS (SELECT 1 FROM freed) AND NOT EXISTS (SELECT 1 FROM kept)
                ON CONFLICT (key) DO UPDATE
                    SET done_until = greatest(r.done_until, EXCLUDED.done_until)
                RETURNING 1
            ),
            outcome AS (
                SELECT CASE
                    WHEN EXISTS (SELECT 1 FROM freed) THEN 'released'
                    WHEN EXISTS (SELECT 1 FROM kept WHERE held) THEN 'kept'
                    WHEN EXISTS (SELECT 1 FROM kept) THEN 'released'
                    ELSE 'not_owner' END AS o,
                    (SELECT count(*) FROM marked) AS m,
                    coalesce((SELECT wanted FROM freed), (SELECT wanted FROM kept), false)
                        AS wanted
            )
            SELECT o, CASE WHEN o IN ('released', 'kept') AND wanted
                           THEN pg_notify('{c}', $4) END IS NULL
            FROM outcome",
            t = self.name,
            c = self.channel,
        )
    }

    /// `$1` key, `$2` token: does the live row carry it? (A release that found nothing of its
    /// own asks, on a fresh snapshot, whether a concurrent change hid its row from it.)
    pub(super) fn owns(&self) -> String {
        format!(
            "SELECT EXISTS (SELECT 1 FROM {t}
                WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp())",
            t = self.name,
        )
    }

    /// `$1` keys, `$2` tokens, `$3` ttls ms (one per lease). Answers the key and token of
    /// every lease renewed; a row whose token differs, or that has expired, is left alone.
    pub(super) fn extend(&self) -> String {
        format!(
            "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t)
            UPDATE {t} r
            SET expires_at = greatest(r.expires_at, now.t + i.ttl * interval '1 millisecond')
            FROM now, unnest($1::text[], $2::text[], $3::bigint[]) AS i(key, token, ttl)
            WHERE r.key = i.key AND r.token = i.token AND r.expires_at > now.t
            RETURNING r.key, r.token",
            t = self.name,
        )
    }

    /// `$1` key. The live record: owner, fence, remaining ms, held for ms.
    pub(super) fn inspect(&self) -> String {
        format!(
            "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t)
            SELECT r.owner, r.fence, {left}, {held}
            FROM {t} r, now WHERE r.key = $1 AND r.expires_at > now.t",
            t = self.name,
            left = millis("r.expires_at - now.t"),
            held = millis("now.t - r.acquired_at"),
        )
    }

    /// `$1` a `LIKE` pattern of record names (`!` escapes: unlike a backslash, it means the
    /// same whatever `standard_conforming_strings` says). Every live record it matches:
    /// key, owner, fence, remaining ms, held for ms. For operators: a scan is fine.
    pub(super) fn list(&self) -> String {
        format!(
            "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t)
            SELECT r.key, r.owner, r.fence, {left}, {held}
            FROM {t} r, now WHERE r.key LIKE $1 ESCAPE '!' AND r.expires_at > now.t",
            t = self.name,
            left = millis("r.expires_at - now.t"),
            held = millis("now.t - r.acquired_at"),
        )
    }

    /// `$1` key, `$2` channel payload, `$3` fence. An operator's forced release: the live row
    /// carrying that fence, whatever its token, ends now and the release is announced. The row stays for its done marker (the
    /// sweep deletes it later), and an acquire takes it over in place as any expired row.
    pub(super) fn force_release(&self) -> String {
        format!(
            "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t)
            UPDATE {t} r SET token = NULL, expires_at = now.t, min_hold_until = now.t
            FROM now WHERE r.key = $1 AND r.fence = $3 AND r.expires_at > now.t
            RETURNING pg_notify('{c}', $2) IS NULL",
            t = self.name,
            c = self.channel,
        )
    }

    /// `$1` the last key an earlier batch of this sweep reached (`''` at first). Deletes up to
    /// [`SWEEP_BATCH`] rows past it, in key order, that hold nothing any more: expired for
    /// over a second (so a holder's clock drift is long past) and without a live done marker;
    /// answers their keys. Key order lets the next batch start where this one ended rather
    /// than scan the deleted rows again. Rows another session has locked (a sweeper of another
    /// runtime, an acquire taking one over) are skipped rather than waited for, so runtimes
    /// sweeping at once delete different rows. The conditions are checked again on the newest
    /// row version, so a row taken meanwhile is kept.
    pub(super) fn sweep(&self) -> String {
        let dead = "expires_at < clock_timestamp() - interval '1 second'
                    AND (done_until IS NULL OR done_until < clock_timestamp())";
        format!(
            "DELETE FROM {t} WHERE key IN (
                SELECT key FROM {t} WHERE key > $1 AND {dead}
                ORDER BY key LIMIT {SWEEP_BATCH} FOR UPDATE SKIP LOCKED)
             AND {dead}
             RETURNING key",
            t = self.name,
        )
    }
}

/// Rows one sweep statement deletes at most; a sweep repeats it while it deletes that many.
pub(super) const SWEEP_BATCH: usize = 1000;

/// Seeds the hash of a key for its advisory lock, so the lock store's advisory locks are
/// unlikely to meet an application's own (which typically use small integers).
const ADVISORY_SALT: i64 = 0x6c6f_636b_7374;

/// An interval expression as whole milliseconds, rounded up (a remaining time is never
/// reported shorter than it is).
fn millis(interval: &str) -> String {
    format!("ceil(extract(epoch FROM ({interval})) * 1000)::bigint")
}

#[cfg(test)]
mod tests {
    use super::Table;

    #[test]
    fn table_names_are_checked() {
        assert!(Table::new("lock_records").is_ok());
        assert!(Table::new("_x9").is_ok());
        for bad in [
            "",
            "Locks",
            "9locks",
            "locks; DROP TABLE users",
            "schema.locks",
            "a-b",
        ] {
            assert!(Table::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(Table::new(&"a".repeat(41)).is_err());
        assert!(Table::new(&"a".repeat(40)).is_ok());
    }
}
