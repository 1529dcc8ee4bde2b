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
                done_until     timestamptz
            );
            CREATE SEQUENCE IF NOT EXISTS {s};",
            t = self.name,
            s = self.sequence
        )
    }

    /// `$1` key, `$2` token, `$3` owner, `$4` ttl ms, `$5` min_hold ms, `$6` once.
    /// Answers the new fence when granted (else NULL), then the remaining ms of the record and
    /// of the done marker as this statement's snapshot saw them (NULL: none).
    ///
    /// A free row (expired, or kept only for a done marker) is taken over in place; the
    /// `WHERE` of `DO UPDATE` is evaluated on the newest row version under its row lock, so two
    /// acquirers racing for a free row cannot both win. `nextval` never hands out a value
    /// twice, also across restarts; the acquires of one lock take a transaction-level advisory
    /// lock on its key before drawing one, so they draw in the order they commit, and fences
    /// strictly increase per lock even though released rows are deleted. (Without it, an
    /// acquire that drew 10 and then waited could insert after one that drew 11 had come and
    /// gone.)
    pub(super) fn acquire(&self) -> String {
        format!(
            "WITH serial AS MATERIALIZED (
                SELECT pg_advisory_xact_lock(hashtextextended($1, {salt})) AS locked),
            now AS MATERIALIZED (SELECT clock_timestamp() AS t FROM serial),
            prior AS (SELECT r.expires_at, r.done_until FROM {t} r WHERE r.key = $1),
            won AS (
                INSERT INTO {t} AS r
                    (key, token, owner, fence, acquired_at, expires_at, min_hold_until)
                SELECT $1, $2, $3, nextval('{s}'), now.t,
                       now.t + $4::bigint * interval '1 millisecond',
                       now.t + $5::bigint * interval '1 millisecond'
                FROM now
                WHERE NOT ($6::boolean AND EXISTS (
                    SELECT 1 FROM prior WHERE prior.done_until > (SELECT t FROM now)))
                ON CONFLICT (key) DO UPDATE SET
                    token = EXCLUDED.token, owner = EXCLUDED.owner, fence = EXCLUDED.fence,
                    acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at,
                    min_hold_until = EXCLUDED.min_hold_until
                WHERE r.expires_at <= EXCLUDED.acquired_at
                  AND NOT ($6::boolean
                           AND coalesce(r.done_until > EXCLUDED.acquired_at, false))
                RETURNING r.fence
            )
            SELECT (SELECT fence FROM won),
                   (SELECT {ms} FROM prior, now WHERE prior.expires_at > now.t),
                   (SELECT {done} FROM prior, now WHERE prior.done_until > now.t)",
            t = self.name,
            s = self.sequence,
            salt = ADVISORY_SALT,
            ms = millis("prior.expires_at - now.t"),
            done = millis("prior.done_until - now.t"),
        )
    }

    /// `$1` key, `$2` token, `$3` done retention ms (NULL: no marker), `$4` channel payload.
    /// Answers `released`, `kept` (min_hold) or `not_owner`, and announces a release.
    ///
    /// Three exclusive cases on the row: ours and nothing to keep (deleted); ours with a
    /// min_hold to honour or a done marker to keep (token cleared, expiry moved to the end of
    /// min_hold or now); not ours (only the marker is written, if asked). The marker is
    /// written in the same statement as the release, so no one can take the lock between the
    /// two and run the job again.
    pub(super) fn release(&self) -> String {
        format!(
            "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t),
            freed AS (
                DELETE FROM {t} r USING now
                WHERE r.key = $1 AND r.token = $2 AND r.expires_at > now.t
                  AND r.min_hold_until <= now.t AND $3::bigint IS NULL
                  AND (r.done_until IS NULL OR r.done_until <= now.t)
                RETURNING 1
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
                RETURNING r.expires_at > now.t AS held
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
                    (SELECT count(*) FROM marked) AS m
            )
            SELECT o, CASE WHEN o = 'released' THEN pg_notify('{c}', $4) END IS NULL
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

    /// Deletes up to 1,000 rows that hold nothing any more: expired for over a second (so a
    /// holder's clock drift is long past) and without a live done marker. The conditions are
    /// checked again on the newest row version, so a row taken meanwhile is kept.
    pub(super) fn sweep(&self) -> String {
        let dead = "expires_at < clock_timestamp() - interval '1 second'
                    AND (done_until IS NULL OR done_until < clock_timestamp())";
        format!(
            "DELETE FROM {t} WHERE key IN (SELECT key FROM {t} WHERE {dead} LIMIT 1000)
             AND {dead}",
            t = self.name,
        )
    }
}

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
