//! This package's helper binaries (`lock_holder`, `fenced_writer`, ..) run as processes of
//! their own, for faults a test cannot cause inside its own process: SIGKILL, SIGSTOP,
//! SIGTERM.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// A helper process this test started (killed when dropped), with its stdout as lines.
#[derive(Debug)]
pub struct Helper {
    /// The process.
    pub child: Child,
    /// Its stdout, line by line.
    pub lines: Lines<BufReader<ChildStdout>>,
}

impl Helper {
    /// Starts `binary` with `args` and the environment variables `env`, its stdout piped.
    pub fn start(binary: &str, args: &[String], env: &[(&str, String)]) -> Helper {
        Self::spawn(binary, args, env, false)
    }

    /// Like [`start`](Self::start), and with a pipe to its stdin (see [`stdin`](Self::stdin)).
    pub fn start_with_stdin(binary: &str, args: &[String], env: &[(&str, String)]) -> Helper {
        Self::spawn(binary, args, env, true)
    }

    fn spawn(binary: &str, args: &[String], env: &[(&str, String)], stdin: bool) -> Helper {
        let mut command = Command::new(binary);
        command
            .args(args)
            .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        if stdin {
            command.stdin(Stdio::piped());
        }
        let mut child = command.spawn().expect("spawning a helper process");
        let stdout = child.stdout.take().expect("piped stdout");
        Helper {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// The pipe to its stdin (once; started by [`start_with_stdin`](Self::start_with_stdin)).
    pub fn stdin(&mut self) -> ChildStdin {
        self.child.stdin.take().expect("a piped stdin, taken once")
    }

    /// Its next line of output, within 10 s.
    pub async fn next_line(&mut self) -> String {
        self.next_line_within(Duration::from_secs(10))
            .await
            .expect("the helper reports within 10 s")
    }

    /// Its next line of output if one comes within `limit` (`None`: nothing came).
    pub async fn next_line_within(&mut self, limit: Duration) -> Option<String> {
        let line = tokio::time::timeout(limit, self.lines.next_line())
            .await
            .ok()?;
        Some(
            line.expect("reading the helper's stdout")
                .expect("a line from the helper, not the end of its output"),
        )
    }

    /// Sends `sig` (e.g. `-STOP`) to it.
    pub fn signal(&self, sig: &str) {
        let pid = self.child.id().expect("the helper runs").to_string();
        let status = std::process::Command::new("kill")
            .args([sig, pid.as_str()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {sig} {pid}");
    }
}
