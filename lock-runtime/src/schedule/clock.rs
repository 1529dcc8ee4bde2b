//! The scheduler's wall clock: the system's, read again at every step while time runs for
//! real, and carried forward by `tokio::time` while tokio's clock is paused (a test advancing
//! a day in a moment sees a day's firings, in order, deterministically).

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// When tokio's clock has run ahead of the machine's monotonic clock by more than this since
/// the scheduler started, tokio's clock is paused and advanced by hand (a test): from then on
/// the wall clock is carried forward with tokio's instead of read.
const PAUSED: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub(crate) struct Clock {
    wall: SystemTime,
    last: Instant,
    tokio_start: Instant,
    machine_start: std::time::Instant,
    /// Carried forward by tokio's clock, never read again: a start given by the caller
    /// ([`crate::Scheduler::wall_clock_from`]), or tokio's clock found paused.
    carried: bool,
}

impl Clock {
    pub(crate) fn new(start: Option<SystemTime>) -> Self {
        let now = Instant::now();
        Clock {
            wall: start.unwrap_or_else(SystemTime::now),
            last: now,
            tokio_start: now,
            machine_start: std::time::Instant::now(),
            carried: start.is_some(),
        }
    }

    /// The wall-clock time now.
    pub(crate) fn now(&mut self) -> SystemTime {
        let now = Instant::now();
        if !self.carried {
            let by_tokio = now.saturating_duration_since(self.tokio_start);
            let by_machine = self.machine_start.elapsed();
            self.carried = by_tokio.saturating_sub(by_machine) > PAUSED;
        }
        if self.carried {
            self.wall += now.saturating_duration_since(self.last);
        } else {
            self.wall = SystemTime::now();
        }
        self.last = now;
        self.wall
    }
}
