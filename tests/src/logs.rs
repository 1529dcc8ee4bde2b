//! Everything the tracing subscriber writes, at every level, collected for a test to read
//! (e.g. to check that no secret reaches the logs), and the spans of one name with their
//! fields and events, for a test that checks fields rather than text.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

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
        ask_every_subscriber();
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

/// Keeps a thread from losing callsites to another thread's "not wanted" (see
/// [`LogCapture::install`]).
fn ask_every_subscriber() {
    static SECOND: OnceLock<tracing::Dispatch> = OnceLock::new();
    SECOND.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
}

/// One recorded span: its fields as they were given, and the messages of the events in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordedSpan {
    /// Field name -> value, formatted with `Debug` (strings without quotes).
    pub fields: BTreeMap<String, String>,
    /// The `message` of each event logged inside the span, in order.
    pub events: Vec<String>,
}

/// Records every span of one name (its fields, its events) on the thread it is installed on.
#[derive(Debug, Clone)]
pub struct SpanRecorder {
    name: &'static str,
    spans: Arc<Mutex<Vec<RecordedSpan>>>,
    messages: Arc<Mutex<Vec<String>>>,
}

/// The index of a recorded span, kept in the span's extensions.
struct Slot(usize);

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl SpanRecorder {
    /// A recorder of the spans called `name`.
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            spans: Arc::default(),
            messages: Arc::default(),
        }
    }

    /// Makes a subscriber with this recorder the thread's, until the guard drops (use it in a
    /// current-thread tokio test).
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        ask_every_subscriber();
        let subscriber = tracing_subscriber::registry().with(self.clone());
        tracing::subscriber::set_default(subscriber)
    }

    /// The spans recorded so far, in the order they were created.
    pub fn spans(&self) -> Vec<RecordedSpan> {
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The message of every event logged on the thread, in a recorded span or not.
    pub fn messages(&self) -> Vec<String> {
        self.messages
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl<S> tracing_subscriber::Layer<S> for SpanRecorder
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != self.name {
            return;
        }
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let mut spans = self.spans.lock().unwrap_or_else(PoisonError::into_inner);
        spans.push(RecordedSpan {
            fields: fields.0,
            events: Vec::new(),
        });
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Slot(spans.len() - 1));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let message = fields.0.remove("message").unwrap_or_default();
        self.messages
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(message.clone());
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        for span in scope {
            if let Some(Slot(index)) = span.extensions().get::<Slot>() {
                let mut spans = self.spans.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(recorded) = spans.get_mut(*index) {
                    recorded.events.push(message);
                }
                return;
            }
        }
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
