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
//!
//! The Redis client's own warnings get the same treatment: a Cluster
//! failover makes it warn thousands of times ("connection lost; repairing",
//! one per request), so they are summarised too (how many, and the last),
//! once per interval; its errors still print as they come.

mod call;
mod json;

pub(crate) use call::{CallIds, call_ids, with_call_ids};
pub(crate) use json::REFUSAL_TARGET;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The target of h2's protocol-error events.
pub(crate) const REFUSED_TARGET: &str = "h2::refused";

/// The shortest time between two warnings about refused calls.
pub(crate) const REFUSED_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The longest refusal reason kept for the log.
const MAX_REASON_BYTES: usize = 300;

/// The Redis client's log target prefix.
const REDIS_TARGET: &str = "redis";

/// Events of one kind, counted, with the last one's message.
struct Summarised {
    count: AtomicU64,
    last: Mutex<String>,
}

impl Summarised {
    const fn new() -> Self {
        Self {
            count: AtomicU64::new(0),
            last: Mutex::new(String::new()),
        }
    }

    /// Counts one event and keeps its message for the next summary (unless
    /// another thread is keeping one: under a flood, a message is as good
    /// as another, and no caller waits for the lock).
    fn record(&self, message: &str) {
        self.count.fetch_add(1, Ordering::Relaxed);
        if let Some(mut last) = self.last.try_lock() {
            last.clear();
            last.push_str(crate::metrics::truncated(message, MAX_REASON_BYTES));
        }
    }

    /// The total, the events since `seen` and the last message, if any
    /// happened since `seen`.
    fn since(&self, seen: u64) -> Option<(u64, u64, String)> {
        let total = self.count.load(Ordering::Relaxed);
        (total > seen).then(|| (total, total - seen, self.last.lock().clone()))
    }
}

static REFUSALS: Summarised = Summarised::new();
static REDIS_WARNINGS: Summarised = Summarised::new();
/// The tracing exporter's warnings and errors (a collector that refuses or
/// does not answer): summarised, as one batch fails every few seconds.
static EXPORT_FAILURES: Summarised = Summarised::new();
/// Rate limit requests that could not be decided (malformed, or above a
/// bound): a hostile client can send them at any rate.
static UNDECIDED: Summarised = Summarised::new();

/// Requests the store could not decide (a full memory store, Redis down),
/// answered from their failure modes.
static STORE_FAILURES: Summarised = Summarised::new();

/// Keeps a store failure's reason for the next summary.
pub(crate) fn store_failed(reason: &str) {
    STORE_FAILURES.record(reason);
}

/// Keeps an undecided request's reason (`refused`: answered OVER_LIMIT, its
/// domain failing closed; else failed with an error) for the next summary.
pub(crate) fn undecided(reason: &str, refused: bool) {
    let answer = if refused { "OVER_LIMIT" } else { "an error" };
    UNDECIDED.record(&format!("{reason} (answered {answer})"));
}

/// The targets of the OpenTelemetry crates' own log events.
const OTEL_TARGETS: [&str; 3] = ["opentelemetry", "opentelemetry_sdk", "opentelemetry-otlp"];

/// The layer that sees the OpenTelemetry crates' warnings and errors.
struct ExportFailures;

/// Every field of an event, `name=value` separated by spaces.
struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        if !self.0.is_empty() {
            self.0.push(' ');
        }
        let _ = write!(self.0, "{}={value:?}", field.name());
    }
}

impl<S: tracing::Subscriber> Layer<S> for ExportFailures {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() <= tracing::Level::WARN
            && OTEL_TARGETS.iter().any(|t| meta.target().starts_with(t))
        {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            EXPORT_FAILURES.record(&fields.0);
        }
    }
}

