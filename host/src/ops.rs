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
//! # Listeners
//! Everything is served on `[admin] listen` (loopback by default). With
//! `[metrics] listen` set, the read-only routes (health, readiness,
//! metrics, status page) move there and `[admin] listen` serves only the
//! write routes, so a scraper or a load balancer's probes can be given one
//! without the other: each listener answers 404 to the other's routes.
//!
//! # Writes
//! Write endpoints
//! need `Authorization: Bearer <token>` with the token from `[admin] token`
//! or `SHARDLANE_ADMIN_TOKEN`; with no token configured they are off (403),
//! and a missing or wrong token gets 401. Neither changes anything. The
//! token is checked before anything else about a write (its subscription,
//! its parameters, its body), and compared in constant time. Subscription
//! names in paths are percent-decoded (`/subscriptions/my%2Dsub/plugin`).
//!
//! # Limits
//!
//! A caller without the token must not be able to take `/healthz` down, so
//! every connection is bounded (each limit's constant says why): a
//! request head must arrive within [`HEADER_READ_TIMEOUT`] (also the
//! keep-alive idle bound), an upload within [`BODY_READ_TIMEOUT`] (else
//! 408; a body over [`MAX_PLUGIN_UPLOAD`] is 413, a malformed one 400), a
//! connection lives at most [`CONNECTION_LIFETIME`], and at most
//! [`MAX_CONNECTIONS`] are open at once (one more is answered 503 and
//! closed). When accept fails (at the file-descriptor limit it fails at
//! once, every time) the loop backs off from 10 ms to 1 s. Refused writes,
//! connections over the cap and accept failures are each logged at most
//! once per [`LOG_INTERVAL`], with the number left out, and request paths
//! and names in those lines are cut to [`MAX_LOGGED`](limits::MAX_LOGGED) bytes.

mod limits;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use limits::{AcceptBackoff, LogGate, capped};
use limits::{BODY_READ_TIMEOUT, CONNECTION_LIFETIME};
pub use limits::{HEADER_READ_TIMEOUT, LOG_INTERVAL, MAX_CONNECTIONS};

use crate::ids::{OwnerId, SubscriptionName};
use crate::swap::{CanaryError, KeySlice, PluginSlot};
use crate::telemetry::Telemetry;

/// Largest plugin accepted through the admin API (Python and JavaScript
/// components are 10–20 MB).
pub(crate) const MAX_PLUGIN_UPLOAD: usize = 64 << 20;

/// What the server serves.
pub(crate) struct OpsState {
    /// Metrics and status.
    pub telemetry: Arc<Telemetry>,
    /// Each subscription's plugin slot, by name.
    pub slots: BTreeMap<SubscriptionName, Arc<PluginSlot>>,
    /// The admin bearer token; `None`: write endpoints are off.
    pub token: Option<String>,
}

/// Which routes a listener serves (see [Listeners](self#listeners)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Routes {
    /// Every route: one listener.
    All,
    /// Health, readiness, metrics and the status page.
    Read,
    /// The admin API's writes.
    Write,
}

impl Routes {
    /// The routes, as the start-up log line lists them.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Routes::All => {
                "/healthz /readyz /metrics / (status page), writes under /subscriptions/"
            }
            Routes::Read => "/healthz /readyz /metrics / (status page)",
            Routes::Write => "writes under /subscriptions/",
        }
    }
}

