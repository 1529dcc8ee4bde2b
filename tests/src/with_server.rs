//! What the `with_postgres` and `with_etcd` programs share: run a command with one variable
//! pointing at a server started for it, then stop the server.

use std::process::{Command, ExitCode};

/// Runs the command of this process's arguments with `var` set to `value(&server)`, where
/// `server` comes from `start` and is dropped (stopped) before this returns, whatever the
/// command did. `tool` names the program in its messages.
pub fn run_with_server<S>(
    tool: &str,
    start: impl FnOnce() -> S,
    var: &str,
    value: impl FnOnce(&S) -> String,
) -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(program) = args.next() else {
        eprintln!("usage: {tool} COMMAND [ARGS...]");
        return ExitCode::from(2);
    };
    let server = start();
    let status = Command::new(&program)
        .args(args)
        .env(var, value(&server))
        .status();
    drop(server);
    let program = program.to_string_lossy();
    match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("{tool}: {program} ended with {status}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("{tool}: cannot run {program}: {e}");
            ExitCode::FAILURE
        }
    }
}