thread_local! {
    /// How many gRPC server connections this thread is polling now (0 or
    /// 1): the HTTP/2 library's protocol errors there are calls Tollgate
    /// refused. Its errors as a client (the xDS and OTLP connections, tasks
    /// of their own) are not. A count on the thread, not a task-local: a
    /// connection is polled at least once a call, and a task-local's scope
    /// costs about three times what this does.
    static SERVER_CONNECTION: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// `connection`, served as a gRPC server connection: the HTTP/2 library's
/// refusals inside it are counted and summarised.
pub(crate) fn in_server_connection<F: std::future::Future>(
    connection: F,
) -> impl std::future::Future<Output = F::Output> {
    // Boxed once per connection, so the wrapper needs no projection.
    let mut connection = Box::pin(connection);
    std::future::poll_fn(move |cx| {
        /// Counts the poll in, and out however it ends (a panic included).
        struct Polling;
        impl Drop for Polling {
            fn drop(&mut self) {
                SERVER_CONNECTION.with(|n| n.set(n.get() - 1));
            }
        }
        SERVER_CONNECTION.with(|n| n.set(n.get() + 1));
        let _polling = Polling;
        connection.as_mut().poll(cx)
    })
}

/// Whether the code running now serves a gRPC server connection.
fn in_a_server_connection() -> bool {
    SERVER_CONNECTION.with(|n| n.get() > 0)
}

/// Counts one refusal (in the metric) and keeps its reason for the next
/// summary.
fn record_refusal(reason: &str) {
    crate::metrics::count_protocol_error();
    REFUSALS.record(reason);
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
        if !in_a_server_connection() {
            return;
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        record_refusal(&message.0);
    }
}

/// Records of dependencies that log through the `log` crate: the Redis
/// client's warnings are counted for the summary; everything else becomes a
/// tracing event, filtered and printed like Tollgate's own.
struct LogBridge;

impl log::Log for LogBridge {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if record.level() == log::Level::Warn && record.target().starts_with(REDIS_TARGET) {
            REDIS_WARNINGS.record(&record.args().to_string());
            return;
        }
        let _ = tracing_log::format_trace(record);
    }

    fn flush(&self) {}
}

/// When one kind of summarised event may be logged again: at most once per
/// `interval` ticks (a tick is a second in the process; tests tick by hand).
#[derive(Debug)]
struct Quiet {
    /// The count already logged.
    seen: u64,
    /// Ticks left before the next line may be written.
    quiet: u64,
    interval: u64,
}

impl Quiet {
    fn new(interval: Duration) -> Self {
        Self {
            seen: 0,
            quiet: 0,
            interval: interval.as_secs().max(1),
        }
    }

    /// One tick: the line to write (total, new since the last line, last
    /// message), if events happened and the last line is `interval` ticks
    /// old.
    fn tick(&mut self, events: &Summarised) -> Option<(u64, u64, String)> {
        self.quiet = self.quiet.saturating_sub(1);
        if self.quiet != 0 {
            return None;
        }
        let line = events.since(self.seen)?;
        self.seen = line.0;
        self.quiet = self.interval;
        Some(line)
    }
}

/// Logs, at most once per [`REFUSED_LOG_INTERVAL`] each, how many calls were
/// refused at the protocol level and how many warnings the Redis client
/// gave since the last line, with the last reason.
fn log_summaries_forever() {
    let mut refused = Quiet::new(REFUSED_LOG_INTERVAL);
    let mut redis = Quiet::new(REFUSED_LOG_INTERVAL);
    let mut export = Quiet::new(REFUSED_LOG_INTERVAL);
    let mut undecided = Quiet::new(REFUSED_LOG_INTERVAL);
    let mut store = Quiet::new(REFUSED_LOG_INTERVAL);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        if let Some((total, new, last)) = refused.tick(&REFUSALS) {
            tracing::warn!(
                refused = new,
                total,
                last_reason = %last,
                "gRPC calls or connections refused at the HTTP/2 protocol level \
                 (Envoy answers these from its failure_mode_deny)"
            );
        }
        if let Some((total, new, last)) = export.tick(&EXPORT_FAILURES) {
            tracing::warn!(
                failures = new,
                total,
                last = %last,
                "spans could not be exported to the collector (summarised: at most one line per 10 s)"
            );
        }
        if let Some((total, new, last)) = undecided.tick(&UNDECIDED) {
            tracing::warn!(
                requests = new,
                total,
                last = %last,
                "rate limit requests could not be decided: malformed, or above a bound \
                 (refused where their domain has a limit with failure_mode deny; \
                 summarised: at most one line per 10 s)"
            );
        }
        if let Some((total, new, last)) = store.tick(&STORE_FAILURES) {
            tracing::warn!(
                requests = new,
                total,
                last = %last,
                "the store could not decide requests: they were answered from their \
                 failure modes (summarised: at most one line per 10 s)"
            );
        }
        if let Some((total, new, last)) = redis.tick(&REDIS_WARNINGS) {
            tracing::warn!(
                warnings = new,
                total,
                last = %last,
                "the Redis client warned (summarised: at most one line per 10 s)"
            );
        }
    }
}

