//! The Prometheus text format, one family at a time. Every line of
//! `/metrics` (and of the reference's mapped endpoint) is written through
//! [`Exposition`], so each family has its
//! `# HELP` and `# TYPE`, and a sample's line is written one way.

use std::fmt::{Display, Write};

/// A metric family's type.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Writes families and their samples onto a `String`.
pub(crate) struct Exposition<'a> {
    out: &'a mut String,
}

impl<'a> Exposition<'a> {
    pub(crate) fn new(out: &'a mut String) -> Self {
        Self { out }
    }

    /// A family's `# HELP` and `# TYPE`; its samples follow.
    pub(crate) fn family(&mut self, name: &str, help: &str, kind: Kind) -> &mut Self {
        let _ = writeln!(
            self.out,
            "# HELP {name} {help}\n# TYPE {name} {}",
            kind.name()
        );
        self
    }

    /// One sample, `name{labels} value`; `labels` is `a="x",b="y"` (escaped
    /// already, see [`super::labels`]) or empty.
    pub(crate) fn sample(&mut self, name: &str, labels: &str, value: impl Display) -> &mut Self {
        if labels.is_empty() {
            let _ = writeln!(self.out, "{name} {value}");
        } else {
            let _ = writeln!(self.out, "{name}{{{labels}}} {value}");
        }
        self
    }

    /// A counter family of one unlabelled sample.
    pub(crate) fn counter(&mut self, name: &str, help: &str, value: u64) -> &mut Self {
        self.family(name, help, Kind::Counter)
            .sample(name, "", value)
    }

    /// A gauge family of one unlabelled sample.
    pub(crate) fn gauge(&mut self, name: &str, help: &str, value: impl Display) -> &mut Self {
        self.family(name, help, Kind::Gauge).sample(name, "", value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_carry_help_and_type_and_samples_their_labels() {
        let mut out = String::new();
        Exposition::new(&mut out)
            .counter("a_total", "As.", 3)
            .family("b", "Bs.", Kind::Gauge)
            .sample("b", "x=\"1\"", 1.5)
            .sample("b", "", 2);
        assert_eq!(
            out,
            "# HELP a_total As.\n# TYPE a_total counter\na_total 3\n\
             # HELP b Bs.\n# TYPE b gauge\nb{x=\"1\"} 1.5\nb 2\n"
        );
    }
}
