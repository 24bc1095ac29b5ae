//! Admin HTTP, on its own port: `/healthcheck`, `/metrics` (Prometheus),
//! `/json` (a RateLimitRequest as JSON, as the reference's `/json`),
//! `/rlconfig` (the loaded rules, one line per limit), `/rlqs` (the quota
//! service's buckets), `/candidate` and `/candidate/report.html` (candidate
//! rules), and the operator view: `/limited` (who is limited), `/counters`
//! and `/counters/reset` (a client's, a rule's or a domain's counters, and
//! lifting them), and the page `/ui` (with `/ui/app.js`, `/ui/app.css`).

mod body;
mod counters;
mod failures;
mod guard;
mod handles;
mod json;
mod limited;
mod tokens;
mod ui;

pub(crate) use failures::FailureLimits;
pub(crate) use guard::{Access, Peer, RESET_MAX_KEYS};
pub(crate) use handles::Handles;
pub use json::request_from_json;
pub(crate) use tokens::{TokenFile, parse as parse_tokens};

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::candidate::Candidate;
use crate::health::Health;
use crate::limited::Limited;
use crate::limiter::LimitError;
use crate::metrics::Others;
use crate::rlqs::Quotas;

#[derive(Clone)]
struct AdminState {
    handles: Handles,
    quotas: Arc<Quotas>,
    candidate: Option<Arc<Candidate>>,
    limited: Option<Arc<Limited>>,
    health: Arc<Health>,
    access: Arc<Access>,
}

/// The admin routes.
pub(crate) fn router(
    handles: Handles,
    quotas: Arc<Quotas>,
    candidate: Option<Arc<Candidate>>,
    limited: Option<Arc<Limited>>,
    health: Arc<Health>,
    access: Arc<Access>,
) -> Router {
    let json_route = if access.json {
        post(json)
    } else {
        post(|| async {
            (
                StatusCode::NOT_FOUND,
                "POST /json is turned off (--admin-json off)\n",
            )
        })
    };
    Router::new()
        .route("/healthcheck", get(healthcheck))
        .route("/metrics", get(metrics))
        .route("/json", json_route)
        .route("/rlconfig", get(rlconfig))
        .route("/rlqs", get(rlqs))
        .route("/candidate", get(candidate_json))
        .route("/candidate/report.html", get(candidate_report))
        .route("/limited", get(limited::limited))
        .route("/counters", post(counters::counters))
        .route("/counters/reset", post(counters::reset))
        .route("/ui", get(ui::page))
        .route("/ui/app.js", get(ui::script))
        .route("/ui/app.css", get(ui::style))
        .layer(axum::extract::DefaultBodyLimit::max(handles.request_bytes))
        .with_state(AdminState {
            handles,
            quotas,
            candidate,
            limited,
            health,
            access: access.clone(),
        })
        .layer(axum::middleware::from_fn_with_state(access, guard::guard))
}

/// The reference's stats as Prometheus metrics, through a statsd-exporter
/// mapping, on `path` (the reference's `PROMETHEUS_ADDR`/`_PATH`).
pub(crate) fn reference_metrics_router(
    metrics: Arc<crate::metrics::Metrics>,
    path: String,
    mapper: Arc<crate::stats::mapper::Mapper>,
) -> Router {
    Router::new().route(
        &path,
        get(move || {
            let (metrics, mapper) = (metrics.clone(), mapper.clone());
            async move {
                // Off the runtime that answers health checks: a mapping file
                // of many regexes makes the first scrape of each name slow.
                let rendered = tokio::task::spawn_blocking(move || {
                    mapper.render(&crate::stats::reference_stats(&metrics))
                })
                .await;
                match rendered {
                    Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
                        .into_response(),
                    Err(_) => {
                        (StatusCode::INTERNAL_SERVER_ERROR, "the scrape failed\n").into_response()
                    }
                }
            }
        }),
    )
}

async fn healthcheck(State(s): State<AdminState>) -> Response {
    match s.health.check(&s.handles.readiness).await {
        Ok(None) => (StatusCode::OK, "OK\n").into_response(),
        Ok(Some(degraded)) => {
            (StatusCode::OK, format!("OK (degraded: {degraded})\n")).into_response()
        }
        Err(reason) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{reason}\n")).into_response(),
    }
}