/// Installs the process's logging: `level` (a tracing filter) in `json` or
/// text, on stderr; and the refusal counter. The error names a bad filter.
pub(crate) fn init(level: &str, json: bool) -> Result<(), String> {
    let filter = EnvFilter::try_new(level)
        .map_err(|e| format!("invalid log level '{level}': {e}"))?
        // Refusals and the Redis client's warnings are summarised by
        // `log_summaries_forever`, never printed one by one (`level` could
        // not turn refusals on: this directive is more specific than any
        // target prefix but h2::refused itself).
        .add_directive(
            format!("{REFUSED_TARGET}=off")
                .parse()
                .map_err(|e| format!("{e}"))?,
        );
    // The OpenTelemetry crates' own events are summarised too.
    let filter = OTEL_TARGETS.iter().try_fold(filter, |f, t| {
        format!("{t}=off")
            .parse()
            .map(|d| f.add_directive(d))
            .map_err(|e| format!("{e}"))
    })?;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let output = if json {
        tracing_subscriber::fmt::layer()
            .json()
            .event_format(json::JsonLines {
                inner: tracing_subscriber::fmt::format().json(),
            })
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
    // Filtered to the OpenTelemetry crates' warnings: an unfiltered layer
    // would enable every event of every crate.
    let export_failures =
        ExportFailures.with_filter(OTEL_TARGETS.iter().fold(Targets::new(), |t, target| {
            t.with_target(*target, tracing::Level::WARN)
        }));
    tracing_subscriber::registry()
        .with(output)
        .with(refusals)
        .with(export_failures)
        .try_init()
        .map_err(|e| e.to_string())?;
    log::set_boxed_logger(Box::new(LogBridge)).map_err(|e| e.to_string())?;
    // Dependencies' debug and trace records are not wanted: not even
    // formatted (the Redis client has some on every command).
    log::set_max_level(log::LevelFilter::Info);
    std::thread::Builder::new()
        .name("tollgate-log-summaries".into())
        .spawn(log_summaries_forever)
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_counted_and_summarised_with_the_last_reason() {
        let before = REFUSALS.count.load(Ordering::Relaxed);
        record_refusal("malformed headers: missing method");
        record_refusal(&"x".repeat(1000));
        let (total, new, last) = REFUSALS.since(before).expect("a summary");
        assert!(total >= before + 2);
        assert!(new >= 2);
        assert!(last.len() <= MAX_REASON_BYTES, "{}", last.len());
        assert_eq!(REFUSALS.since(total).map(|s| s.1), None);
    }

    #[tokio::test]
    async fn only_server_connections_refuse_calls() {
        assert!(!in_a_server_connection(), "outside any connection");
        assert!(
            in_server_connection(async { in_a_server_connection() }).await,
            "inside a server connection"
        );
        // A client connection (xDS, OTLP) is a task of its own.
        let client =
            in_server_connection(async { tokio::spawn(async { in_a_server_connection() }).await })
                .await
                .expect("joined");
        assert!(!client, "a task spawned elsewhere is not the connection");
    }

    #[test]
    fn a_summary_is_written_at_once_then_at_most_once_per_interval() {
        let events = Summarised::new();
        let mut quiet = Quiet::new(Duration::from_secs(10));
        assert_eq!(quiet.tick(&events), None, "nothing happened");
        for _ in 0..20 {
            events.record("missing method");
        }
        assert_eq!(
            quiet.tick(&events),
            Some((20, 20, "missing method".into())),
            "the first line comes on the next tick"
        );
        for _ in 0..5 {
            events.record("malformed headers");
        }
        for tick in 1..10 {
            assert_eq!(
                quiet.tick(&events),
                None,
                "tick {tick}: within the interval"
            );
        }
        assert_eq!(
            quiet.tick(&events),
            Some((25, 5, "malformed headers".into())),
            "the tenth tick: the five since, with the last reason"
        );
        for _ in 0..30 {
            assert_eq!(quiet.tick(&events), None, "quiet: nothing new");
        }
        events.record("again");
        assert_eq!(
            quiet.tick(&events),
            Some((26, 1, "again".into())),
            "after a quiet spell, at once"
        );
    }

    #[test]
    fn the_redis_clients_warnings_are_counted_not_printed_and_its_errors_pass() {
        // The only test in this binary that installs the global logger.
        init("info", false).expect("logging");
        let before = REDIS_WARNINGS.since(0).map_or(0, |s| s.0);
        for _ in 0..1000 {
            log::warn!(target: "redis::cluster_handling::async_connection", "connection to node lost; repairing in background");
        }
        log::error!(target: "redis::cluster_handling::async_connection", "an error");
        let (total, new, last) = REDIS_WARNINGS.since(before).expect("counted");
        assert_eq!(new, 1000, "{total}");
        assert!(last.contains("repairing"), "{last}");
    }
}
