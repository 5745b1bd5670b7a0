//! The enrich plugin (contract `shardlane:plugin@0.2.0`): for each record,
//! reads `lookup_url` and `output_stream` from its config
//! (`wasi:config/store`), GETs `<lookup_url>/<partition key>` over
//! `wasi:http`, publishes `{"input": <the record's data as text>,
//! "customer": <the JSON the lookup answered>, "id": "<shard>/<sequence>"}`
//! to the output stream with the record's partition key, and acks. A
//! lookup that answers 5xx or fails asks to retry; a 4xx rejects.
//!
//! The output is published only if the record acks, and the record settles
//! only once the output is in its stream. `id` names the input, so a
//! consumer can drop the duplicate a crash may cause (delivery is at least
//! once).

wit_bindgen::generate!({
    world: "record-handler",
    path: "../../../wit/v0.2.0",
    generate_all,
});

use shardlane::plugin::log::{Level, log};
use shardlane::plugin::outputs::publish;
use wasi::config::store;
use wasi::http::outgoing_handler;
use wasi::http::types::{Fields, OutgoingRequest, Scheme};
use wasi::io::streams::StreamError;

struct Enrich;

/// What a lookup came back with.
enum Lookup {
    /// 2xx, and its body.
    Found(Vec<u8>),
    /// 4xx: no such customer; retrying would not help.
    Missing(u16),
    /// 5xx or no answer: worth another attempt.
    Failed(String),
}

/// GETs `url` (`http://` or `https://`).
fn get(url: &str) -> Lookup {
    let (scheme, rest) = match url.split_once("://") {
        Some(("https", rest)) => (Scheme::Https, rest),
        Some((_, rest)) => (Scheme::Http, rest),
        None => return Lookup::Failed(format!("{url} is not a URL")),
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let request = OutgoingRequest::new(Fields::new());
    let set = request
        .set_scheme(Some(&scheme))
        .and(request.set_authority(Some(authority)))
        .and(request.set_path_with_query(Some(if path.is_empty() { "/" } else { path })));
    if set.is_err() {
        return Lookup::Failed(format!("{url} is not a valid request"));
    }
    let response = match outgoing_handler::handle(request, None) {
        Ok(future) => {
            future.subscribe().block();
            match future.get() {
                Some(Ok(Ok(response))) => response,
                Some(Ok(Err(code))) => return Lookup::Failed(format!("{code:?}")),
                _ => return Lookup::Failed("no response".into()),
            }
        }
        // Denied (not in `http.allow`), or an invalid request.
        Err(code) => return Lookup::Failed(format!("{code:?}")),
    };
    let status = response.status();
    if (400..500).contains(&status) {
        return Lookup::Missing(status);
    }
    if !(200..300).contains(&status) {
        return Lookup::Failed(format!("HTTP {status}"));
    }
    let Ok(body) = response.consume() else {
        return Lookup::Failed("no body".into());
    };
    let Ok(stream) = body.stream() else {
        return Lookup::Failed("no body stream".into());
    };
    let mut bytes = Vec::new();
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) => bytes.extend(chunk),
            Err(StreamError::Closed) => return Lookup::Found(bytes),
            // E.g. over the host's `http.max_response`.
            Err(StreamError::LastOperationFailed(e)) => return Lookup::Failed(e.to_debug_string()),
        }
    }
}

impl Guest for Enrich {
    fn handle(record: KinesisRecord) -> Outcome {
        let (Ok(Some(lookup_url)), Ok(Some(output_stream))) =
            (store::get("lookup_url"), store::get("output_stream"))
        else {
            return Outcome::Reject("config needs lookup_url and output_stream".into());
        };
        let url = format!("{}/{}", lookup_url.trim_end_matches('/'), record.partition_key);
        let customer = match get(&url) {
            Lookup::Found(body) => match serde_json::from_slice::<serde_json::Value>(&body) {
                Ok(customer) => customer,
                Err(e) => return Outcome::Retry(format!("{url} answered no JSON: {e}")),
            },
            Lookup::Missing(status) => return Outcome::Reject(format!("{url}: HTTP {status}")),
            Lookup::Failed(why) => return Outcome::Retry(format!("{url}: {why}")),
        };
        let output = serde_json::json!({
            "input": String::from_utf8_lossy(&record.data),
            "customer": customer,
            "id": format!("{}/{}", record.shard_id, record.sequence_number),
        });
        match publish(0, &output_stream, &record.partition_key, output.to_string().as_bytes()) {
            Ok(()) => {
                log(Level::Debug, &format!("enriched key={}", record.partition_key));
                Outcome::Ack
            }
            Err(e) => Outcome::Reject(format!("cannot publish: {e:?}")),
        }
    }
}

export!(Enrich);