async fn metrics(State(s): State<AdminState>) -> Response {
    let store = &s.handles.readiness.store;
    s.handles
        .metrics
        .circuit_open
        .store(u64::from(store.circuit_open()), Ordering::Relaxed);
    let text = s.handles.metrics.render_all(&Others {
        rlqs: s.quotas.metrics_snapshot(),
        candidate: s.candidate.as_ref().map(|c| c.metrics_snapshot()),
        limited: s
            .limited
            .as_ref()
            .map(|l| l.metrics_snapshot(&s.handles.rules())),
        admin_refused: s.access.refused(),
        admin_auth_failures: s.access.failures.total(),
        admin_auth_throttled: s.access.failures.throttled_total(),
        redis: store.events(),
        data: store.data_events(),
    });
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// What the candidate rules (`--candidate-rules`) would have refused.
async fn candidate_json(State(s): State<AdminState>) -> Response {
    match &s.candidate {
        Some(c) => (
            [(header::CONTENT_TYPE, "application/json")],
            c.to_json().to_string(),
        )
            .into_response(),
        None => no_candidate(),
    }
}

/// The candidate rules' last hour, plotted.
async fn candidate_report(State(s): State<AdminState>) -> Response {
    match &s.candidate {
        Some(c) => (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            c.report_html().to_string(),
        )
            .into_response(),
        None => no_candidate(),
    }
}

fn no_candidate() -> Response {
    (
        StatusCode::NOT_FOUND,
        "no candidate rules: start with --candidate-rules PATH\n",
    )
        .into_response()
}

/// The most buckets `/rlqs` lists unless `?limit=` says otherwise.
const RLQS_DEFAULT_LIMIT: usize = 1000;

/// The caller's address, as the admin listener recorded it.
type Caller = Option<axum::Extension<Peer>>;

/// The quota service's streams, buckets and current assignments (buckets
/// are named by clients' descriptors: closed with `--admin-reads token`).
async fn rlqs(
    State(s): State<AdminState>,
    caller: Caller,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    if let Some(refused) = s.access.may_read(&headers, caller.map(|c| c.0)) {
        return refused;
    }
    let asked = uri
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix("limit="));
    let limit = match asked.map(str::parse::<usize>) {
        None => RLQS_DEFAULT_LIMIT,
        Some(Ok(limit)) => limit,
        Some(Err(_)) => {
            return (StatusCode::BAD_REQUEST, "limit must be a whole number\n").into_response();
        }
    };
    (
        [(header::CONTENT_TYPE, "application/json")],
        s.quotas.to_json(limit).to_string(),
    )
        .into_response()
}

async fn rlconfig(State(s): State<AdminState>) -> Response {
    let rules = s.handles.rules().to_string();
    match s.health.rules_version() {
        Some(version) => format!(
            "# xDS version: {}\n{rules}",
            crate::rules::printable(&version)
        )
        .into_response(),
        None => rules.into_response(),
    }
}

/// `POST /json`: a decision, spending budget, with what is left: with
/// `--admin-reads token` it reveals a client's counters, so it needs a
/// token too.
async fn json(
    State(s): State<AdminState>,
    caller: Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = s.access.may_read(&headers, caller.map(|c| c.0)) {
        return refused;
    }
    // A cross-site page can send text/plain without a CORS preflight; it
    // cannot send application/json.
    if let Some(answer) = not_json(&s, &headers, "/json") {
        return answer;
    }
    let proto = match body::proto(&body) {
        // Read as gRPC reads the same text (`/counters` takes the escaped
        // form `/limited` shows, and does not).
        Ok(mut proto) => {
            crate::rls::as_sent(&mut proto);
            proto
        }
        Err(refused) => return refused.into_response(),
    };
    let request = match body::domain(&proto) {
        Ok(request) => request,
        Err(refused) => return refused.into_response(),
    };
    match s.handles.operations.decide(&request).await {
        Ok(decision) => {
            let code = if decision.over_limit {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            let response = crate::rls::to_proto(decision);
            (
                code,
                [(header::CONTENT_TYPE, "application/json")],
                json::response_to_json(&response).to_string(),
            )
                .into_response()
        }
        Err(e) => limit_error(e),
    }
}

/// The answer to a body not declared as JSON (which a cross-site page
/// could send without a preflight), `None` for a JSON body.
fn not_json(s: &AdminState, headers: &HeaderMap, what: &str) -> Option<Response> {
    if guard::is_json(headers) {
        return None;
    }
    s.access.count_refusal();
    Some(
        (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("POST {what} takes Content-Type: application/json\n"),
        )
            .into_response(),
    )
}

/// An inspect or reset whose descriptors meet no limit: nothing to show or
/// lift, which is not success (a ticket closed on `{"reset": 0}` leaves the
/// client refused). Says so, and where the descriptors to send are found.
fn no_limit(s: &AdminState, request: &crate::limiter::Request<'_>) -> Response {
    let rules = s.handles.rules();
    let domain = request.domain;
    let paths: Vec<&str> = rules
        .rules()
        .iter()
        .filter(|r| *r.domain == *domain && r.limit.is_some())
        .map(|r| r.path.as_str())
        .take(5)
        .collect();
    let descriptors: Vec<Vec<(&str, &str)>> = request
        .descriptors
        .iter()
        .map(|d| d.entries.to_vec())
        .collect();
    let known = if paths.is_empty() {
        format!(
            "domain '{}' has no rule with a limit",
            crate::rules::printable(domain)
        )
    } else {
        format!(
            "rules of domain '{}' with a limit include: {}",
            crate::rules::printable(domain),
            crate::rules::printable(&paths.join(", "))
        )
    };
    (
        StatusCode::NOT_FOUND,
        format!(
            "no rule limits these descriptors ({}); nothing was read or reset. {known}. \
             GET /limited?domain={} shows each refused client's descriptors as they must be sent\n",
            crate::rules::printable(&format!("{descriptors:?}")),
            crate::rules::printable(domain),
        ),
    )
        .into_response()
}

/// A request the limiter could not decide, as HTTP.
pub(super) fn limit_error(e: LimitError) -> Response {
    match e {
        LimitError::InvalidArgument(reason) => {
            (StatusCode::BAD_REQUEST, format!("{reason}\n")).into_response()
        }
        e @ LimitError::Unavailable(_) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response()
        }
    }
}

#[cfg(test)]
mod tests;
