//! The routes of the operations server, as an `axum` router per listener
//! (see [`super`] for what each answers): axum routes by method and path
//! (a known path with another method is 405, with `Allow`), percent-decodes
//! names in paths, and writes the JSON reports through serde; `tower-http`
//! bounds every request's time and refuses an upload whose declared length
//! is over the limit before reading it. The connection-level limits (head
//! timeout, connection cap and lifetime) stay in [`super::serve`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use super::limits::{BODY_READ_TIMEOUT, CONNECTION_LIFETIME, LogGate, capped};
use super::{LOG_INTERVAL, MAX_PLUGIN_UPLOAD, OpsState, Routes, status_page};
use crate::filter::FilterText;
use crate::fleet_versions::{CanaryRules, Command, VersionsError};
use crate::ids::SubscriptionName;
use crate::key_slice::KeySlice;
use crate::rollout::RolloutError;

/// Longest a read-only request may take: they answer from memory.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a write made during start-up waits for the subscriptions.
const STARTING_WAIT: Duration = Duration::from_secs(30);

/// What every handler shares.
#[derive(Clone)]
pub(super) struct Ctx {
    state: Arc<OpsState>,
    /// Refused writes, logged in summary.
    refusals: Arc<Mutex<LogGate>>,
}

/// The router of a listener serving `routes`.
pub(super) fn router(state: Arc<OpsState>, routes: Routes) -> Router {
    let ctx = Ctx {
        state,
        refusals: Arc::new(Mutex::new(LogGate::every(LOG_INTERVAL))),
    };
    let read = Router::new()
        .route("/healthz", get(|| async { text(StatusCode::OK, "ok\n") }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/", get(status))
        .route("/status.json", get(status_json))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            READ_TIMEOUT,
        ));
    let write = Router::new()
        .route("/subscriptions/{name}/plugin", put(swap))
        .route("/subscriptions/{name}/canary", put(canary))
        .route("/subscriptions/{name}/canary/promote", post(promote))
        .route("/subscriptions/{name}/canary/rollback", post(rollback))
        .route("/subscriptions/{name}/shadow", put(shadow))
        .route("/subscriptions/{name}/shadow/stop", post(shadow_stop))
        .route("/subscriptions/{name}/filter", put(filter))
        .route_layer(RequestBodyLimitLayer::new(MAX_PLUGIN_UPLOAD))
        // The token first (the outermost route layer): a caller without it
        // learns nothing about names, parameters or sizes.
        .route_layer(middleware::from_fn_with_state(ctx.clone(), authorize))
        // A swap compiles the plugin: bounded by a connection's lifetime.
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            CONNECTION_LIFETIME,
        ));
    let app = match routes {
        Routes::All => read.merge(write),
        Routes::Read => read,
        Routes::Write => write,
    };
    app.fallback(|| async { text(StatusCode::NOT_FOUND, "not found\n") })
        .with_state(ctx)
}

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    let mut response = (status, body.into()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// 200 `ready`, or 503 `not ready` and a line per subscription saying why.
async fn readyz(State(ctx): State<Ctx>) -> Response {
    let reasons = ctx.state.telemetry.not_ready();
    if reasons.is_empty() {
        text(StatusCode::OK, "ready\n")
    } else {
        let mut body = "not ready\n".to_owned();
        for reason in reasons {
            body.push_str(&reason);
            body.push('\n');
        }
        text(StatusCode::SERVICE_UNAVAILABLE, body)
    }
}

async fn metrics(State(ctx): State<Ctx>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        ctx.state.telemetry.render(),
    )
        .into_response()
}

async fn status(State(ctx): State<Ctx>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        status_page::page(&ctx.state),
    )
        .into_response()
}

async fn status_json(State(ctx): State<Ctx>) -> Response {
    axum::Json(status_page::snapshot(&ctx.state)).into_response()
}

/// Lets a write through only with the admin token; refusals are logged at
/// most once per [`LOG_INTERVAL`].
async fn authorize(State(ctx): State<Ctx>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let refused = match (&ctx.state.token, presented) {
        (None, _) => text(
            StatusCode::FORBIDDEN,
            "admin writes are off: set [admin] token or SHARDLANE_ADMIN_TOKEN\n",
        ),
        (Some(token), Some(presented)) if same_token(token, presented) => {
            return next.run(req).await;
        }
        (Some(_), _) => text(
            StatusCode::UNAUTHORIZED,
            "a valid bearer token is required\n",
        ),
    };
    let log = ctx
        .refusals
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
    refused
}

