//! Descriptor values with `*` wildcards anywhere (`api-*`, `*.example.com`,
//! `v*-beta`). The reference only honours a trailing `*`; every pattern it
//! accepts means the same here.

/// A compiled wildcard pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Glob {
    /// The literal pieces between the stars, in order.
    parts: Vec<Box<str>>,
}

impl Glob {
    /// `None` when `pattern` has no `*` (an exact value).
    pub(crate) fn new(pattern: &str) -> Option<Self> {
        pattern.contains('*').then(|| Glob {
            parts: pattern.split('*').map(Box::from).collect(),
        })
    }

    /// Whether `value` matches. Greedy-free: the first part anchors the start,
    /// the last part anchors the end, the middle parts are found left to right
    /// (leftmost placement is always safe for `*`-only patterns).
    pub(crate) fn matches(&self, value: &str) -> bool {
        let (first, rest) = match self.parts.split_first() {
            Some(split) => split,
            None => return true,
        };
        let Some(mut tail) = value.strip_prefix(&**first) else {
            return false;
        };
        let Some((last, middle)) = rest.split_last() else {
            return tail.is_empty();
        };
        for part in middle {
            match tail.find(&**part) {
                Some(i) => tail = &tail[i + part.len()..],
                None => return false,
            }
        }
        tail.len() >= last.len() && tail.ends_with(&**last)
    }
}

#[cfg(test)]
mod tests {
    use super::Glob;

    fn m(p: &str, v: &str) -> bool {
        Glob::new(p).expect("pattern has a star").matches(v)
    }

    #[test]
    fn stars_anywhere() {
        assert!(m("*", ""));
        assert!(m("*", "anything"));
        assert!(m("api-*", "api-"));
        assert!(m("api-*", "api-key"));
        assert!(!m("api-*", "ap"));
        assert!(m("*.example.com", "a.example.com"));
        assert!(!m("*.example.com", "example.com"));
        assert!(m("v*-beta", "v2-beta"));
        assert!(!m("v*-beta", "v2-beta2"));
        assert!(m("a*b*c", "abc"));
        assert!(m("a*b*c", "aXbYbZc"));
        assert!(!m("a*b*c", "acb"));
        assert!(!m("ab*ba", "aba"), "prefix and suffix may not overlap");
        assert!(Glob::new("plain").is_none());
    }
}
