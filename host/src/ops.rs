//! The operations HTTP server: health, readiness, metrics, a status page,
//! and the admin API for plugin swaps.
//!
//! | route | what |
//! |---|---|
//! | `GET /healthz` | 200 while the process runs |
//! | `GET /readyz` | 200 once every subscription has its plugin loaded, its first shard sync done and every reader it owns positioned; 503 before |
//! | `GET /metrics` | Prometheus text format |
//! | `GET /` | a small HTML status page: per subscription its plugin digest and mode, per shard its owner, checkpoint, lag and state, per lane its calls |
//! | `PUT /subscriptions/{name}/plugin` | swaps the subscription's plugin for the component in the body (admin) |
//! | `PUT /subscriptions/{name}/canary?key_fraction=F` | starts (or replaces) a canary: the component in the body handles a stable slice F of the keys (admin) |
//! | `POST /subscriptions/{name}/canary/promote` | the candidate becomes the plugin for every key (admin) |
//! | `POST /subscriptions/{name}/canary/rollback` | the candidate is dropped; every key goes back to the plugin (admin) |
//!
//! Write endpoints answer 200 with a JSON report
//! (`{"old","new","changed","live_after_ms"}`), 404 for an unknown
//! subscription, 409 for promote/rollback without a canary, 422 for a
//! component that cannot be used (the running versions stay).
//!
//! It listens on loopback by default (`[admin] listen`). Write endpoints
//! need `Authorization: Bearer <token>` with the token from `[admin] token`
//! or `SHARDLANE_ADMIN_TOKEN`; with no token configured they are off (403),
//! and a missing or wrong token gets 401. Neither changes anything.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::dispatch::routing::KeySlice;
use crate::swap::{CanaryError, PluginSlot};
use crate::telemetry::Telemetry;

/// Largest plugin accepted through the admin API (Python and JavaScript
/// components are 10–20 MB).
pub const MAX_PLUGIN_UPLOAD: usize = 64 << 20;

/// What the server serves.
pub struct OpsState {
    /// Metrics and status.
    pub telemetry: Arc<Telemetry>,
    /// Each subscription's plugin slot, by name.
    pub slots: BTreeMap<String, Arc<PluginSlot>>,
    /// The admin bearer token; `None`: write endpoints are off.
    pub token: Option<String>,
}

/// Serves until `shutdown`.
pub async fn serve(listener: TcpListener, state: Arc<OpsState>, shutdown: CancellationToken) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "admin listener: accept failed");
                    continue;
                }
            },
        };
        let state = state.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(route(&state, req).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "admin connection ended with an error");
            }
        });
        // Reap finished connections so the set stays small.
        while connections.try_join_next().is_some() {}
    }
    connections.abort_all();
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.into())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

