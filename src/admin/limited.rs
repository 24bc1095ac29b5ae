//! `/limited`: who is being limited now, per rule (see [`crate::limited`]).

use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use super::AdminState;

/// `GET /limited[?domain=D][&search=TEXT][&scope=instance|merged]
/// [&limit=N][&offset=M]`: JSON, heaviest rule and client first, `limit`
/// rules from the `offset`th (50 from the first by default; at most
/// [`MAX_PAGE`]); `total_rules` and `next_offset` say what is left.
pub(super) async fn limited(
    State(s): State<AdminState>,
    caller: super::Caller,
    headers: axum::http::HeaderMap,
    uri: Uri,
) -> Response {
    if let Some(refused) = s.access.may_read(&headers, caller.map(|c| c.0)) {
        return refused;
    }
    // A browser asking for a page gets the page.
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if accept.contains("text/html") && !accept.contains("application/json") {
        return axum::response::Redirect::to("/ui").into_response();
    }
    let Some(limited) = &s.limited else {
        return (
            StatusCode::NOT_FOUND,
            "the view of who is limited is off (--limited-clients 0)\n",
        )
            .into_response();
    };
    let query = Query::parse(uri.query());
    let page = |name: &str, default: usize| match query.get(name) {
        None => Ok(default),
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|&n| name == "offset" || (1..=MAX_PAGE).contains(&n))
            .ok_or_else(|| {
                let range = if name == "limit" {
                    " from 1 to 1000"
                } else {
                    ""
                };
                format!(
                    "{name} is a whole number{range}, not '{}'\n",
                    crate::rules::printable(text)
                )
            }),
    };
    let (limit, offset) = match (page("limit", PAGE), page("offset", 0)) {
        (Ok(limit), Ok(offset)) => (limit, offset),
        (Err(why), _) | (_, Err(why)) => return (StatusCode::BAD_REQUEST, why).into_response(),
    };
    let rules = s.handles.rules();
    let view = match (query.get("scope"), s.handles.views.clone()) {
        (None | Some("instance"), _) => {
            limited.view(query.get("domain"), query.get("search"), &rules)
        }
        (Some("merged"), Some(share)) => {
            match limited
                .merged(&share, (query.get("domain"), query.get("search")), &rules)
                .await
            {
                Ok(view) => view,
                Err(e) => {
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("the other instances' views could not be read: {e}\n"),
                    )
                        .into_response();
                }
            }
        }
        (Some("merged"), _) => {
            return (
                StatusCode::BAD_REQUEST,
                "scope=merged needs a store instances share (Redis); this instance's view is all there is\n",
            )
                .into_response();
        }
        (Some(other), _) => {
            return (
                StatusCode::BAD_REQUEST,
                format!(
                    "scope is instance or merged, not '{}'\n",
                    crate::rules::printable(other)
                ),
            )
                .into_response();
        }
    };
    let mut view = view;
    view.paginate(offset, limit);
    match serde_json::to_string(&view) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

/// Rules per page of `/limited` unless `limit` says otherwise.
const PAGE: usize = 50;
/// The most rules one page holds.
const MAX_PAGE: usize = 1_000;

/// A URL's query, percent-decoded (`+` is a space).
pub(super) struct Query(Vec<(String, String)>);

impl Query {
    pub(super) fn parse(query: Option<&str>) -> Self {
        let pairs = query
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                (decode(k), decode(v))
            })
            .collect();
        Self(pairs)
    }

    /// The first value of `name`.
    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn decode(text: &str) -> String {
    let hex = |b: u8| char::from(b).to_digit(16).map(|d| d as u8);
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'+', _, _) => out.push(b' '),
            (b'%', Some(&hi), Some(&lo)) if hex(hi).is_some() && hex(lo).is_some() => {
                out.push(hex(hi).unwrap_or(0) * 16 + hex(lo).unwrap_or(0));
                i += 2;
            }
            (b, _, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_decoded() {
        let q = Query::parse(Some("domain=api&search=a%20b+c&x"));
        assert_eq!(q.get("domain"), Some("api"));
        assert_eq!(q.get("search"), Some("a b c"));
        assert_eq!(q.get("x"), Some(""));
        assert_eq!(q.get("y"), None);
        assert_eq!(Query::parse(Some("s=%zz%4")).get("s"), Some("%zz%4"));
    }
}
