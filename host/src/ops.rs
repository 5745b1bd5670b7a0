//! The operations HTTP server: health, readiness, metrics, a status page,
//! and the admin API for plugin swaps.
//!
//! | route | what |
//! |---|---|
//! | `GET /healthz` | 200 while the process runs |
//! | `GET /readyz` | 200 once every subscription has its plugin loaded, its first shard sync done and every reader it owns positioned; 503 before |
//! | `GET /metrics` | Prometheus text format (0.0.4), rendered by `prometheus-client` ([`crate::telemetry`]) |
//! | `GET /` | a live HTML status page ([`status_page`]): per subscription its plugin digest, mode and calls per second; per plugin version (stable and canary candidate) its records per second and outcomes; per shard its owner, checkpoint, lag, records per second and state; per lane its calls per second; the latest lease owner changes. Charts of the last 5 minutes |
//! | `GET /status.json` | what the page shows, as JSON: the page polls it every 2 s |
//! | `PUT /subscriptions/{name}/plugin` | swaps the subscription's plugin for the component in the body (admin) |
//! | `PUT /subscriptions/{name}/canary?key_fraction=F` | starts (or replaces) a canary: the component in the body handles a stable slice F of the keys (admin) |
//! | `POST /subscriptions/{name}/canary/promote` | the candidate becomes the plugin for every key (admin) |
//! | `POST /subscriptions/{name}/canary/rollback` | the candidate is dropped; every key goes back to the plugin (admin) |
//! | `PUT /subscriptions/{name}/shadow`, `POST …/shadow/stop` | starts (or replaces), or stops, a shadow candidate (admin) |
//! | `PUT /subscriptions/{name}/filter` | sets the stable version's filter: Lambda's `FilterCriteria` or a list of patterns in the body, `[]` for none; reports filter digests (admin) |
//!
//! Write endpoints answer 200 with a JSON report
//! (`{"old","new","changed","live_after_ms"}`), 404 for an unknown
//! subscription, 409 for promote/rollback without a canary, 422 for a
//! component or filter that cannot be used (the running versions stay). A known path
//! with the wrong method is 405 (with `Allow`), any other path 404.
//!
//! Routing, handlers and per-request bounds are an `axum` router with
//! `tower-http` layers ([`routes`]): read-only requests get 10 s, writes a
//! connection's lifetime; an upload whose declared length is over the
//! limit is refused before it is read. This module owns the connections:
//! hyper's HTTP/1 server with the limits below, each connection serving
//! the router; at shutdown it stops accepting and drains the requests
//! under way for up to 5 s.
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
//! keep-alive idle bound), an upload within [`BODY_READ_TIMEOUT`](limits::BODY_READ_TIMEOUT) (else
//! 408; a body over [`MAX_PLUGIN_UPLOAD`] is 413, a malformed one 400), a
//! connection lives at most [`CONNECTION_LIFETIME`], and at most
//! [`MAX_CONNECTIONS`] are open at once (one more is answered 503 and
//! closed). When accept fails (at the file-descriptor limit it fails at
//! once, every time) the loop backs off from 10 ms to 1 s. Refused writes,
//! connections over the cap and accept failures are each logged at most
//! once per [`LOG_INTERVAL`], with the number left out, and request paths
//! and names in those lines are cut to [`MAX_LOGGED`](limits::MAX_LOGGED) bytes.
//!
//! Floor 10 (wiring) of the crate's layers (see "Layers" in the crate
//! docs): imports only its own floor and those below.

mod limits;
mod routes;
mod status_page;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use limits::CONNECTION_LIFETIME;
use limits::{AcceptBackoff, LogGate};
pub use limits::{HEADER_READ_TIMEOUT, LOG_INTERVAL, MAX_CONNECTIONS};

use crate::ids::SubscriptionName;
use crate::rollout::Rollout;
use crate::telemetry::Telemetry;

/// Largest plugin accepted through the admin API (Python and JavaScript
/// components are 10–20 MB).
pub(crate) const MAX_PLUGIN_UPLOAD: usize = 64 << 20;

/// Longest shutdown waits for the requests under way to finish.
const DRAIN: Duration = Duration::from_secs(5);

/// Each subscription's rollout stage, by name.
pub(crate) type Rollouts = Arc<BTreeMap<SubscriptionName, Arc<Rollout>>>;

/// What the server serves.
pub(crate) struct OpsState {
    /// Metrics and status.
    pub telemetry: Arc<Telemetry>,
    /// Each subscription's rollout stage (which changes the fleet's
    /// versions), by name; `None` until start-up has made them (a write
    /// that comes before waits for them, up to its time limit).
    pub rollouts: tokio::sync::watch::Receiver<Option<Rollouts>>,
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

/// Serves `routes` until `shutdown`, within the [limits](self#limits);
/// then stops accepting, lets the connections under way finish their
/// requests for up to [`DRAIN`], and closes them.
pub(crate) async fn serve(
    listener: TcpListener,
    state: Arc<OpsState>,
    routes: Routes,
    shutdown: CancellationToken,
) {
    let app = routes::router(state, routes);
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
        let service = TowerToHyperService::new(app.clone());
        connections.spawn(connection(
            http.clone(),
            service,
            stream,
            shutdown.clone(),
            slot,
        ));
    }
    let drained = tokio::time::timeout(DRAIN, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        connections.abort_all();
    }
}

/// Serves one connection, holding its `slot` under the cap, for at most
/// [`CONNECTION_LIFETIME`]; at `shutdown` it finishes the request under
/// way and takes no more.
async fn connection(
    http: http1::Builder,
    service: TowerToHyperService<axum::Router>,
    stream: TcpStream,
    shutdown: CancellationToken,
    slot: tokio::sync::OwnedSemaphorePermit,
) {
    let _slot = slot;
    let connection = http.serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    let served = tokio::time::timeout(CONNECTION_LIFETIME, async {
        tokio::select! {
            served = connection.as_mut() => served,
            () = shutdown.cancelled() => {
                // Finish the request under way, take no more.
                connection.as_mut().graceful_shutdown();
                connection.as_mut().await
            }
        }
    })
    .await;
    match served {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "admin connection ended with an error"),
        Err(_) => {
            tracing::debug!(lifetime = ?CONNECTION_LIFETIME, "admin connection closed: open too long")
        }
    }
}

/// Answers a connection over [`MAX_CONNECTIONS`] 503 if its socket takes
/// the few bytes at once (it never waits), then closes it (on drop).
fn refuse_over_cap(stream: &TcpStream) {
    const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 26\r\nconnection: close\r\n\r\ntoo many admin connections";
    let _ = stream.try_write(BUSY);
}

#[cfg(test)]
mod tests {
    use super::routes::same_token;

    #[test]
    fn the_token_matches_only_itself_whatever_the_length() {
        assert!(same_token("s3cret", "s3cret"));
        for wrong in ["", "s3cre", "s3creT", "s3cret ", "s3cret-and-more"] {
            assert!(!same_token("s3cret", wrong), "{wrong:?}");
        }
    }
}
