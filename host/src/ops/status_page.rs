//! The status page and its JSON: the page is rendered whole on load (it
//! reads without JavaScript), then polls `/status.json` every 2 s and
//! updates itself in place, drawing small charts (inline SVG, no external
//! script or CDN: everything is served by the host) of each shard's lag and
//! each subscription's calls per second over the last 5 minutes since the
//! page opened. A shard that appears or goes reloads the page.

use std::fmt::Write as _;

use super::OpsState;
use crate::ids::OwnerId;

/// The page's script (see the module docs).
const LIVE_JS: &str = include_str!("status.js");

/// What `/status.json` answers.
#[derive(serde::Serialize)]
pub(super) struct Snapshot {
    /// When it was taken, ms since the Unix epoch.
    t: u64,
    ready: bool,
    subscriptions: Vec<SubscriptionSnapshot>,
}

#[derive(serde::Serialize)]
struct SubscriptionSnapshot {
    name: String,
    mode: String,
    digest: String,
    canary: Option<String>,
    shards: Vec<ShardSnapshot>,
    lanes: Vec<LaneSnapshot>,
}

#[derive(serde::Serialize)]
struct ShardSnapshot {
    id: String,
    owner: Option<String>,
    checkpoint: Option<String>,
    behind_ms: Option<u64>,
    state: String,
}

#[derive(serde::Serialize)]
struct LaneSnapshot {
    lane: u32,
    calls: u64,
}

/// The state as the page shows it.
pub(super) fn snapshot(state: &OpsState) -> Snapshot {
    Snapshot {
        t: crate::failure::now_ms(),
        ready: state.telemetry.ready(),
        subscriptions: state
            .telemetry
            .subscriptions()
            .into_iter()
            .map(|(name, status)| SubscriptionSnapshot {
                name: name.to_string(),
                mode: status.mode().to_owned(),
                digest: status.digest(),
                canary: status.canary(),
                shards: status
                    .shards()
                    .into_iter()
                    .map(|(shard, s)| ShardSnapshot {
                        id: shard.to_string(),
                        owner: s.owner.as_ref().map(|o| o.as_str().to_owned()),
                        checkpoint: s.checkpoint.as_ref().map(ToString::to_string),
                        behind_ms: s.behind_ms,
                        state: s.state.to_string(),
                    })
                    .collect(),
                lanes: status
                    .lanes()
                    .into_iter()
                    .map(|(lane, calls)| LaneSnapshot { lane, calls })
                    .collect(),
            })
            .collect(),
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The page, rendered whole.
pub(super) fn page(state: &OpsState) -> String {
    let mut html = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>shardlane</title>\
         <style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:.5em 0 1.5em}\
         td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}th{background:#f3f3f3}\
         svg.spark{vertical-align:middle}#updated{color:#777;font-size:.9em}</style>\
         </head><body><h1>shardlane</h1>",
    );
    let _ = write!(
        html,
        "<p id=\"ready\">ready: {}</p><p id=\"updated\"></p>",
        state.telemetry.ready()
    );
    for (name, status) in state.telemetry.subscriptions() {
        let _ = write!(
            html,
            "<section class=\"subscription\" data-name=\"{n}\"><h2>{n}</h2><p>plugin <code class=\"digest\">{}</code> · mode {}</p>\
             <p>calls per second <span class=\"rate\"></span></p>",
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
        html.push_str("<table class=\"shards\"><tr><th>shard</th><th>owner</th><th>checkpoint</th><th>behind (ms)</th><th>lag, last 5 min</th><th>state</th></tr>");
        for (shard, s) in status.shards() {
            let _ = write!(
                html,
                "<tr class=\"shard\" data-shard=\"{sh}\"><td>{sh}</td><td class=\"owner\">{}</td><td class=\"checkpoint\">{}</td><td class=\"behind\">{}</td><td class=\"lag\"></td><td class=\"state\">{}</td></tr>",
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
                "<tr class=\"lane\" data-lane=\"{lane}\"><td>{lane}</td><td class=\"calls\">{calls}</td></tr>"
            );
        }
        html.push_str("</table></section>");
    }
    let _ = write!(html, "<script>{LIVE_JS}</script></body></html>");
    html
}
