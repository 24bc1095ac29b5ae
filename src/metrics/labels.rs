//! Label sets: escaped, bounded, and the reference's `domain`/`keyN` shape.

/// `value` cut to at most `max` bytes, on a character boundary.
pub(crate) fn truncated(value: &str, max: usize) -> &str {
    if value.len() <= max {
        return value;
    }
    let mut end = max;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}

/// A label set, `a="x",b="y"`, its values escaped.
pub(crate) fn labels<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (name, value) in pairs {
        push_label(&mut out, name, value);
    }
    if !out.is_empty() {
        out.remove(0);
    }
    out
}

/// Appends `,name="value"` to a label set.
pub(crate) fn push_label(out: &mut String, name: &str, value: &str) {
    out.push(',');
    out.push_str(name);
    out.push_str("=\"");
    label_value(out, value);
    out.push('"');
}

/// Escapes a Prometheus label value.
pub(crate) fn label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            // A control or invisible character from a request (a metric
            // read in a terminal must not run its escape sequences): shown
            // as `\u{1b}`, its backslash escaped for Prometheus.
            c if crate::wire_text::hidden(c) => {
                out.push_str(&format!("\\\\u{{{:x}}}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
}

/// A rule's labels: [`metric_labels`], and `limit="..."` for one of
/// several limits of a descriptor.
pub(crate) fn rule_labels<'a>(
    domain: &str,
    levels: impl Iterator<Item = &'a str>,
    limit_label: Option<&str>,
) -> String {
    let mut labels = metric_labels(domain, levels);
    if let Some(label) = limit_label {
        push_label(&mut labels, "limit", label);
    }
    labels
}

/// `domain="d",key1="a_b",key2="c"`: the reference's Prometheus labels.
pub(crate) fn metric_labels<'a>(domain: &str, keys: impl Iterator<Item = &'a str>) -> String {
    let mut labels = String::from("domain=\"");
    label_value(&mut labels, domain);
    labels.push('"');
    for (i, key) in keys.enumerate() {
        push_label(&mut labels, &format!("key{}", i + 1), key);
    }
    labels
}