/// Serves `routes` until `shutdown`, within the [limits](self#limits).
pub(crate) async fn serve(
    listener: TcpListener,
    state: Arc<OpsState>,
    routes: Routes,
    shutdown: CancellationToken,
) {
    // Shared by the connections; a std Mutex, held only for one `note`
    // and never across an `.await`.
    let refusals = Arc::new(Mutex::new(LogGate::every(LOG_INTERVAL)));
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut over_cap = LogGate::every(LOG_INTERVAL);
    let mut backoff = AcceptBackoff::default();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff.succeeded();
                stream
            }
            Err(e) => {
                let (pause, log) = backoff.failed(Instant::now());
                if let Some(suppressed) = log {
                    tracing::warn!(error = %e, suppressed, retry_in = ?pause, "admin listener: accept failed; backing off");
                }
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    () = tokio::time::sleep(pause) => continue,
                }
            }
        };
        // Reap finished connections so the set stays small.
        while connections.try_join_next().is_some() {}
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refuse_over_cap(&stream);
            if let Some(suppressed) = over_cap.note(Instant::now()) {
                tracing::warn!(
                    max_connections = MAX_CONNECTIONS,
                    suppressed,
                    "admin: connection over the cap refused"
                );
            }
            continue;
        };
        let (state, refusals, http) = (state.clone(), refusals.clone(), http.clone());
        connections.spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req| {
                let (state, refusals) = (state.clone(), refusals.clone());
                async move { Ok::<_, Infallible>(route(&state, &refusals, routes, req).await) }
            });
            let connection = http.serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_LIFETIME, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(error = %e, "admin connection ended with an error"),
                Err(_) => tracing::debug!(lifetime = ?CONNECTION_LIFETIME, "admin connection closed: open too long"),
            }
        });
    }
    connections.abort_all();
}

