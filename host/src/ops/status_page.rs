//! The status page and its JSON: the page is rendered whole on load (it
//! reads without JavaScript), then polls `/status.json` every 2 s and
//! updates itself in place, drawing small charts (inline SVG, no external
//! script or CDN: everything is served by the host) over the last 5 minutes
//! since the page opened: per shard its lag and records read per second,
//! per subscription its calls per second, per plugin version (the stable
//! one and a canary's candidate) its records per second and the share not
//! acked, per lane its calls per second. Rates come from the counters'
//! differences between polls. The latest lease owner changes are listed.
//! A shard or version that appears or goes reloads the page.

use std::fmt::Write as _;

use super::OpsState;
use crate::ids::OwnerId;
use crate::telemetry::SubscriptionStatus;
use crate::telemetry::status::{LeaseChange, VersionOutcomes};

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
    versions: Vec<VersionOutcomes>,
    shards: Vec<ShardSnapshot>,
    lanes: Vec<LaneSnapshot>,
    lease_changes: Vec<LeaseChangeSnapshot>,
    /// The latest entries of the fleet's version history, newest first.
    history: Vec<crate::fleet_versions::Change>,
    /// Why the fleet's versions do not run here, while they do not.
    version_problem: Option<String>,
    /// The shadow candidate and its counts, while one runs.
    shadow: Option<crate::telemetry::ShadowView>,
    /// The parked keys in words (empty while none is).
    parked: String,
}

#[derive(serde::Serialize)]
struct ShardSnapshot {
    id: String,
    owner: Option<String>,
    checkpoint: Option<String>,
    behind_ms: Option<u64>,
    state: String,
    /// Records read here so far (the page shows the rate).
    records: u64,
}

#[derive(serde::Serialize)]
struct LeaseChangeSnapshot {
    at_ms: u64,
    shard: String,
    from: Option<String>,
    to: Option<String>,
}

impl From<LeaseChange> for LeaseChangeSnapshot {
    fn from(c: LeaseChange) -> Self {
        Self {
            at_ms: c.at_ms,
            shard: c.shard.to_string(),
            from: c.from.map(|o| o.as_str().to_owned()),
            to: c.to.map(|o| o.as_str().to_owned()),
        }
    }
}

#[derive(serde::Serialize)]
struct LaneSnapshot {
    lane: u32,
    calls: u64,
}

/// The state as the page shows it.
pub(super) fn snapshot(state: &OpsState) -> Snapshot {
    Snapshot {
        t: crate::clock::now_ms(),
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
                versions: status.versions(),
                shards: status
                    .shards()
                    .into_iter()
                    .map(|(shard, s)| ShardSnapshot {
                        id: shard.to_string(),
                        owner: s.owner.as_ref().map(|o| o.as_str().to_owned()),
                        checkpoint: s.checkpoint.as_ref().map(ToString::to_string),
                        behind_ms: s.behind_ms,
                        state: s.state.to_string(),
                        records: s.records.get(),
                    })
                    .collect(),
                lanes: status
                    .lanes()
                    .into_iter()
                    .map(|(lane, calls)| LaneSnapshot { lane, calls })
                    .collect(),
                lease_changes: status.lease_changes().into_iter().map(Into::into).collect(),
                history: status.history(),
                version_problem: status.version_problem(),
                shadow: status.shadow(),
                parked: parked_text(&status.parked()),
            })
            .collect(),
    }
}

/// A sequence number's first 6 and last 8 digits (the whole one is the
/// cell's title): enough to see it move and tell shards apart.
fn short(checkpoint: &str) -> String {
    if checkpoint.len() <= 20 || !checkpoint.is_ascii() {
        return checkpoint.to_owned();
    }
    format!(
        "{}…{}",
        &checkpoint[..6],
        &checkpoint[checkpoint.len() - 8..]
    )
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
         td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;white-space:nowrap}th{background:#f3f3f3}\
         td.num{text-align:right}svg.spark{vertical-align:middle}#updated{color:#777;font-size:.9em}\
         tr.candidate{background:#fff7e0}</style>\
         </head><body><h1>shardlane</h1>",
    );
    let _ = write!(
        html,
        "<p id=\"ready\">ready: {}</p><p id=\"updated\"></p>",
        state.telemetry.ready()
    );
    for (name, status) in state.telemetry.subscriptions() {
        subscription(&mut html, name.as_str(), &status);
    }
    let _ = write!(html, "<script>{LIVE_JS}</script></body></html>");
    html
}

/// The parked keys in words: `2 keys parked (quarantine): a, b`.
fn parked_text((count, shown): &(usize, Vec<String>)) -> String {
    if *count == 0 {
        return String::new();
    }
    let more = if *count > shown.len() { ", …" } else { "" };
    let noun = if *count == 1 { "key" } else { "keys" };
    format!(
        "{count} {noun} parked (quarantine): {}{more}",
        shown.join(", ")
    )
}

/// A shadow candidate in words (the script writes the same).
fn shadow_text(s: &crate::telemetry::ShadowView) -> String {
    format!(
        "shadow {}: {} calls compared, differing in outcome {}, output {}, state {}; {} dropped (behind)",
        s.digest, s.calls, s.outcome, s.output, s.state, s.dropped
    )
}

