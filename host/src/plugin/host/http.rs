//! `wasi:http/outgoing-handler`, gated: a request leaves only for a
//! destination the subscription's `http.allow` lists, within its timeouts,
//! and its response body is cut at `http.max_response`.
//!
//! The standard implementation (`wasmtime-wasi-http`, TLS by rustls with
//! the webpki roots) sends the request; the gate is its `send_request`
//! hook:
//! - the destination is the request's host (lower case, IPv6 without
//!   brackets) and port (80 for `http`, 443 for `https` when the URL has
//!   none), compared with each allowed `host:port`; anything else fails
//!   with `error-code.HTTP-request-denied` (so does any method but GET,
//!   HEAD and OPTIONS from a shadow candidate), which the guest sees as the
//!   request's result, and counts as `denied`;
//! - connecting, the first response byte and each gap between body bytes
//!   are each bounded by `http.timeout` and by the time left in the call
//!   (its `handler_timeout`), whichever is shorter — a request never
//!   outlives the call that made it, and a call cut short drops its store
//!   and with it every request under way;
//! - the response body fails with `error-code.HTTP-response-body-size`
//!   once more than `http.max_response` bytes arrived.
//!
//! `shardlane_http_requests_total{outcome}` counts requests: `ok` (a
//! response arrived), `denied`, `failed` (connect, TLS, timeout, protocol).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;
use hyper::body::Bytes;
use tokio::time::Instant;
use wasmtime_wasi_http::{
    Error, RequestOptions, WasiBody, WasiHttpCtxView, WasiHttpHooks, WasiHttpView,
};

use super::HostState;
use crate::config::HttpGrant;
use crate::telemetry::{Counter, Telemetry};

/// The request counters of one subscription, by outcome.
#[derive(Clone, Debug, Default)]
pub(crate) struct HttpMetrics {
    ok: Counter,
    denied: Counter,
    failed: Counter,
}

impl HttpMetrics {
    /// The counters of `subscription`, registered once per plugin.
    pub(crate) fn new(telemetry: &Telemetry, subscription: &str) -> Self {
        let counter = |outcome| {
            telemetry.counter(
                "shardlane_http_requests_total",
                "Outbound HTTP requests of plugins, by outcome (ok: a response arrived; denied: destination not in http.allow; failed: connect, TLS, timeout or protocol error).",
                &[("subscription", subscription), ("outcome", outcome)],
            )
        };
        Self {
            ok: counter("ok"),
            denied: counter("denied"),
            failed: counter("failed"),
        }
    }
}

/// The `send_request` hook of one store (module docs).
pub(super) struct HttpGate {
    grant: Option<HttpGrant>,
    /// When the call under way must end.
    deadline: Option<Instant>,
    metrics: HttpMetrics,
}

type Sent = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), Error>> + Send>,
                ),
                Error,
            >,
        > + Send,
>;

impl HttpGate {
    pub(super) fn new(grant: Option<HttpGrant>, metrics: HttpMetrics) -> Self {
        Self {
            grant,
            deadline: None,
            metrics,
        }
    }

    pub(super) fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }

    /// Whether the request's destination is allowed.
    fn allows(&self, grant: &HttpGrant, uri: &http::Uri) -> bool {
        let Some(host) = uri.host() else {
            return false;
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
            Some("https") => 443,
            _ => 80,
        });
        grant
            .allow
            .iter()
            .any(|d| d.port == port && d.host.eq_ignore_ascii_case(host))
    }
}

/// `option` bounded by `cap`.
fn bounded(option: Option<Duration>, cap: Duration) -> Option<Duration> {
    Some(option.map_or(cap, |t| t.min(cap)))
}

impl WasiHttpHooks for HttpGate {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> Sent {
        let safe = |m: &http::Method| {
            matches!(
                *m,
                http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
            )
        };
        let grant = match &self.grant {
            Some(grant)
                if self.allows(grant, request.uri())
                    && (!grant.safe_methods_only || safe(request.method())) =>
            {
                grant.clone()
            }
            _ => {
                self.metrics.denied.inc();
                tracing::debug!(uri = %request.uri(), "outbound HTTP request denied: destination not in http.allow");
                return Box::new(async { Err(Error::HttpRequestDenied) });
            }
        };
        let left = self.deadline.map_or(grant.timeout, |d| {
            d.saturating_duration_since(Instant::now())
        });
        let cap = grant.timeout.min(left);
        let options = options.unwrap_or_default();
        let options = RequestOptions {
            connect_timeout: bounded(options.connect_timeout, cap),
            first_byte_timeout: bounded(options.first_byte_timeout, cap),
            between_bytes_timeout: bounded(options.between_bytes_timeout, cap),
        };
        let metrics = self.metrics.clone();
        let max = grant.max_response;
        Box::new(async move {
            match wasmtime_wasi_http::default_send_request(request, Some(options)).await {
                Ok((response, io)) => {
                    metrics.ok.inc();
                    let response = response.map(|body| {
                        Capped {
                            body: body.boxed_unsync(),
                            left: max,
                            max,
                        }
                        .boxed_unsync()
                    });
                    Ok((
                        response,
                        Box::new(io) as Box<dyn Future<Output = Result<(), Error>> + Send>,
                    ))
                }
                Err(e) => {
                    metrics.failed.inc();
                    Err(e)
                }
            }
        })
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_gate,
        }
    }
}

/// A response body that fails once more than `max` bytes arrived.
struct Capped<B> {
    body: B,
    left: u64,
    max: u64,
}

impl<B: Body<Data = Bytes, Error = Error> + Unpin> Body for Capped<B> {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let frame = match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        if let Some(data) = frame.data_ref() {
            let len = data.len() as u64;
            if len > self.left {
                self.left = 0;
                return Poll::Ready(Some(Err(Error::HttpResponseBodySize(Some(self.max)))));
            }
            self.left -= len;
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
