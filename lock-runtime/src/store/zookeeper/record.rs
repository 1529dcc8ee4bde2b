//! What the ZooKeeper store writes: node names and the values of lock records and done markers.
//!
//! Every time in a value is the server's: a node's `mtime` and `ctime` (the leader's wall
//! clock at the write, milliseconds since the epoch) and durations counted from them.

/// The first word of every value this store writes.
const VERSION: &str = "v1";
/// The token of a record kept for min_hold after its release: no token (32 hex digits)
/// matches it.
pub(super) const RELEASED: &str = "released";

/// A lock record's value:
/// `v1 <token> <ttl_ms> <floor_ms> <hold_ms> <since_ms> <fence> <done_until_ms> <owner>`.
///
/// The record expires at `max(mtime + ttl_ms, floor_ms)`: a renewal writes the ttl it asks for
/// and, as the floor, the expiry the record had before (so a renewal never shortens a lease,
/// and all of it is on the server's clock). `since_ms` and `fence` are the `mtime` and `mzxid`
/// of the write that acquired the lock: unknown (`-`) to that write itself, so the node's own
/// stat stands for them until the first renewal writes them down (until then, the acquiring
/// write is the node's last). `hold_ms` is the request's min_hold, counted from `since_ms`.
/// `done_until_ms` (server time, 0 for none) repeats the lock's `once` marker, written by the
/// same transaction; every write of the node carries it on (see [`Value`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    pub(super) token: String,
    pub(super) ttl_ms: i64,
    pub(super) floor_ms: i64,
    pub(super) hold_ms: i64,
    pub(super) since_ms: Option<i64>,
    pub(super) fence: Option<i64>,
    pub(super) done_until_ms: i64,
    pub(super) owner: String,
}

/// A record node's value: a holder's record, or free (`v1 free <done_until_ms>`).
///
/// The node stays when the lock is free (the server removes it once it has gone unwritten for
/// long, see `RECORD_NODE_TTL`): ZooKeeper numbers a node's versions from 0 again when it is
/// made again, so a write "at the version read" is sure to meet the record it read only on a
/// node that is never deleted. It also carries the `once` marker's end: the marker's own node
/// may be removed by the server's sweep of expired nodes just as a release writes it anew
/// (the sweep deletes what it listed without looking again), and this copy is written in the
/// same transaction on a node that has just been written, which no sweep removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Value {
    Free { done_until_ms: i64 },
    Held(Record),
}

impl Record {
    pub(super) fn encode(&self) -> Vec<u8> {
        let known = |v: Option<i64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        format!(
            "{VERSION} {} {} {} {} {} {} {} {}",
            self.token,
            self.ttl_ms,
            self.floor_ms,
            self.hold_ms,
            known(self.since_ms),
            known(self.fence),
            self.done_until_ms,
            self.owner
        )
        .into_bytes()
    }

    /// When the record expires, on the server's clock (ms since the epoch); `mtime` is the
    /// node's.
    pub(super) fn expiry(&self, mtime: i64) -> i64 {
        mtime.saturating_add(self.ttl_ms).max(self.floor_ms)
    }

    /// When the holding began (server time); `mtime` is the node's.
    pub(super) fn since(&self, mtime: i64) -> i64 {
        self.since_ms.unwrap_or(mtime)
    }

    /// The holder's fence; `mzxid` is the node's.
    pub(super) fn fence(&self, mzxid: i64) -> i64 {
        self.fence.unwrap_or(mzxid)
    }

    /// Until when min_hold keeps the record, on the server's clock; `mtime` is the node's.
    pub(super) fn hold_until(&self, mtime: i64) -> i64 {
        self.since(mtime).saturating_add(self.hold_ms)
    }
}

impl Value {
    pub(super) fn free(done_until_ms: i64) -> Vec<u8> {
        format!("{VERSION} free {done_until_ms}").into_bytes()
    }

    /// Until when the lock's work is done (server time; 0: no marker).
    pub(super) fn done_until(&self) -> i64 {
        match self {
            Value::Free { done_until_ms } => *done_until_ms,
            Value::Held(record) => record.done_until_ms,
        }
    }

    /// None for a value this store did not write.
    pub(super) fn decode(value: &[u8]) -> Option<Value> {
        let value = std::str::from_utf8(value).ok()?;
        if let Some(done) = value.strip_prefix("v1 free ") {
            return Some(Value::Free {
                done_until_ms: done.parse().ok()?,
            });
        }
        let mut parts = value.splitn(9, ' ');
        if parts.next()? != VERSION {
            return None;
        }
        let known = |s: &str| -> Option<Option<i64>> {
            if s == "-" {
                Some(None)
            } else {
                s.parse().ok().map(Some)
            }
        };
        let token = parts.next()?;
        let ttl_ms = parts.next()?.parse().ok()?;
        let floor_ms = parts.next()?.parse().ok()?;
        let hold_ms = parts.next()?.parse().ok()?;
        let since_ms = known(parts.next()?)?;
        let fence = known(parts.next()?)?;
        let done_until_ms = parts.next()?.parse().ok()?;
        let owner = parts.next()?;
        (!token.is_empty()).then(|| {
            Value::Held(Record {
                token: token.to_owned(),
                ttl_ms,
                floor_ms,
                hold_ms,
                since_ms,
                fence,
                done_until_ms,
                owner: owner.to_owned(),
            })
        })
    }
}

