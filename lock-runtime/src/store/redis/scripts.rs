//! The Lua scripts of the store (`lua/`), each run by SHA and reloaded on NOSCRIPT.

use redis::aio::ConnectionLike;

use super::conn::Conn;
use super::resp::Arg;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind};

/// The acquire script's text: `replicated_acquire` sends it with EVAL. The scripts that read a
/// record's fields start with `record.lua`, its one parser.
pub(super) const ACQUIRE_LUA: &str = concat!(
    include_str!("lua/record.lua"),
    include_str!("lua/acquire.lua")
);

/// The release script's text: its common case first, then the record parser for the rest.
pub(super) const RELEASE_LUA: &str = concat!(
    include_str!("lua/release.lua"),
    include_str!("lua/record.lua"),
    include_str!("lua/release_rest.lua")
);

pub(super) struct Scripts {
    pub(super) acquire: Script,
    pub(super) release: Script,
    pub(super) extend: Script,
    pub(super) inspect: Script,
    pub(super) raise_fence: Script,
    pub(super) force_release: Script,
    pub(super) fence: Script,
    pub(super) contended: Script,
    pub(super) release_group: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Scripts {
            acquire: Script::new(ACQUIRE_LUA),
            release: Script::new(RELEASE_LUA),
            extend: Script::new(include_str!("lua/extend.lua")),
            inspect: Script::new(concat!(
                include_str!("lua/record.lua"),
                include_str!("lua/inspect.lua")
            )),
            raise_fence: Script::new(include_str!("lua/raise_fence.lua")),
            force_release: Script::new(concat!(
                include_str!("lua/record.lua"),
                include_str!("lua/force_release.lua")
            )),
            fence: Script::new(include_str!("lua/fence.lua")),
            contended: Script::new(concat!(
                include_str!("lua/record.lua"),
                include_str!("lua/contended.lua")
            )),
            release_group: Script::new(include_str!("lua/release_group.lua")),
        }
    }

    /// Every script, for loading them all at connect.
    pub(super) fn all(&self) -> [&Script; 9] {
        [
            &self.acquire,
            &self.release,
            &self.extend,
            &self.inspect,
            &self.raise_fence,
            &self.force_release,
            &self.fence,
            &self.contended,
            &self.release_group,
        ]
    }
}

/// `EVALSHA <script> <keys>`, with room for `args` more arguments of about `bytes` bytes in
/// all: the caller adds the keys, then the arguments. One buffer for the whole call, where a
/// `ScriptInvocation` allocates one per argument and copies them again into its command.
pub(super) fn evalsha(script: &Script, keys: usize, args: usize, bytes: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(3 + keys + args, 64 + bytes);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    cmd
}

/// Sends `call` (made by [`evalsha`] for `script`); on NOSCRIPT (a server restarted or
/// flushed since the scripts were loaded) loads the script and sends it again.
pub(super) async fn run<T: FromRedisValue, C: ConnectionLike>(
    script: &Script,
    call: &Cmd,
    conn: &mut C,
) -> RedisResult<T> {
    match call.query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            call.query_async(conn).await
        }
        other => other,
    }
}

/// Sends `args` (an `EVALSHA` of `script`) on the store's connection, as [`run`] sends a
/// `Cmd`, noting in `retried` a send repeated after its connection broke.
pub(super) async fn run_args<T: FromRedisValue>(
    script: &Script,
    args: &[Arg<'_>],
    conn: &mut Conn,
    retried: &mut bool,
) -> RedisResult<T> {
    match conn.query_args(args, retried).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            conn.query_args(args, retried).await
        }
        other => other,
    }
}
