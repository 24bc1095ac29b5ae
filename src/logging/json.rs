//! JSON log lines, with one difference from tracing-subscriber's: the
//! refusal log's descriptors are JSON objects, not strings holding JSON,
//! so a log pipeline can search `fields.descriptors[].value` directly.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{Format, Json, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The target of refusal log lines (see the limiter's `log_refusal`).
pub(crate) const REFUSAL_TARGET: &str = "tollgate::refusal";

/// Fields of a refusal line that hold JSON text, written as JSON.
const JSON_FIELDS: [&str; 2] = ["descriptor", "descriptors"];

/// tracing-subscriber's JSON format, but for refusal lines.
pub(super) struct JsonLines {
    pub(super) inner: Format<Json>,
}

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        if meta.target() != REFUSAL_TARGET {
            return self.inner.format_event(ctx, writer, event);
        }
        let mut fields = Fields(Map::new());
        event.record(&mut fields);
        let line = serde_json::json!({
            "timestamp": jiff::Timestamp::now().to_string(),
            "level": meta.level().as_str(),
            "fields": fields.0,
            "target": meta.target(),
        });
        writeln!(writer, "{line}")
    }
}

struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        let value = match JSON_FIELDS.contains(&field.name()) {
            true => serde_json::from_str(value).unwrap_or_else(|_| Value::from(value)),
            false => Value::from(value),
        };
        self.0.insert(field.name().to_owned(), value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}
