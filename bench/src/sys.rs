//! Process figures from /proc (Linux): CPU time and peak resident memory.

use std::time::Duration;

/// User + system CPU time of this process so far.
pub(crate) fn cpu_time() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let Some(after) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime is field 14 overall, index 11 after the state field; Linux reports 100 ticks/s.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// Peak resident set size of this process, in MiB (VmHWM).
pub(crate) fn peak_rss_mib() -> f64 {
    read_status_kib("VmHWM:").map_or(0.0, |kib| kib as f64 / 1024.0)
}

/// Current resident set size, in MiB.
pub(crate) fn rss_mib() -> f64 {
    read_status_kib("VmRSS:").map_or(0.0, |kib| kib as f64 / 1024.0)
}

fn read_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// What a result was measured on and with: the commit (`-dirty` with local changes), the
/// compiler, the CPU model, the core count and the date.
pub(crate) fn provenance() -> serde_json::Value {
    let run = |cmd: &str, args: &[&str]| {
        std::process::Command::new(cmd)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_else(|| "unknown".to_owned())
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    serde_json::json!({
        "commit": run("git", &["describe", "--always", "--dirty"]),
        "rustc": run("rustc", &["--version"]),
        "cpu_model": cpu,
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "date": run("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
        "release_build": !cfg!(debug_assertions),
    })
}