async fn route(state: &OpsState, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    match (&method, path.as_str()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/readyz") => {
            if state.telemetry.ready() {
                text(StatusCode::OK, "ready\n")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
            }
        }
        (&Method::GET, "/metrics") => {
            let mut response = text(StatusCode::OK, state.telemetry.render());
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            response
        }
        (&Method::GET, "/") => {
            let mut response = text(StatusCode::OK, status_page(state));
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/html; charset=utf-8"),
            );
            response
        }
        (method, p) if p.starts_with("/subscriptions/") => {
            let rest = &p["/subscriptions/".len()..];
            let (name, action) = rest.split_once('/').unwrap_or((rest, ""));
            let query = req.uri().query().unwrap_or_default().to_owned();
            match (method, action) {
                (&Method::PUT, "plugin") => admin(state, name, req, Admin::Swap).await,
                (&Method::PUT, "canary") => match key_fraction(&query) {
                    Ok(slice) => admin(state, name, req, Admin::Canary(slice)).await,
                    Err(message) => text(StatusCode::BAD_REQUEST, message),
                },
                (&Method::POST, "canary/promote") => admin(state, name, req, Admin::Promote).await,
                (&Method::POST, "canary/rollback") => {
                    admin(state, name, req, Admin::Rollback).await
                }
                _ => text(StatusCode::NOT_FOUND, "not found\n"),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// A write through the admin API.
enum Admin {
    /// Swap the plugin for the body.
    Swap,
    /// Start a canary with the body on this slice.
    Canary(KeySlice),
    /// Promote the canary.
    Promote,
    /// Roll the canary back.
    Rollback,
}

/// The `key_fraction` query parameter of a canary start.
fn key_fraction(query: &str) -> Result<KeySlice, String> {
    let value = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("key_fraction="))
        .ok_or("key_fraction is required, e.g. ?key_fraction=0.1\n")?;
    value
        .parse::<f64>()
        .ok()
        .and_then(KeySlice::new)
        .ok_or_else(|| format!("key_fraction {value:?}: must be a number more than 0 (at least 0.000001), at most 1\n"))
}

/// The refusal of a write without the admin token; `None` when it carries
/// the token.
fn unauthorized(
    state: &OpsState,
    req: &Request<Incoming>,
    name: &str,
) -> Option<Response<Full<Bytes>>> {
    let Some(token) = &state.token else {
        return Some(text(
            StatusCode::FORBIDDEN,
            "admin writes are off: set [admin] token or SHARDLANE_ADMIN_TOKEN\n",
        ));
    };
    let presented = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if presented != Some(token.as_str()) {
        tracing::warn!(
            subscription = name,
            path = req.uri().path(),
            "admin: unauthenticated write refused"
        );
        return Some(text(
            StatusCode::UNAUTHORIZED,
            "a valid bearer token is required\n",
        ));
    }
    None
}

async fn admin(
    state: &OpsState,
    name: &str,
    req: Request<Incoming>,
    action: Admin,
) -> Response<Full<Bytes>> {
    if let Some(refused) = unauthorized(state, &req, name) {
        return refused;
    }
    let Some(slot) = state.slots.get(name) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("no subscription named {name:?}\n"),
        );
    };
    let upload = match action {
        Admin::Swap | Admin::Canary(_) => {
            match Limited::new(req.into_body(), MAX_PLUGIN_UPLOAD)
                .collect()
                .await
            {
                Ok(body) => body.to_bytes().to_vec(),
                Err(e) => {
                    return text(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!("cannot read the upload: {e}\n"),
                    );
                }
            }
        }
        Admin::Promote | Admin::Rollback => Vec::new(),
    };
    let done = match action {
        Admin::Swap => slot
            .swap(upload, "admin API")
            .await
            .map_err(CanaryError::from),
        Admin::Canary(slice) => slot.start_canary(upload, slice, "admin API").await,
        Admin::Promote => slot.promote("admin API").await,
        Admin::Rollback => slot.rollback("admin API").await,
    };
    match done {
        Ok(report) => text(
            StatusCode::OK,
            format!(
                "{{\"old\":\"{}\",\"new\":\"{}\",\"changed\":{},\"live_after_ms\":{}}}\n",
                report.old,
                report.new,
                report.changed,
                report.live_after.as_millis()
            ),
        ),
        Err(e @ CanaryError::NoCanary(_)) => text(StatusCode::CONFLICT, format!("{e}\n")),
        Err(CanaryError::Plugin(e)) => text(StatusCode::UNPROCESSABLE_ENTITY, format!("{e}\n")),
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn status_page(state: &OpsState) -> String {
    let mut html = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>shardlane</title>\
         <style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:.5em 0 1.5em}\
         td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}th{background:#f3f3f3}</style>\
         </head><body><h1>shardlane</h1>",
    );
    let _ = write!(
        html,
        "<p id=\"ready\">ready: {}</p>",
        state.telemetry.ready()
    );
    for (name, status) in state.telemetry.subscriptions() {
        let digest = status
            .digest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let _ = write!(
            html,
            "<section class=\"subscription\" data-name=\"{n}\"><h2>{n}</h2><p>plugin <code class=\"digest\">{}</code> · mode {}</p>",
            escape(&digest),
            escape(&status.mode),
            n = escape(&name)
        );
        if let Some(canary) = status
            .canary
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref()
        {
            let _ = write!(
                html,
                "<p class=\"canary\">canary <code>{}</code></p>",
                escape(canary)
            );
        }
        html.push_str("<table class=\"shards\"><tr><th>shard</th><th>owner</th><th>checkpoint</th><th>behind (ms)</th><th>state</th></tr>");
        for (shard, s) in status
            .shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = write!(
                html,
                "<tr class=\"shard\" data-shard=\"{sh}\"><td>{sh}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&s.owner),
                escape(&s.checkpoint),
                s.behind_ms.map(|m| m.to_string()).unwrap_or_default(),
                escape(&s.state),
                sh = escape(shard)
            );
        }
        html.push_str("</table><table class=\"lanes\"><tr><th>lane</th><th>calls</th></tr>");
        for (lane, calls) in status
            .lanes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = write!(
                html,
                "<tr class=\"lane\"><td>{lane}</td><td>{}</td></tr>",
                calls.get()
            );
        }
        html.push_str("</table></section>");
    }
    html.push_str("</body></html>");
    html
}