/// One subscription's section: its versions, shards, lanes and latest
/// lease changes.
fn subscription(html: &mut String, name: &str, status: &SubscriptionStatus) {
    let _ = write!(
        html,
        "<section class=\"subscription\" data-name=\"{n}\"><h2>{n}</h2><p>plugin <code class=\"digest\">{}</code> · mode {}</p>\
         <p>calls per second <span class=\"calls-rate\"></span></p>",
        escape(&status.digest()),
        escape(status.mode()),
        n = escape(name)
    );
    if let Some(canary) = status.canary() {
        let _ = write!(
            html,
            "<p class=\"canary\">canary <code>{}</code></p>",
            escape(&canary)
        );
    }
    let _ = write!(
        html,
        "<p class=\"version-problem\">{}</p><p class=\"shadow\">{}</p><p class=\"parked\">{}</p>",
        escape(&status.version_problem().unwrap_or_default()),
        escape(&status.shadow().map(|s| shadow_text(&s)).unwrap_or_default()),
        escape(&parked_text(&status.parked())),
    );
    versions_table(html, status);
    shards_table(html, status);
    lanes_table(html, status);
    lease_changes_table(html, status);
    history_table(html, status);
    html.push_str("</section>");
}

/// The versions running (stable, candidate) and their outcomes.
fn versions_table(html: &mut String, status: &SubscriptionStatus) {
    html.push_str("<table class=\"versions\"><tr><th>version</th><th>digest</th><th>records/s</th><th>ack</th><th>retry</th><th>reject</th><th>failed</th><th>not acked, last 5 min</th></tr>");
    for v in status.versions() {
        let o = v.outcomes;
        let _ = write!(
            html,
            "<tr class=\"version {role}\" data-role=\"{role}\"><td>{role}</td><td><code>{}</code></td><td class=\"rate num\"></td>\
             <td class=\"ack num\">{}</td><td class=\"retry num\">{}</td><td class=\"reject num\">{}</td><td class=\"failed num\">{}</td><td class=\"errors\"></td></tr>",
            escape(&v.digest),
            o.ack,
            o.retry,
            o.reject,
            o.failed,
            role = v.role,
        );
    }
    html.push_str("</table>");
}

/// Every shard seen: owner, checkpoint, lag, state.
fn shards_table(html: &mut String, status: &SubscriptionStatus) {
    html.push_str("<table class=\"shards\"><tr><th>shard</th><th>owner</th><th>checkpoint</th><th>behind (ms)</th><th>lag, last 5 min</th><th>records/s, last 5 min</th><th>state</th></tr>");
    for (shard, s) in status.shards() {
        let checkpoint = s
            .checkpoint
            .as_ref()
            .map_or(String::new(), ToString::to_string);
        let _ = write!(
            html,
            "<tr class=\"shard\" data-shard=\"{sh}\"><td>{sh}</td><td class=\"owner\">{}</td><td class=\"checkpoint\" title=\"{cp}\">{}</td><td class=\"behind num\">{}</td><td class=\"lag\"></td><td class=\"records\"></td><td class=\"state\">{}</td></tr>",
            escape(s.owner.as_ref().map_or("", OwnerId::as_str)),
            escape(&short(&checkpoint)),
            s.behind_ms.map(|m| m.to_string()).unwrap_or_default(),
            s.state,
            sh = escape(shard.as_str()),
            cp = escape(&checkpoint),
        );
    }
    html.push_str("</table>");
}

/// Calls per lane.
fn lanes_table(html: &mut String, status: &SubscriptionStatus) {
    html.push_str(
        "<table class=\"lanes\"><tr><th>lane</th><th>calls</th><th>calls/s, last 5 min</th></tr>",
    );
    for (lane, calls) in status.lanes() {
        let _ = write!(
            html,
            "<tr class=\"lane\" data-lane=\"{lane}\"><td>{lane}</td><td class=\"calls num\">{calls}</td><td class=\"load\"></td></tr>"
        );
    }
    html.push_str("</table>");
}

/// The latest lease owner changes.
fn lease_changes_table(html: &mut String, status: &SubscriptionStatus) {
    html.push_str("<h3>lease changes</h3><table class=\"leases\"><thead><tr><th>when</th><th>shard</th><th>from</th><th>to</th></tr></thead><tbody>");
    for c in status.lease_changes() {
        let c = LeaseChangeSnapshot::from(c);
        let _ = write!(
            html,
            "<tr class=\"lease-change\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(c.at_ms)
            ),
            escape(&c.shard),
            escape(c.from.as_deref().unwrap_or("—")),
            escape(c.to.as_deref().unwrap_or("—")),
        );
    }
    html.push_str("</tbody></table>");
}

/// The latest entries of the fleet's version history.
fn history_table(html: &mut String, status: &SubscriptionStatus) {
    html.push_str("<h3>version history (latest first)</h3><table class=\"history\"><thead><tr><th>when</th><th>action</th><th>version</th><th>by</th><th>note</th></tr></thead><tbody>");
    for c in status.history() {
        let _ = write!(
            html,
            "<tr class=\"change\"><td>{}</td><td>{}</td><td><code title=\"{d}\">{}</code></td><td>{}</td><td>{}</td></tr>",
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(c.at_ms)
            ),
            c.action.label(),
            escape(c.digest.short()),
            escape(&c.by),
            escape(&c.note),
            d = escape(&c.digest.to_string()),
        );
    }
    html.push_str("</tbody></table>");
}
