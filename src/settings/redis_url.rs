//! The Redis URL setting: a password inside never prints, and the
//! reference's `host:port` plus `REDIS_AUTH` become a URL.

use crate::store::redis::{redact, url_prefix};

/// A Redis URL for a reference-style `host:port` and `REDIS_AUTH`, which is
/// `password` or `user:password` (split at the first colon).
pub(super) fn reference_redis_url(scheme: &str, node: &str, auth: Option<&str>) -> String {
    let node = node.trim();
    let bare = node.split_once("://").map_or(node, |(_, rest)| rest);
    format!("{}{bare}", url_prefix(scheme, auth))
}

/// A Redis URL, or a comma-separated list of them: it may hold a password,
/// so `Debug` and `Display` print it redacted; [`RedisUrl::expose`] gives
/// the real text to the one place that connects.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct RedisUrl(pub String);

impl RedisUrl {
    /// The URL with its password, for connecting only.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for RedisUrl {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_owned()))
    }
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", redact(&self.0))
    }
}

impl std::fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_print() {
        let url = RedisUrl("redis://ann:s3cr%40t@h:6379/0,rediss://:pw@h2:1".into());
        for shown in [format!("{url}"), format!("{url:?}")] {
            assert!(!shown.contains("s3cr") && !shown.contains("pw@"), "{shown}");
            assert!(shown.contains("redis://ann:***@h:6379/0"), "{shown}");
            assert!(shown.contains("rediss://***@h2:1"), "{shown}");
        }
    }

    #[test]
    fn every_form_of_redis_auth_reaches_redis_intact() {
        for (auth, user, password) in [
            ("secret", None, "secret"),
            ("ann:secret", Some("ann"), "secret"),
            ("ann:p:a@s/s#w%rd", Some("ann"), "p:a@s/s#w%rd"),
            ("p@ss/w#rd", None, "p@ss/w#rd"),
        ] {
            let url = reference_redis_url("redis", "10.0.0.1:6379", Some(auth));
            let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                .unwrap_or_else(|e| panic!("{auth}: {e}"));
            let settings = info.redis_settings();
            assert_eq!(settings.username(), user, "{auth}");
            assert_eq!(settings.password(), Some(password), "{auth}");
            assert!(!redact(&url).contains(password), "{auth}");
        }
    }
}
