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
