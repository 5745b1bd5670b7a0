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

use crate::swap::PluginSlot;
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
    match (req.method(), path.as_str()) {
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
        (&Method::PUT, p) if p.starts_with("/subscriptions/") && p.ends_with("/plugin") => {
            let name = &p["/subscriptions/".len()..p.len() - "/plugin".len()];
            put_plugin(state, name.to_owned(), req).await
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

async fn put_plugin(
    state: &OpsState,
    name: String,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let Some(token) = &state.token else {
        return text(
            StatusCode::FORBIDDEN,
            "admin writes are off: set [admin] token or SHARDLANE_ADMIN_TOKEN\n",
        );
    };
    let presented = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if presented != Some(token.as_str()) {
        tracing::warn!(
            subscription = name,
            "admin: unauthenticated plugin upload refused"
        );
        return text(
            StatusCode::UNAUTHORIZED,
            "a valid bearer token is required\n",
        );
    }
    let Some(slot) = state.slots.get(&name) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("no subscription named {name:?}\n"),
        );
    };
    let body = match Limited::new(req.into_body(), MAX_PLUGIN_UPLOAD)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(e) => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("cannot read the upload: {e}\n"),
            );
        }
    };
    match slot.swap(body.to_vec(), "admin API").await {
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
        Err(e) => text(StatusCode::UNPROCESSABLE_ENTITY, format!("{e}\n")),
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