/// Answers a connection over [`MAX_CONNECTIONS`] 503 if its socket takes
/// the few bytes at once (it never waits), then closes it (on drop).
fn refuse_over_cap(stream: &TcpStream) {
    const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 26\r\nconnection: close\r\n\r\ntoo many admin connections";
    let _ = stream.try_write(BUSY);
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

async fn route(
    state: &OpsState,
    refusals: &Mutex<LogGate>,
    routes: Routes,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let writes = path.starts_with("/subscriptions/");
    match (routes, writes) {
        (Routes::Read, true) | (Routes::Write, false) => {
            return text(StatusCode::NOT_FOUND, "not found\n");
        }
        _ => {}
    }
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
            let write = match (method, action) {
                (&Method::PUT, "plugin") => Write::Swap,
                (&Method::PUT, "canary") => Write::Canary,
                (&Method::POST, "canary/promote") => Write::Promote,
                (&Method::POST, "canary/rollback") => Write::Rollback,
                _ => return text(StatusCode::NOT_FOUND, "not found\n"),
            };
            // The token first: a caller without it learns nothing about
            // names or parameters.
            if let Some(refused) = unauthorized(state, refusals, &req) {
                return refused;
            }
            let Ok(name) = percent_encoding::percent_decode_str(name).decode_utf8() else {
                return text(
                    StatusCode::BAD_REQUEST,
                    "the subscription name is not UTF-8 once percent-decoded\n",
                );
            };
            let action = match write {
                Write::Swap => Admin::Swap,
                Write::Canary => match key_fraction(req.uri().query().unwrap_or_default()) {
                    Ok(slice) => Admin::Canary(slice),
                    Err(message) => return text(StatusCode::BAD_REQUEST, message),
                },
                Write::Promote => Admin::Promote,
                Write::Rollback => Admin::Rollback,
            };
            admin(state, &name, req, action).await
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// A write route, before its parameters are read.
enum Write {
    Swap,
    Canary,
    Promote,
    Rollback,
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
        .ok_or_else(|| {
            format!(
                "key_fraction {:?}: must be a number more than 0 (at least 0.000001), at most 1\n",
                capped(value)
            )
        })
}

/// The refusal of a write without the admin token; `None` when it carries
/// the token. Refusals are logged at most once per [`LOG_INTERVAL`].
fn unauthorized(
    state: &OpsState,
    refusals: &Mutex<LogGate>,
    req: &Request<Incoming>,
) -> Option<Response<Full<Bytes>>> {
    let presented = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let refused = match (&state.token, presented) {
        (None, _) => text(
            StatusCode::FORBIDDEN,
            "admin writes are off: set [admin] token or SHARDLANE_ADMIN_TOKEN\n",
        ),
        (Some(token), Some(presented)) if same_token(token, presented) => return None,
        (Some(_), _) => text(
            StatusCode::UNAUTHORIZED,
            "a valid bearer token is required\n",
        ),
    };
    let log = refusals
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .note(Instant::now());
    if let Some(suppressed) = log {
        tracing::warn!(
            status = refused.status().as_u16(),
            path = %capped(req.uri().path()),
            suppressed,
            "admin: write refused"
        );
    }
    Some(refused)
}

/// Whether `presented` is `token`, in time independent of both: their
/// SHA-256 digests (fixed length, so the token's length does not show)
/// compared in constant time.
fn same_token(token: &str, presented: &str) -> bool {
    Sha256::digest(token.as_bytes())
        .ct_eq(&Sha256::digest(presented.as_bytes()))
        .into()
}

async fn admin(
    state: &OpsState,
    name: &str,
    req: Request<Incoming>,
    action: Admin,
) -> Response<Full<Bytes>> {
    let Some(slot) = state.slots.get(&SubscriptionName::from(name)) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("no subscription named {:?}\n", capped(name)),
        );
    };
    let upload = match action {
        Admin::Swap | Admin::Canary(_) => match read_upload(req).await {
            Ok(upload) => upload,
            Err(refused) => return refused,
        },
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

/// The body of an upload: 413 over [`MAX_PLUGIN_UPLOAD`], 408 when it
/// takes longer than [`BODY_READ_TIMEOUT`], 400 when it is malformed (a bad
/// chunked encoding) or cut short.
async fn read_upload(req: Request<Incoming>) -> Result<Vec<u8>, Response<Full<Bytes>>> {
    let body = Limited::new(req.into_body(), MAX_PLUGIN_UPLOAD).collect();
    match tokio::time::timeout(BODY_READ_TIMEOUT, body).await {
        Ok(Ok(body)) => Ok(body.to_bytes().to_vec()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the upload is over {MAX_PLUGIN_UPLOAD} bytes\n"),
        )),
        Ok(Err(e)) => Err(text(
            StatusCode::BAD_REQUEST,
            format!("cannot read the upload: {e}\n"),
        )),
        Err(_) => Err(text(
            StatusCode::REQUEST_TIMEOUT,
            format!("the upload took longer than {BODY_READ_TIMEOUT:?}\n"),
        )),
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
        let _ = write!(
            html,
            "<section class=\"subscription\" data-name=\"{n}\"><h2>{n}</h2><p>plugin <code class=\"digest\">{}</code> · mode {}</p>",
            escape(&status.digest()),
            escape(status.mode()),
            n = escape(name.as_str())
        );
        if let Some(canary) = status.canary() {
            let _ = write!(
                html,
                "<p class=\"canary\">canary <code>{}</code></p>",
                escape(&canary)
            );
        }
        html.push_str("<table class=\"shards\"><tr><th>shard</th><th>owner</th><th>checkpoint</th><th>behind (ms)</th><th>state</th></tr>");
        for (shard, s) in status.shards() {
            let _ = write!(
                html,
                "<tr class=\"shard\" data-shard=\"{sh}\"><td>{sh}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(s.owner.as_ref().map_or("", OwnerId::as_str)),
                escape(
                    &s.checkpoint
                        .as_ref()
                        .map_or(String::new(), ToString::to_string)
                ),
                s.behind_ms.map(|m| m.to_string()).unwrap_or_default(),
                s.state,
                sh = escape(shard.as_str())
            );
        }
        html.push_str("</table><table class=\"lanes\"><tr><th>lane</th><th>calls</th></tr>");
        for (lane, calls) in status.lanes() {
            let _ = write!(
                html,
                "<tr class=\"lane\"><td>{lane}</td><td>{calls}</td></tr>"
            );
        }
        html.push_str("</table></section>");
    }
    html.push_str("</body></html>");
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_matches_only_itself_whatever_the_length() {
        assert!(same_token("s3cret", "s3cret"));
        for wrong in ["", "s3cre", "s3creT", "s3cret ", "s3cret-and-more"] {
            assert!(!same_token("s3cret", wrong), "{wrong:?}");
        }
    }
}