/// A done marker's value: `v1 <retention_ms>`; it ends at `mtime + retention_ms`.
pub(super) fn done_value(retention_ms: i64) -> Vec<u8> {
    format!("{VERSION} {retention_ms}").into_bytes()
}

/// When a done marker ends, on the server's clock (`mtime` is the node's); None for a value
/// this store did not write.
pub(super) fn done_expiry(value: &[u8], mtime: i64) -> Option<i64> {
    let value = std::str::from_utf8(value).ok()?;
    let retention: i64 = value.strip_prefix("v1 ")?.parse().ok()?;
    Some(mtime.saturating_add(retention))
}

/// A node name for a record name (`<ns>:{<key>}`): every byte but ASCII letters, digits and
/// `-_:{}` written as `%XX`, so no name holds a `/`, is `.` or `..`, or is empty.
pub(super) fn node_name(record: &str) -> String {
    let mut name = String::with_capacity(record.len() + 8);
    for byte in record.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_:{}".contains(&byte) {
            name.push(char::from(byte));
        } else {
            name.push('%');
            name.push_str(&format!("{byte:02X}"));
        }
    }
    if name.is_empty() {
        name.push('%');
    }
    name
}

/// The record name a node name stands for; None for a name `node_name` does not make.
pub(super) fn record_of_node(name: &str) -> Option<String> {
    if name == "%" {
        return Some(String::new());
    }
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_give_back_their_record_and_hold_no_slash_or_dots() {
        for record in [
            "lock:{job}",
            "lock:{a/b}",
            "a:b:{{x}:y}",
            ":{ünï code}",
            "lock:{.}",
            "lock:{..}",
            "lock:{%41}",
            "",
        ] {
            let name = node_name(record);
            assert!(!name.contains('/') && !name.contains('.') && !name.is_empty());
            assert_eq!(record_of_node(&name).as_deref(), Some(record), "{name}");
        }
        assert_eq!(
            node_name("lock:{interest-posting}"),
            "lock:{interest-posting}"
        );
        for foreign in ["%4", "%zz", "%FF"] {
            assert_eq!(record_of_node(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn records_read_back_and_expire_by_the_server_clock() {
        let record = Record {
            token: "ab12".into(),
            ttl_ms: 1_000,
            floor_ms: 0,
            hold_ms: 300,
            since_ms: None,
            fence: None,
            done_until_ms: 0,
            owner: "host:1 worker a".into(),
        };
        assert_eq!(
            Value::decode(&record.encode()),
            Some(Value::Held(record.clone()))
        );
        assert_eq!(
            Value::decode(&Value::free(99)),
            Some(Value::Free { done_until_ms: 99 })
        );
        let (mtime, mzxid) = (12_000, 77);
        assert_eq!(record.expiry(mtime), 13_000);
        assert_eq!(
            record.hold_until(mtime),
            12_300,
            "the acquiring write's mtime"
        );
        assert_eq!(record.fence(mzxid), 77, "the acquiring write's zxid");
        let renewed = Record {
            floor_ms: 20_000,
            since_ms: Some(10_000),
            fence: Some(42),
            done_until_ms: 30_000,
            ..record
        };
        assert_eq!(
            Value::decode(&renewed.encode()),
            Some(Value::Held(renewed.clone()))
        );
        assert_eq!(renewed.expiry(mtime), 20_000, "a renewal never shortens");
        assert_eq!(renewed.hold_until(mtime), 10_300);
        assert_eq!(renewed.fence(mzxid), 42);
        assert_eq!(
            Value::decode(&renewed.encode()).map(|v| v.done_until()),
            Some(30_000)
        );
        for foreign in [
            &b"v2 t 1 0 0 - - 0 me"[..],
            b"v1  1 0 0 - - 0 me",
            b"v1 t x 0 0 - - 0 me",
            b"v1 t 1 0 0 x - 0 me",
            b"v1 t 1 0 0 - - x me",
            b"v1 t 1 0 0 - - 0",
            b"v1 free",
            b"v1 free x",
            b"\xff",
        ] {
            assert_eq!(Value::decode(foreign), None, "{foreign:?}");
        }
        assert_eq!(done_expiry(&done_value(500), mtime), Some(12_500));
        assert_eq!(done_expiry(b"nothing of ours", mtime), None);
    }
}
