//! The one error type of the crate.

use std::fmt;
use std::time::Duration;

/// Everything that can go wrong when configuring the runtime or taking a lock.
///
/// Marked `#[non_exhaustive]`: match the variants you act on and keep a `_` arm.
///
/// No variant ever carries a password: URLs are shown with their credentials replaced by `***`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// A locked operation ran with no runtime: call `LockRuntime::install` at startup, or run
    /// the call inside `LockRuntime::scope`.
    #[error(
        "no lock runtime is configured: call LockRuntime::builder()...build().await?.install() at \
         startup, or run the call inside LockRuntime::scope"
    )]
    NotConfigured,

    /// `LockRuntime::install` was called a second time in this process.
    #[error("a lock runtime is already installed in this process; install() may be called once")]
    AlreadyConfigured,

    /// The lock is held by someone else and the caller chose not to wait.
    #[error("lock `{key}` is held by another owner")]
    Contended {
        /// The lock key as the caller gave it (without namespace).
        key: String,
    },

    /// Waiting for the lock took longer than the caller allowed.
    #[error("gave up waiting for lock `{key}` after {waited:?}")]
    WaitTimeout {
        /// The lock key as the caller gave it.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The lease ended while the caller still relied on it: it expired before a renewal
    /// succeeded, or the record now belongs to someone else.
    #[error("lost lock `{key}`: the lease expired or was taken over before the work finished")]
    Lost {
        /// The lock key as the caller gave it.
        key: String,
    },

    /// A request with `once` found the done marker of an earlier successful run: the work for
    /// this key is already done (until the marker's retention ends).
    #[error("the work for lock `{key}` is already done (a `once` marker exists)")]
    AlreadyDone {
        /// The lock key as the caller gave it.
        key: String,
    },

    /// The store failed: connection refused, timeout, authentication, a script error, a foreign
    /// value at a lock key, an out-of-memory server.
    #[error(transparent)]
    Backend(#[from] BackendError),

    /// Bad input: an empty or oversized key, a zero ttl, an unparsable URL, `min_hold > ttl`.
    #[error("invalid lock configuration: {0}")]
    Config(String),

    /// The store does not do what was asked: a store plugged in without run history, asked
    /// for a job's runs.
    #[error("not supported by this store: {0}")]
    Unsupported(String),

    /// The runtime was shut down with `LockRuntime::shutdown`; it takes no new locks.
    #[error("the lock runtime has been shut down")]
    Shutdown,
}

impl LockError {
    pub(crate) fn config(message: impl Into<String>) -> Self {
        LockError::Config(message.into())
    }

    /// True for a store failure that a retry may cure (see [`BackendError::is_transient`]).
    pub fn is_transient(&self) -> bool {
        matches!(self, LockError::Backend(e) if e.is_transient())
    }
}

/// A failure of the lock store, with credentials already removed from its text.
///
/// `Display` says what failed; [`std::error::Error::source`] gives the driver's error when it is
/// known not to contain a secret.
pub struct BackendError {
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    transient: bool,
}

impl BackendError {
    /// A store error with a message and no underlying cause: what was asked cannot succeed
    /// as asked (for a failure to reach the store, use [`transient`](Self::transient)). The
    /// message is shown to users as it is; it must not contain a secret.
    pub fn new(message: impl Into<String>) -> Self {
        BackendError {
            message: message.into(),
            source: None,
            transient: false,
        }
    }

    /// A store error that a retry may cure: no answer in time, a connection that broke.
    pub fn transient(message: impl Into<String>) -> Self {
        BackendError {
            transient: true,
            ..Self::new(message)
        }
    }

    /// True when the failure was about reaching the store (timeout, refused or broken
    /// connection) or a state the store passes through (Redis loading its data, a cluster
    /// slot moving or without a master, a node just promoted that lacks the scripts, a script
    /// running long), not about what was asked: retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        self.transient
    }

    /// Wraps a Redis driver error. every `secrets` text is scrubbed from the text, and the
    /// driver error is kept as the source only if it does not contain one.
    pub(crate) fn redis(context: &str, err: redis::RedisError, secrets: &[String]) -> Self {
        let raw = err.to_string();
        let text = scrub(&raw, secrets);
        let leaks = text != raw;
        // A server that answers READONLY stays out: after a Sentinel failover the runtime asks
        // the sentinels again by itself, and otherwise it is a replica named by mistake,
        // which waiting would not cure.
        let passing_state = matches!(
            err.code(),
            Some(
                "LOADING"
                    | "MASTERDOWN"
                    | "TRYAGAIN"
                    | "CLUSTERDOWN"
                    | "BUSY"
                    | "NOSCRIPT"
                    | "MOVED"
                    | "ASK"
            )
        );
        let transient = err.is_io_error()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || err.is_timeout()
            || passing_state;
        BackendError {
            message: format!("{context}: {text}"),
            source: if leaks { None } else { Some(Box::new(err)) },
            transient,
        }
    }

    /// The message, as `Display` prints it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// `text` with every non-empty `secrets` text replaced by `***`.
pub(crate) fn scrub(text: &str, secrets: &[String]) -> String {
    secrets
        .iter()
        .filter(|s| !s.is_empty())
        .fold(text.to_owned(), |t, s| t.replace(s.as_str(), "***"))
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The driver error is left out on purpose: Debug output ends up in logs.
        f.debug_struct("BackendError")
            .field("message", &self.message)
            .finish()
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::BackendError;

    /// The error redis-rs makes of one error reply, as the server sent it.
    fn reply(raw: &str) -> redis::RedisError {
        let value = redis::parse_redis_value(raw.as_bytes()).expect("a RESP error reply");
        value.extract_error().expect_err("an error reply")
    }

    #[test]
    fn passing_server_states_are_transient_and_mistakes_are_not() {
        for passing in [
            "-LOADING Redis is loading the dataset in memory\r\n",
            "-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\r\n",
            "-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
            "-CLUSTERDOWN The cluster is down\r\n",
            "-BUSY Redis is busy running a script.\r\n",
            // A node just promoted in a Cluster may not have the scripts yet; redis-rs loads
            // them and tries once more, and a second NOSCRIPT reaches the store.
            "-NOSCRIPT No matching script. Please use EVAL.\r\n",
            // A slot on the move, whose redirections redis-rs stopped following.
            "-MOVED 3999 127.0.0.1:6381\r\n",
            "-ASK 3999 127.0.0.1:6381\r\n",
        ] {
            let e = BackendError::redis("release", reply(passing), &[]);
            assert!(e.is_transient(), "{passing}");
        }
        for mistake in [
            "-READONLY You can't write against a read only replica.\r\n",
            "-NOPERM this user has no permissions to run the 'evalsha' command\r\n",
            "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
        ] {
            let e = BackendError::redis("release", reply(mistake), &[]);
            assert!(!e.is_transient(), "{mistake}");
        }
    }
}
