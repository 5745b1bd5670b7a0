//! Test plugin, contract `shardlane:plugin@0.2.0`: logs `handled data=<data>
//! attempt=<n>` for every call, then, by the record's data:
//! - `retry-once:<x>`: publishes `discarded:<x>`, and on attempt 1 asks to
//!   retry (so that output must never appear); on attempt 2 publishes
//!   `<x>` and acks;
//! - `reject:<x>`: publishes `rejected:<x>` and rejects;
//! - `get:<url>`: GETs `<url>` over wasi:http and publishes what came back
//!   (`status=<n> bytes=<n>`, or `error=<code>`), then acks;
//! - `post:<url>`: the same with a POST (no body);
//! - anything else: publishes `<prefix><data>` and acks, where `<prefix>`
//!   is config `prefix`, or `unset:` when that key is not set.
//!
//! Outputs go to the stream named by config `out_stream`, with the input's
//! partition key; a refused publish is logged as `publish refused: ...`.

wit_bindgen::generate!({
    world: "shardlane:plugin/record-handler@0.2.0",
    path: "../../../wit/v0.2.0",
    generate_all,
});

use shardlane::plugin::log::{Level, log};
use shardlane::plugin::outputs::publish;
use wasi::config::store;
use wasi::http::outgoing_handler;
use wasi::http::types::{Fields, Method, OutgoingRequest, Scheme};

struct Publisher;

fn config(key: &str) -> Option<String> {
    store::get(key).ok().flatten()
}

fn out(record: &KinesisRecord, data: &str) {
    let stream = config("out_stream").unwrap_or_default();
    if let Err(e) = publish(0, &stream, &record.partition_key, data.as_bytes()) {
        log(Level::Warn, &format!("publish refused: {e:?}"));
    }
}

/// GETs `url`: `status=<n> bytes=<n>`, or `error=<code>`.
fn get(url: &str) -> String {
    fetch(&Method::Get, url)
}

/// `method` on `url`: `status=<n> bytes=<n>`, or `error=<code>`.
fn fetch(method: &Method, url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some(("https", rest)) => (Scheme::Https, rest),
        Some((_, rest)) => (Scheme::Http, rest),
        None => (Scheme::Http, url),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let request = OutgoingRequest::new(Fields::new());
    let _ = request.set_method(method);
    let _ = request.set_scheme(Some(&scheme));
    let _ = request.set_authority(Some(authority));
    let _ = request.set_path_with_query(Some(path));
    let future = match outgoing_handler::handle(request, None) {
        Ok(future) => future,
        Err(e) => return format!("error={e:?}"),
    };
    future.subscribe().block();
    let response = match future.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(e))) => return format!("error={e:?}"),
        other => return format!("error=no response ({})", other.is_some()),
    };
    let status = response.status();
    let Ok(body) = response.consume() else {
        return format!("status={status} error=no body");
    };
    let Ok(stream) = body.stream() else {
        return format!("status={status} error=no body stream");
    };
    let mut bytes = 0usize;
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) => bytes += chunk.len(),
            Err(wasi::io::streams::StreamError::Closed) => break,
            Err(wasi::io::streams::StreamError::LastOperationFailed(e)) => {
                return format!("status={status} bytes={bytes} error={}", e.to_debug_string());
            }
        }
    }
    format!("status={status} bytes={bytes}")
}

impl Guest for Publisher {
    fn handle(record: KinesisRecord) -> Outcome {
        let data = String::from_utf8_lossy(&record.data).into_owned();
        log(
            Level::Info,
            &format!("handled data={data} attempt={}", record.attempt),
        );
        if let Some(x) = data.strip_prefix("retry-once:") {
            if record.attempt < 2 {
                out(&record, &format!("discarded:{x}"));
                return Outcome::Retry("once".into());
            }
            out(&record, x);
            Outcome::Ack
        } else if let Some(x) = data.strip_prefix("reject:") {
            out(&record, &format!("rejected:{x}"));
            Outcome::Reject("asked to reject".into())
        } else if let Some(url) = data.strip_prefix("post:") {
            let got = fetch(&Method::Post, url);
            log(Level::Info, &format!("posted {url}: {got}"));
            out(&record, &got);
            Outcome::Ack
        } else if let Some(url) = data.strip_prefix("get:") {
            let got = get(url);
            log(Level::Info, &format!("fetched {url}: {got}"));
            out(&record, &got);
            Outcome::Ack
        } else {
            let prefix = config("prefix").unwrap_or_else(|| "unset:".into());
            out(&record, &format!("{prefix}{data}"));
            Outcome::Ack
        }
    }
}

export!(Publisher);
