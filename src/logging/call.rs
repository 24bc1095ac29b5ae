//! A call's ids, for the lines logged while it is decided: the caller's
//! request id (`x-request-id`) and trace id (W3C `traceparent`, or B3's
//! `x-b3-traceid`), from the gRPC call's metadata. A support engineer joins
//! a refusal to the proxy's access log with them.

/// The ids of the call being served.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CallIds {
    pub request_id: Option<Box<str>>,
    pub trace_id: Option<Box<str>>,
}

/// The most bytes of an id kept (a longer header is cut).
const MAX_ID_BYTES: usize = 128;

tokio::task_local! {
    static CALL_IDS: CallIds;
}

impl CallIds {
    /// The ids in a call's headers; `None` when it carries neither.
    pub(crate) fn from_headers(headers: &http::HeaderMap) -> Option<Self> {
        // One walk over the call's few headers, each name compared as
        // text: three lookups by name hash each name, and this runs for
        // every call (most of which carry none of the three).
        let (mut request_id, mut traceparent, mut b3) = (None, None, None);
        for (name, value) in headers {
            let slot = match name.as_str() {
                "x-request-id" => &mut request_id,
                "traceparent" => &mut traceparent,
                "x-b3-traceid" => &mut b3,
                _ => continue,
            };
            // The first value of a name, as a lookup by name gives.
            if slot.is_none() {
                *slot = Some(value);
            }
        }
        fn text(value: Option<&http::HeaderValue>) -> Option<&str> {
            value
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
        }
        let request_id = text(request_id).map(cut);
        let trace_id = text(traceparent)
            .and_then(|t| t.split('-').nth(1))
            .filter(|id| valid_trace_id(id))
            .or_else(|| text(b3))
            .map(cut);
        (request_id.is_some() || trace_id.is_some()).then_some(Self {
            request_id,
            trace_id,
        })
    }
}

/// A W3C trace id: 32 lowercase hex digits, not all zero. Anything else in
/// `traceparent` is no trace id (B3's is used, if sent).
fn valid_trace_id(id: &str) -> bool {
    id.len() == 32
        && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        && id.bytes().any(|b| b != b'0')
}

fn cut(id: &str) -> Box<str> {
    let mut end = id.len().min(MAX_ID_BYTES);
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    // One id, one line: a control character could forge another.
    id[..end]
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// `call`, run with `ids` as the call's ids.
pub(crate) fn with_call_ids<F: std::future::Future>(
    ids: CallIds,
    call: F,
) -> impl std::future::Future<Output = F::Output> {
    CALL_IDS.scope(ids, call)
}

/// The ids of the call being served, if it carried any.
pub(crate) fn call_ids() -> Option<CallIds> {
    CALL_IDS.try_with(Clone::clone).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_from_the_calls_headers() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(CallIds::from_headers(&headers), None);
        headers.insert("x-request-id", "abc-123".parse().expect("value"));
        headers.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .expect("value"),
        );
        let ids = CallIds::from_headers(&headers).expect("ids");
        assert_eq!(ids.request_id.as_deref(), Some("abc-123"));
        assert_eq!(
            ids.trace_id.as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        let mut b3 = http::HeaderMap::new();
        b3.insert("x-b3-traceid", "80f198ee56343ba8".parse().expect("value"));
        assert_eq!(
            CallIds::from_headers(&b3)
                .and_then(|i| i.trace_id)
                .as_deref(),
            Some("80f198ee56343ba8")
        );
        // A name sent twice: its first value, as a lookup by name gives.
        let mut twice = http::HeaderMap::new();
        twice.append("x-request-id", "first".parse().expect("value"));
        twice.append("x-request-id", "second".parse().expect("value"));
        twice.append("traceparent", "malformed".parse().expect("value"));
        twice.append("x-b3-traceid", "b3id".parse().expect("value"));
        let ids = CallIds::from_headers(&twice).expect("ids");
        assert_eq!(ids.request_id.as_deref(), Some("first"));
        assert_eq!(
            ids.trace_id.as_deref(),
            Some("b3id"),
            "B3 when traceparent has no id"
        );
        // A traceparent whose id is not a W3C trace id: B3's, or none.
        for bad in [
            "00--abc-01",
            "-",
            "00-   -x",
            "bogus-value",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            let mut both = http::HeaderMap::new();
            both.append("traceparent", bad.parse().expect("value"));
            both.append("x-b3-traceid", "b3id".parse().expect("value"));
            let ids = CallIds::from_headers(&both).expect("ids");
            assert_eq!(ids.trace_id.as_deref(), Some("b3id"), "{bad:?}");
            let mut alone = http::HeaderMap::new();
            alone.append("traceparent", bad.parse().expect("value"));
            assert_eq!(CallIds::from_headers(&alone), None, "{bad:?}");
        }
        let mut long = http::HeaderMap::new();
        long.insert("x-request-id", "x".repeat(1000).parse().expect("value"));
        assert_eq!(
            CallIds::from_headers(&long)
                .and_then(|i| i.request_id)
                .map(|r| r.len()),
            Some(MAX_ID_BYTES)
        );
    }

    #[tokio::test]
    async fn a_call_sees_its_ids_and_no_other() {
        assert_eq!(call_ids(), None);
        let ids = CallIds {
            request_id: Some("r1".into()),
            trace_id: None,
        };
        let seen = with_call_ids(ids.clone(), async { call_ids() }).await;
        assert_eq!(seen, Some(ids));
    }
}
