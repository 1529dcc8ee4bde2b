//! When a job fires: a cron expression read in a time zone (croner computes the firings,
//! chrono-tz knows the zones), or a fixed rate whose firings are the multiples of the period
//! since the Unix epoch, so that every instance names the same ones.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;

/// A job's schedule, checked.
#[derive(Clone)]
pub(crate) enum Schedule {
    /// A cron expression (five fields, or six with seconds first) in a time zone.
    Cron {
        cron: Box<Cron>,
        tz: Tz,
        text: String,
    },
    /// A fixed rate, aligned to the Unix epoch.
    Every(Duration),
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Cron { tz, text, .. } => write!(f, "cron \"{text}\" in {}", tz.name()),
            Schedule::Every(period) => write!(f, "every {period:?}"),
        }
    }
}

impl Schedule {
    /// A cron schedule; the error says what is wrong with the expression or the zone.
    pub(crate) fn cron(expr: &str, tz: &str) -> Result<Self, String> {
        let tz = parse_tz(tz)?;
        let cron = parse_cron(expr)?;
        Ok(Schedule::Cron {
            cron: Box::new(cron),
            tz,
            text: expr.to_owned(),
        })
    }

    /// A fixed-rate schedule of at least a millisecond.
    pub(crate) fn every(period: Duration) -> Result<Self, String> {
        if period.as_millis() == 0 {
            return Err("`every` must be at least 1 ms".to_owned());
        }
        Ok(Schedule::Every(period))
    }

    /// The first firing strictly after `t`.
    pub(crate) fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        match self {
            Schedule::Cron { cron, tz, .. } => {
                let start = DateTime::<Utc>::from(t).with_timezone(tz);
                let next = cron.find_next_occurrence(&start, false).ok()?;
                let next = SystemTime::from(next.with_timezone(&Utc));
                // croner counts from the start's whole second; a firing is never at or
                // before the instant asked about.
                if next > t {
                    Some(next)
                } else {
                    self.next_after(t + Duration::from_millis(1))
                }
            }
            Schedule::Every(period) => {
                let p = period.as_millis();
                let now = millis(t)?;
                let next = (now / p + 1).checked_mul(p)?;
                Some(UNIX_EPOCH + Duration::from_millis(u64::try_from(next).ok()?))
            }
        }
    }

    /// The last firing at or before `t`.
    pub(crate) fn last_at_or_before(&self, t: SystemTime) -> Option<SystemTime> {
        match self {
            Schedule::Cron { cron, tz, .. } => {
                let start = DateTime::<Utc>::from(t).with_timezone(tz);
                let last = cron.find_previous_occurrence(&start, true).ok()?;
                let last = SystemTime::from(last.with_timezone(&Utc));
                (last <= t).then_some(last)
            }
            Schedule::Every(period) => {
                let p = period.as_millis();
                let last = millis(t)? / p * p;
                Some(UNIX_EPOCH + Duration::from_millis(u64::try_from(last).ok()?))
            }
        }
    }
}

/// Milliseconds since the Unix epoch (`None` before it).
fn millis(t: SystemTime) -> Option<u128> {
    t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_millis())
}

/// An IANA zone name, e.g. `Europe/Berlin` or `UTC`.
pub(crate) fn parse_tz(name: &str) -> Result<Tz, String> {
    Tz::from_str(name).map_err(|_| {
        format!(
            "unknown time zone `{name}`: give an IANA name such as \"Europe/Berlin\" or \"UTC\""
        )
    })
}