/// Whether `presented` is `token`, in time independent of both: their
/// SHA-256 digests (fixed length, so the token's length does not show)
/// compared in constant time.
pub(super) fn same_token(token: &str, presented: &str) -> bool {
    Sha256::digest(token.as_bytes())
        .ct_eq(&Sha256::digest(presented.as_bytes()))
        .into()
}

/// What a write reports (`{"old","new","changed","live_after_ms"}`).
#[derive(serde::Serialize)]
struct Report {
    old: String,
    new: String,
    changed: bool,
    live_after_ms: u128,
}

/// A write through the admin API.
enum Admin {
    Swap(Vec<u8>),
    Canary(Vec<u8>, KeySlice, CanaryRules),
    Promote,
    Rollback,
    Shadow(Vec<u8>),
    ShadowStop,
    /// The stable version's filter (`None`: none).
    Filter(Option<FilterText>),
}

/// `PUT …/filter`: the body is Lambda's `FilterCriteria` or a list of
/// patterns (`[]`: no filter), checked as at start-up; 422 with one line
/// naming the fault otherwise.
async fn filter(State(ctx): State<Ctx>, Path(name): Path<String>, body: Body) -> Response {
    let body = match read_upload(body).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    match crate::filter::criteria_filter(&body) {
        Ok(filter) => write(&ctx, &name, Admin::Filter(filter)).await,
        Err(e) => text(StatusCode::UNPROCESSABLE_ENTITY, format!("filter: {e}\n")),
    }
}

async fn shadow(State(ctx): State<Ctx>, Path(name): Path<String>, body: Body) -> Response {
    match read_upload(body).await {
        Ok(upload) => write(&ctx, &name, Admin::Shadow(upload)).await,
        Err(refused) => refused,
    }
}

async fn shadow_stop(State(ctx): State<Ctx>, Path(name): Path<String>) -> Response {
    write(&ctx, &name, Admin::ShadowStop).await
}

async fn swap(State(ctx): State<Ctx>, Path(name): Path<String>, body: Body) -> Response {
    match read_upload(body).await {
        Ok(upload) => write(&ctx, &name, Admin::Swap(upload)).await,
        Err(refused) => refused,
    }
}

async fn canary(
    State(ctx): State<Ctx>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    body: Body,
) -> Response {
    let query = query.as_deref().unwrap_or_default();
    let slice = match key_fraction(query) {
        Ok(slice) => slice,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let rules = match canary_rules(query) {
        Ok(rules) => rules,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    match read_upload(body).await {
        Ok(upload) => write(&ctx, &name, Admin::Canary(upload, slice, rules)).await,
        Err(refused) => refused,
    }
}

async fn promote(State(ctx): State<Ctx>, Path(name): Path<String>) -> Response {
    write(&ctx, &name, Admin::Promote).await
}

async fn rollback(State(ctx): State<Ctx>, Path(name): Path<String>) -> Response {
    write(&ctx, &name, Admin::Rollback).await
}

async fn write(ctx: &Ctx, name: &str, action: Admin) -> Response {
    // During start-up (the listeners come first) a write waits for the
    // subscriptions to be made.
    let mut made = ctx.state.rollouts.clone();
    let rollouts = match tokio::time::timeout(STARTING_WAIT, made.wait_for(Option::is_some)).await {
        Ok(Ok(made)) => made.clone().unwrap_or_default(),
        _ => {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "starting: the subscriptions do not run yet\n",
            );
        }
    };
    let Some(rollout) = rollouts.get(&SubscriptionName::from(name)) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("no subscription named {:?}\n", capped(name)),
        );
    };
    // Every write changes the fleet's versions in the lease store, so
    // whichever instance answers, every instance sharing the store follows.
    let started = Instant::now();
    // A filter write reports filters; any other, plugin versions.
    let filter_write = matches!(action, Admin::Filter(_));
    let old = if filter_write {
        rollout.filter_in_force()
    } else {
        rollout.running()
    };
    let done = match action {
        Admin::Swap(upload) => rollout.deploy(upload, None, "admin API").await,
        Admin::Canary(upload, slice, rules) => {
            rollout
                .deploy(upload, Some((slice, rules)), "admin API")
                .await
        }
        Admin::Promote => rollout.change(Command::Promote, "admin API").await,
        Admin::Rollback => rollout.change(Command::DropCanary, "admin API").await,
        Admin::Shadow(upload) => rollout.deploy_shadow(upload, "admin API").await,
        Admin::ShadowStop => rollout.change(Command::EndShadow, "admin API").await,
        Admin::Filter(filter) => rollout.deploy_filter(filter, "admin API").await,
    };
    let report = |new: String| {
        axum::Json(Report {
            changed: new != old,
            old: old.clone(),
            new,
            live_after_ms: started.elapsed().as_millis(),
        })
        .into_response()
    };
    match done {
        Ok(versions) if filter_write => {
            report(crate::filter::filter_name(versions.filter.as_ref()))
        }
        Ok(versions) => {
            // A canary reports its candidate; anything else the stable version.
            let new = versions
                .canary
                .as_ref()
                .map(|c| c.candidate.to_string())
                .or_else(|| versions.stable.as_ref().map(ToString::to_string))
                .unwrap_or_default();
            report(new)
        }
        Err(RolloutError::Refused(VersionsError::Unchanged(_))) => report(old.clone()),
        Err(e @ (RolloutError::Refused(_) | RolloutError::NoStore)) => {
            text(StatusCode::CONFLICT, format!("{e}\n"))
        }
        Err(e @ RolloutError::Plugin(_)) => {
            text(StatusCode::UNPROCESSABLE_ENTITY, format!("{e}\n"))
        }
        Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
    }
}

