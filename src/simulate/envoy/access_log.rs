//! The access log's format: its operators as fields, text lines read
//! through a template, JSON lines by key.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::config::EnvoyConfig;

/// Envoy's default access log format.
pub(crate) const DEFAULT_FORMAT: &str = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" \"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\"\n";

/// What a log field holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Field {
    StartTime,
    /// A request header (lower case; `:path`, `:method`, `:authority` too).
    Header(String),
    /// The client's address (with or without a port).
    RemoteAddress,
    /// Anything else the importer does not use.
    Other,
}

/// A format operator (`%REQ(X-API-KEY)%`) as the field it records.
pub(super) fn field_of(operator: &str) -> Field {
    let op = operator.trim_matches('%');
    let op = op.split(':').next().unwrap_or(op);
    if op == "START_TIME" || op.starts_with("START_TIME(") {
        return Field::StartTime;
    }
    if matches!(
        op,
        "DOWNSTREAM_REMOTE_ADDRESS"
            | "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT"
            | "DOWNSTREAM_DIRECT_REMOTE_ADDRESS"
            | "DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT"
    ) {
        return Field::RemoteAddress;
    }
    let inner = operator
        .trim_matches('%')
        .strip_prefix("REQ(")
        .and_then(|r| r.split(')').next());
    match inner {
        // `X-ENVOY-ORIGINAL-PATH?:PATH`: the original path, else :path.
        Some(names) => {
            let name = names.rsplit('?').next().unwrap_or(names);
            Field::Header(name.to_ascii_lowercase())
        }
        None => Field::Other,
    }
}

/// A text format as literals and fields.
pub(super) fn template(format: &str) -> Vec<(String, Field)> {
    // (literal before, field); the last literal comes with Field::Other.
    let mut parts = Vec::new();
    let mut rest = format;
    let mut literal = String::new();
    while let Some(start) = rest.find('%') {
        // An operator's argument may hold `%` itself:
        // `%START_TIME(%s.%3f)%` ends at the `%` after its `)`.
        let after = &rest[start + 1..];
        let name_end = after.find(['%', '(']).unwrap_or(after.len());
        let close = if after[name_end..].starts_with('(') {
            after[name_end..].find(")%").map(|i| name_end + i + 1)
        } else {
            after.find('%')
        };
        let Some(len) = close else {
            break;
        };
        literal.push_str(&rest[..start]);
        let operator = &rest[start..start + len + 2];
        parts.push((std::mem::take(&mut literal), field_of(operator)));
        rest = &rest[start + len + 2..];
    }
    literal.push_str(rest.trim_end_matches('\n'));
    parts.push((literal, Field::Other));
    parts
}

/// The fields of a text log line read through `template`.
pub(super) fn read_text(template: &[(String, Field)], line: &str) -> Option<Vec<(Field, String)>> {
    let mut out = Vec::new();
    let mut rest = line.strip_prefix(template.first()?.0.as_str())?;
    for (i, (_, field)) in template.iter().enumerate() {
        let Some((next, _)) = template.get(i + 1) else {
            break;
        };
        let end = if next.is_empty() {
            rest.len()
        } else {
            rest.find(next.as_str())?
        };
        out.push((field.clone(), rest[..end].to_owned()));
        rest = &rest[end + next.len()..];
    }
    Some(out)
}

/// One request as a log line recorded it.
#[derive(Debug, Default)]
pub(super) struct Logged {
    pub(super) time: Option<String>,
    pub(super) headers: HashMap<String, String>,
    pub(super) remote: Option<String>,
}

/// How the configuration's access log writes a request: the format the
/// importer reads its lines with.
pub(super) struct LogFormat {
    /// `json_format`'s keys and what each records; `None`: no JSON format.
    json: Option<BTreeMap<String, Field>>,
    /// The text format's literal parts and fields.
    template: Vec<(String, Field)>,
}

impl From<&EnvoyConfig> for LogFormat {
    fn from(config: &EnvoyConfig) -> Self {
        let json = config.json_format.as_ref().map(|format| {
            format
                .iter()
                .map(|(k, v)| (k.clone(), v.as_deref().map_or(Field::Other, field_of)))
                .collect()
        });
        let text = config.text_format.as_deref().unwrap_or(DEFAULT_FORMAT);
        Self {
            json,
            template: template(text),
        }
    }
}

impl LogFormat {
    /// The fields a log line has, by what they record.
    pub(super) fn read(&self, line: &str) -> Option<Logged> {
        let fields: Vec<(Field, String)> = if line.trim_start().starts_with('{') {
            let object: serde_json::Map<String, Value> = serde_json::from_str(line).ok()?;
            object
                .into_iter()
                .map(|(k, v)| {
                    let field = match &self.json {
                        Some(format) => format.get(&k).cloned().unwrap_or(Field::Other),
                        // No json_format in the configuration: Envoy's own
                        // names for the usual operators.
                        None => conventional_field(&k),
                    };
                    let text = match v {
                        Value::String(s) => s,
                        Value::Null => "-".into(),
                        other => other.to_string(),
                    };
                    (field, text)
                })
                .collect()
        } else {
            read_text(&self.template, line)?
        };
        let mut logged = Logged::default();
        for (field, value) in fields {
            // Envoy writes "-" for a value it does not have.
            let value = (value != "-" && !value.is_empty()).then_some(value);
            match field {
                Field::StartTime => logged.time = value,
                Field::Header(name) => {
                    if let Some(v) = value {
                        logged.headers.insert(name, v);
                    } else {
                        logged.headers.entry(name).or_default();
                    }
                }
                Field::RemoteAddress => logged.remote = value,
                Field::Other => {}
            }
        }
        Some(logged)
    }

    /// Which headers the log records at all (whether or not a line has one).
    pub(super) fn recorded(&self) -> Vec<Field> {
        match &self.json {
            Some(format) => format.values().cloned().collect(),
            None => self.template.iter().map(|(_, f)| f.clone()).collect(),
        }
    }
}

/// Field names for JSON logs whose format is not in the configuration.
pub(super) fn conventional_field(key: &str) -> Field {
    match key {
        "start_time" | "timestamp" | "time" => Field::StartTime,
        "method" => Field::Header(":method".into()),
        "path" => Field::Header(":path".into()),
        "authority" | "host" => Field::Header(":authority".into()),
        "downstream_remote_address" | "remote_address" | "client_ip" => Field::RemoteAddress,
        "x_forwarded_for" => Field::Header("x-forwarded-for".into()),
        "user_agent" => Field::Header("user-agent".into()),
        "request_id" => Field::Header("x-request-id".into()),
        _ => Field::Other,
    }
}