/// A cron expression of five fields (minute first) or six (second first).
pub(crate) fn parse_cron(expr: &str) -> Result<Cron, String> {
    Cron::from_str(expr).map_err(|e| format!("bad cron expression `{expr}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> SystemTime {
        SystemTime::from(
            DateTime::parse_from_rfc3339(text)
                .expect("an RFC 3339 instant")
                .with_timezone(&Utc),
        )
    }

    fn show(t: SystemTime) -> String {
        DateTime::<Utc>::from(t).to_rfc3339()
    }

    #[test]
    fn a_daily_cron_fires_at_its_wall_clock_time_in_its_zone() {
        let s = Schedule::cron("0 0 2 * * *", "Europe/Berlin").expect("valid");
        // 2 AM in Berlin in December is 01:00 UTC (CET, +1).
        let next = s.next_after(utc("2026-12-01T12:00:00Z")).expect("a firing");
        assert_eq!(show(next), "2026-12-02T01:00:00+00:00");
        // Exactly at a firing: the next one, a day later.
        let after = s.next_after(next).expect("a firing");
        assert_eq!(show(after), "2026-12-03T01:00:00+00:00");
        assert_eq!(s.last_at_or_before(next), Some(next));
        assert_eq!(
            s.last_at_or_before(next - Duration::from_millis(1))
                .map(show),
            Some("2026-12-01T01:00:00+00:00".to_owned())
        );
    }

    #[test]
    fn five_fields_mean_minute_first() {
        let s = Schedule::cron("30 2 * * *", "UTC").expect("valid");
        let next = s.next_after(utc("2026-12-01T00:00:00Z")).expect("a firing");
        assert_eq!(show(next), "2026-12-01T02:30:00+00:00");
    }

    /// Spring forward in Berlin, 2027-03-28: 02:00 CET jumps to 03:00 CEST, so 02:30 does not
    /// exist that day. The firing comes at the first instant after the gap, 03:00 CEST (01:00
    /// UTC), once; the next day it is at 02:30 CEST again.
    #[test]
    fn a_firing_in_the_skipped_hour_comes_right_after_the_gap() {
        let s = Schedule::cron("0 30 2 * * *", "Europe/Berlin").expect("valid");
        let on_the_day = s.next_after(utc("2027-03-27T12:00:00Z")).expect("a firing");
        assert_eq!(show(on_the_day), "2027-03-28T01:00:00+00:00");
        let next_day = s.next_after(on_the_day).expect("a firing");
        assert_eq!(show(next_day), "2027-03-29T00:30:00+00:00");
    }

    /// Fall back in Berlin, 2026-10-25: 03:00 CEST goes back to 02:00 CET, so 02:30 happens
    /// twice. A fixed-time job fires once, at the first 02:30 (CEST, 00:30 UTC).
    #[test]
    fn a_firing_in_the_repeated_hour_comes_once() {
        let s = Schedule::cron("0 30 2 * * *", "Europe/Berlin").expect("valid");
        let first = s.next_after(utc("2026-10-24T12:00:00Z")).expect("a firing");
        assert_eq!(show(first), "2026-10-25T00:30:00+00:00");
        let next = s.next_after(first).expect("a firing");
        assert_eq!(show(next), "2026-10-26T01:30:00+00:00");
    }

    #[test]
    fn every_is_aligned_to_the_epoch() {
        let s = Schedule::every(Duration::from_secs(300)).expect("valid");
        let t = utc("2026-12-01T12:03:10.500Z");
        assert_eq!(
            s.next_after(t).map(show),
            Some("2026-12-01T12:05:00+00:00".to_owned())
        );
        assert_eq!(
            s.last_at_or_before(t).map(show),
            Some("2026-12-01T12:00:00+00:00".to_owned())
        );
        let on = utc("2026-12-01T12:05:00Z");
        assert_eq!(
            s.next_after(on).map(show),
            Some("2026-12-01T12:10:00+00:00".to_owned())
        );
        assert_eq!(s.last_at_or_before(on), Some(on));
    }

    #[test]
    fn bad_input_is_refused_with_a_reason() {
        let tz = Schedule::cron("0 0 2 * * *", "Mars/Olympus").expect_err("no such zone");
        assert!(tz.contains("unknown time zone `Mars/Olympus`"), "{tz}");
        let cron = Schedule::cron("0 0 25 * * *", "UTC").expect_err("hour 25");
        assert!(cron.contains("bad cron expression"), "{cron}");
        let zero = Schedule::every(Duration::ZERO).expect_err("zero");
        assert!(zero.contains("at least 1 ms"), "{zero}");
    }
}