/// A canary start's rules from its query: `failure_rate` (with
/// `min_records`, default 100) and `promote_after` (a duration); none set,
/// a person decides.
fn canary_rules(query: &str) -> Result<CanaryRules, String> {
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
    };
    let mut rules = CanaryRules {
        min_records: crate::config::defaults::CANARY_MIN_RECORDS,
        ..CanaryRules::default()
    };
    if let Some(rate) = param("failure_rate") {
        match rate.parse::<f64>() {
            Ok(rate) if (0.0..1.0).contains(&rate) => rules.rollback_failure_rate = Some(rate),
            _ => {
                return Err(format!(
                    "failure_rate {:?}: must be a number from 0 to less than 1\n",
                    capped(rate)
                ));
            }
        }
    }
    if let Some(n) = param("min_records") {
        rules.min_records = n.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
            format!(
                "min_records {:?}: must be a whole number above 0\n",
                capped(n)
            )
        })?;
    }
    if let Some(after) = param("promote_after") {
        let after = humantime::parse_duration(after).map_err(|_| {
            format!(
                "promote_after {:?}: must be a duration, e.g. 10m\n",
                capped(after)
            )
        })?;
        rules.promote_after_ms = Some(after.as_millis() as u64);
    }
    Ok(rules)
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

/// The body of an upload: 413 over [`MAX_PLUGIN_UPLOAD`] (a declared
/// length over it never gets here: [`RequestBodyLimitLayer`]), 408 when it
/// takes longer than [`BODY_READ_TIMEOUT`], 400 when it is malformed (a bad
/// chunked encoding) or cut short.
async fn read_upload(body: Body) -> Result<Vec<u8>, Response> {
    let body = Limited::new(body, MAX_PLUGIN_UPLOAD).collect();
    match tokio::time::timeout(BODY_READ_TIMEOUT, body).await {
        Ok(Ok(body)) => Ok(body.to_bytes().to_vec()),
        Ok(Err(e)) if is_over_limit(&*e) => Err(text(
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

/// True when a body error is (or wraps) a length limit.
fn is_over_limit(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.downcast_ref::<LengthLimitError>().is_some() {
            return true;
        }
        next = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a canary started through the admin API without the rules
    /// its query names (it would never decide), or a bad rule accepted.
    #[test]
    fn a_canary_query_carries_its_rules() {
        let rules =
            canary_rules("key_fraction=0.1&failure_rate=0.05&min_records=500&promote_after=10m")
                .unwrap();
        assert_eq!(rules.rollback_failure_rate, Some(0.05));
        assert_eq!(rules.min_records, 500);
        assert_eq!(rules.promote_after_ms, Some(600_000));
        let none = canary_rules("key_fraction=0.1").unwrap();
        assert_eq!(
            (none.rollback_failure_rate, none.promote_after_ms),
            (None, None)
        );
        for bad in ["failure_rate=1.5", "min_records=0", "promote_after=soon"] {
            assert!(canary_rules(bad).is_err(), "{bad}");
        }
    }
}
