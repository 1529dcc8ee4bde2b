//! Everything the tracing subscriber writes, at every level, collected for a test to read
//! (e.g. to check that no secret reaches the logs).

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Collects the formatted log lines of the thread it is installed on.
#[derive(Debug, Clone, Default)]
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogCapture {
    /// Makes this the thread's subscriber, at TRACE level, until the guard drops. Thread-local:
    /// use it in a current-thread tokio test, so every task logs through it.
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        // While one subscriber exists in the process, tracing decides whether a log line
        // (a callsite) is wanted from the subscriber of whichever thread meets it first: a
        // test thread without a capture would switch a line off for this one too. A second
        // subscriber kept alive for the whole process makes it ask every subscriber instead.
        static SECOND: OnceLock<tracing::Dispatch> = OnceLock::new();
        SECOND.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// What was written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::LogCapture;

    fn warn_here() {
        tracing::warn!("marker-7f3a");
    }

    /// A callsite first met on a thread with no subscriber, while this capture is the only
    /// subscriber anywhere, still reaches the capture here.
    #[test]
    fn a_callsite_another_thread_met_first_is_captured() {
        let captured = LogCapture::default();
        let _default = captured.install();
        std::thread::spawn(warn_here)
            .join()
            .expect("the other thread");
        warn_here();
        assert!(
            captured.text().contains("marker-7f3a"),
            "{}",
            captured.text()
        );
    }
}
