//! The process's log output, and the gRPC calls refused below the
//! application: counted and logged rate limited.
//!
//! Envoy treats a call that fails at the HTTP/2 level (a stream reset, a
//! connection closed for a protocol error) like an unreachable limiter and,
//! with `failure_mode_deny: false`, admits the request: a client that cannot
//! talk to Tollgate is limited by nothing, silently. Our h2 (see
//! `vendor/h2/TOLLGATE.md`) emits every such refusal as a WARN event of the
//! target [`REFUSED_TARGET`]; this module keeps those events out of the
//! regular output (a client could flood it), counts them
//! (`tollgate_grpc_protocol_errors_total`) and logs a summary at most once per
//! [`REFUSED_LOG_INTERVAL`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The target of h2's protocol-error events.
pub const REFUSED_TARGET: &str = "h2::refused";

/// The shortest time between two warnings about refused calls.
pub const REFUSED_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The longest refusal reason kept for the log.
const MAX_REASON_BYTES: usize = 300;

static REFUSED: AtomicU64 = AtomicU64::new(0);
static LAST_REASON: Mutex<String> = Mutex::new(String::new());

/// gRPC streams and connections refused at the protocol level so far.
pub fn refused_total() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// Counts one refusal and keeps its reason for the next summary.
fn record_refusal(reason: &str) {
    REFUSED.fetch_add(1, Ordering::Relaxed);
    let mut last = LAST_REASON.lock();
    last.clear();
    last.push_str(crate::metrics::truncated(reason, MAX_REASON_BYTES));
}

/// The layer that sees h2's refusal events.
struct Refusals;

struct Message(String);

impl Visit for Message {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            use std::fmt::Write;
            let _ = write!(self.0, "{value:?}");
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for Refusals {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        record_refusal(&message.0);
    }
}

/// What a summary of refusals says, if there were any since `seen`.
/// Returns the new total and the line's fields.
fn summary(seen: u64) -> Option<(u64, u64, String)> {
    let total = refused_total();
    (total > seen).then(|| (total, total - seen, LAST_REASON.lock().clone()))
}

/// Logs, at most once per [`REFUSED_LOG_INTERVAL`], how many calls were
/// refused at the protocol level since the last line, with the last reason.
fn log_refusals_forever() {
    let mut seen = 0;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        if let Some((total, new, last)) = summary(seen) {
            seen = total;
            tracing::warn!(
                refused = new,
                total,
                last_reason = %last,
                "gRPC calls or connections refused at the HTTP/2 protocol level \
                 (Envoy answers these from its failure_mode_deny)"
            );
            std::thread::sleep(REFUSED_LOG_INTERVAL - Duration::from_secs(1));
        }
    }
}

/// Installs the process's logging: `level` (a tracing filter) in `json` or
/// text, on stderr; and the refusal counter. The error names a bad filter.
pub fn init(level: &str, json: bool) -> Result<(), String> {
    let filter = EnvFilter::try_new(level)
        .map_err(|e| format!("invalid log level '{level}': {e}"))?
        // Refusals are summarised by `log_refusals_forever`, never printed
        // one by one (`level` could not turn them on: this directive is
        // more specific than any target prefix but h2::refused itself).
        .add_directive(
            format!("{REFUSED_TARGET}=off")
                .parse()
                .map_err(|e| format!("{e}"))?,
        );
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let output = if json {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .with_filter(filter)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .with_filter(filter)
            .boxed()
    };
    let refusals =
        Refusals.with_filter(Targets::new().with_target(REFUSED_TARGET, tracing::Level::WARN));
    tracing_subscriber::registry()
        .with(output)
        .with(refusals)
        .try_init()
        .map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("tollgate-refusals".into())
        .spawn(log_refusals_forever)
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_counted_and_summarised_with_the_last_reason() {
        let before = refused_total();
        record_refusal("malformed headers: missing method");
        record_refusal(&"x".repeat(1000));
        let (total, new, last) = summary(before).expect("a summary");
        assert!(total >= before + 2);
        assert!(new >= 2);
        assert!(last.len() <= MAX_REASON_BYTES, "{}", last.len());
        assert_eq!(summary(total).map(|s| s.1), None);
    }
}
