//! `GET /ui`: a small live page of who is being limited, the rules in force
//! and the store's health. No external asset; a strict
//! Content-Security-Policy (scripts and styles from this port only, no
//! inline script, no frames); client values shown as text, never as HTML.

use axum::extract::State;
use axum::http::{StatusCode, header};

use super::AdminState;
use axum::response::{IntoResponse, Response};

const PAGE: &str = include_str!("ui/page.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");

/// The page's policy: its own script, style and JSON, nothing else.
pub(super) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

pub(super) async fn page(State(s): State<AdminState>) -> Response {
    // The page reads /limited without a token: with reads closed it is off.
    if s.access.reads_need_token {
        return (
            StatusCode::FORBIDDEN,
            "the page is off with --admin-reads token: use tollgate top --token-file, or /limited with a bearer token\n",
        )
            .into_response();
    }
    asset("text/html; charset=utf-8", PAGE)
}

pub(super) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

pub(super) async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}
