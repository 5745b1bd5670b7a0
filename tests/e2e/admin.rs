//! The admin server under hostile callers: the token is checked before
//! anything else, refusals are logged in summary, slow and idle
//! connections are closed, a connection cap keeps `/healthz` answering
//! once the flood ends, and the file-descriptor limit does not flood the
//! log. Every test talks to 127.0.0.1 only, with bounded counts and
//! deadlines.

use std::time::{Duration, Instant};

use shardlane::admin::{HEADER_READ_TIMEOUT, LOG_INTERVAL, MAX_CONNECTIONS};
use shardlane_testkit::{HostProcess, Kinesis, LogLine, guests, unique_name};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{admin_addr, config, field, shardlane_bin};

/// The admin token of [`start`]'s host.
const TOKEN: &str = "s3cret";

/// Starts Kinesis and a host with one subscription named `name` and the
/// admin token [`TOKEN`]; returns them with the admin address.
async fn start(name: &str) -> (Kinesis, HostProcess, String) {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("admin");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let cfg = config(name, &stream, &guests.echo, "").replace(
        "[admin]\nlisten = \"127.0.0.1:0\"",
        &format!("[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\""),
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("the admin server", Duration::from_secs(60), |lines| {
        lines
            .iter()
            .any(|l| field(l, "message").starts_with("admin listening"))
    })
    .await
    .unwrap();
    let addr = admin_addr(&host);
    (kinesis, host, addr)
}

/// Sends `raw` (a whole request) and reads the response to its end:
/// (status, body). Fails after 10 s.
async fn send(addr: &str, raw: &[u8]) -> (u16, String) {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(raw).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        anyhow::Ok(String::from_utf8_lossy(&response).into_owned())
    };
    let response = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("an answer within 10 s")
        .expect("an answer");
    let status = response
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A request without a body; `token` as the bearer token if any.
async fn request(addr: &str, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    send(addr, raw.as_bytes()).await
}

/// A PUT with `body` and the right token.
async fn put(addr: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut raw = format!(
        "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    send(addr, &raw).await
}

/// Whether the server closed `stream` (EOF or reset) within `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            // A response (a 503, a 408): the close follows.
            Ok(Ok(_)) => {}
        }
    }
}

/// Opens `n` connections that each send half a request head and then
/// nothing.
async fn slowloris(addr: &str, n: usize) -> Vec<TcpStream> {
    let mut streams = Vec::new();
    for _ in 0..n {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: slow\r\n")
            .await
            .unwrap();
        streams.push(stream);
    }
    streams
}

/// `/healthz` answers 200 within `within`, polling.
async fn healthy_within(addr: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let answer = tokio::time::timeout(Duration::from_secs(2), async {
            let mut stream = TcpStream::connect(addr).await.ok()?;
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
                .await
                .ok()?;
            let mut response = Vec::new();
            stream.read_to_end(&mut response).await.ok()?;
            Some(response.starts_with(b"HTTP/1.1 200"))
        })
        .await;
        if answer == Ok(Some(true)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "/healthz did not answer 200 within {within:?} ({answer:?})"
        );
        // Polling until the server has room again.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The host's log lines whose message starts with `prefix`, once it has
/// stopped (so every line it wrote is there).
async fn stopped_lines(mut host: HostProcess, prefix: &str) -> Vec<LogLine> {
    host.terminate().await.unwrap();
    host.messages(prefix)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_token_comes_before_parameters_names_are_decoded_and_bad_bodies_are_400() {
    let (_kinesis, host, addr) = start("my-sub").await;

    // Without the token a caller learns nothing: not that the parameter
    // is wrong, not whether the subscription exists.
    for (method, path) in [
        ("PUT", "/subscriptions/my-sub/canary?key_fraction=bogus"),
        ("PUT", "/subscriptions/my-sub/canary"),
        ("PUT", "/subscriptions/nobody/canary?key_fraction=7"),
        ("PUT", "/subscriptions/%FF/plugin"),
        ("POST", "/subscriptions/nobody/canary/promote"),
    ] {
        let (status, body) = request(&addr, method, path, None).await;
        assert_eq!(status, 401, "{method} {path}: {body}");
        for wrong in ["wrong!", "s3creT", "s3cret-and-more"] {
            let (status, body) = request(&addr, method, path, Some(wrong)).await;
            assert_eq!(status, 401, "{method} {path} with {wrong:?}: {body}");
        }
    }
    // With it, the parameter is checked.
    let (status, body) = request(
        &addr,
        "PUT",
        "/subscriptions/my-sub/canary?key_fraction=bogus",
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, 400, "{body}");

    // A percent-encoded name is the name.
    let (status, body) = request(
        &addr,
        "POST",
        "/subscriptions/my%2Dsub/canary/rollback",
        Some(TOKEN),
    )
    .await;
    assert_eq!(
        status, 409,
        "my%2Dsub is my-sub, which has no canary: {body}"
    );
    let (status, body) = put(&addr, "/subscriptions/my%2dsub/plugin", b"not wasm").await;
    assert_eq!(status, 422, "{body}");
    let (status, body) = request(&addr, "PUT", "/subscriptions/%FF/plugin", Some(TOKEN)).await;
    assert_eq!(status, 400, "not UTF-8: {body}");

    // A malformed chunked body is a bad request, not a large one.
    let bad_chunks = format!(
        "PUT /subscriptions/my-sub/plugin HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"
    );
    let (status, body) = send(&addr, bad_chunks.as_bytes()).await;
    assert_eq!(status, 400, "{body}");
    // A well-formed chunked body is read (and refused as not Wasm).
    let good_chunks = format!(
        "PUT /subscriptions/my-sub/plugin HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n8\r\nnot wasm\r\n0\r\n\r\n"
    );
    let (status, body) = send(&addr, good_chunks.as_bytes()).await;
    assert_eq!(status, 422, "{body}");
    drop(host);
}

/// A known path with the wrong method is 405 with `Allow`; an upload that
/// declares more than the limit is 413 before a byte of it is read; a
/// write's report is JSON.
#[tokio::test(flavor = "multi_thread")]
async fn wrong_methods_are_405_oversized_uploads_413_and_reports_json() {
    let (_kinesis, host, addr) = start("my-sub").await;
    for (method, path, allow) in [
        ("POST", "/metrics", "GET"),
        ("DELETE", "/healthz", "GET"),
        ("GET", "/subscriptions/my-sub/plugin", "PUT"),
        ("PUT", "/subscriptions/my-sub/canary/promote", "POST"),
    ] {
        let raw = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let exchange = async {
            let mut stream = TcpStream::connect(&addr).await?;
            stream.write_all(raw.as_bytes()).await?;
            let mut response = Vec::new();
            stream.read_to_end(&mut response).await?;
            anyhow::Ok(String::from_utf8_lossy(&response).into_owned())
        };
        let response = tokio::time::timeout(Duration::from_secs(10), exchange)
            .await
            .unwrap()
            .unwrap();
        assert!(
            response.starts_with("HTTP/1.1 405"),
            "{method} {path}: {response}"
        );
        assert!(
            response
                .to_ascii_lowercase()
                .contains(&format!("allow: {}", allow.to_ascii_lowercase())),
            "{method} {path}: {response}"
        );
    }
    // Declared, not sent: refused at once.
    let raw = format!(
        "PUT /subscriptions/my-sub/plugin HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        100 << 20
    );
    let (status, body) = send(&addr, raw.as_bytes()).await;
    assert_eq!(status, 413, "{body}");
    // Without the token it is still 401 first.
    let raw = format!(
        "PUT /subscriptions/my-sub/plugin HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        100 << 20
    );
    assert_eq!(send(&addr, raw.as_bytes()).await.0, 401);
    // A write's report, through serde.
    let echo = std::fs::read(guests::build().unwrap().echo).unwrap();
    let mut raw = format!(
        "PUT /subscriptions/my-sub/plugin HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        echo.len()
    )
    .into_bytes();
    raw.extend_from_slice(&echo);
    let exchange = async {
        let mut stream = TcpStream::connect(&addr).await?;
        stream.write_all(&raw).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        anyhow::Ok(String::from_utf8_lossy(&response).into_owned())
    };
    let response = tokio::time::timeout(Duration::from_secs(60), exchange)
        .await
        .unwrap()
        .unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response
            .to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{response}"
    );
    let body = response.split_once("\r\n\r\n").unwrap().1;
    let report: serde_json::Value = serde_json::from_str(body).unwrap();
    assert!(
        report["new"].as_str().unwrap().starts_with("sha256:"),
        "{report}"
    );
    assert!(report["live_after_ms"].is_number(), "{report}");
    drop(host);
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_writes_are_logged_in_summary_with_short_paths() {
    let (_kinesis, host, addr) = start("refusals").await;
    let long = format!("/subscriptions/{}/plugin", "a".repeat(10 * 1024));
    let started = Instant::now();
    for _ in 0..200 {
        let (status, _) = request(&addr, "PUT", &long, None).await;
        assert_eq!(status, 401);
    }
    let took = started.elapsed();
    let lines = stopped_lines(host, "admin: ").await;
    let bytes: usize = lines.iter().map(|l| l.to_string().len()).sum();
    // One line per LOG_INTERVAL (the first at once), each short.
    let intervals = (took.as_secs_f64() / LOG_INTERVAL.as_secs_f64()).ceil() as usize;
    assert!(
        !lines.is_empty() && lines.len() <= intervals + 1,
        "{} refusal lines for 200 refusals in {took:?}",
        lines.len()
    );
    assert!(
        bytes <= lines.len() * 1024,
        "{bytes} bytes of log for {} lines",
        lines.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_request_heads_are_closed_by_the_header_timeout() {
    let (_kinesis, host, addr) = start("slowloris").await;
    let opened = Instant::now();
    let mut slow = slowloris(&addr, MAX_CONNECTIONS - 4).await;
    // An idle connection (nothing sent at all) is bounded the same way.
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    // Under the cap they leave room for the probe.
    healthy_within(&addr, Duration::from_secs(2)).await;
    let within = HEADER_READ_TIMEOUT + Duration::from_secs(3);
    for stream in slow.iter_mut().chain(std::iter::once(&mut idle)) {
        let left = within.saturating_sub(opened.elapsed());
        assert!(
            closed_within(stream, left).await,
            "a connection with half a head still open {:?} after it was opened",
            opened.elapsed()
        );
    }
    healthy_within(&addr, Duration::from_secs(2)).await;
    drop(host);
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_over_the_cap_are_refused_at_once_and_healthz_recovers() {
    let (_kinesis, host, addr) = start("cap").await;
    let slow = slowloris(&addr, MAX_CONNECTIONS).await;
    // Connected after the cap is full (accepted in connect order): each is
    // answered 503 or closed at once, not left hanging.
    let started = Instant::now();
    for _ in 0..50 {
        let mut extra = TcpStream::connect(&addr).await.unwrap();
        assert!(
            closed_within(&mut extra, Duration::from_secs(2)).await,
            "a connection over the cap was left open"
        );
    }
    assert!(
        started.elapsed() < HEADER_READ_TIMEOUT,
        "the cap held throughout"
    );
    // Once the flood ends, the probe gets through at once.
    drop(slow);
    healthy_within(&addr, Duration::from_secs(2)).await;
    let lines = stopped_lines(host, "admin: connection over the cap").await;
    assert!(
        (1..=2).contains(&lines.len()),
        "{} lines for 50 connections over the cap",
        lines.len()
    );
}

/// At the file-descriptor limit accept fails at once, every time: the
/// loop must back off and log a line per interval, not spin.
#[tokio::test(flavor = "multi_thread")]
async fn the_descriptor_limit_does_not_flood_the_log_and_healthz_comes_back() {
    let (_kinesis, host, addr) = start("emfile").await;
    let pid = host.pid();
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    // Room for a few admin connections, then EMFILE.
    let limit = open + 6;
    let status = std::process::Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={limit}:{limit}"))
        .status()
        .expect("prlimit (util-linux) runs");
    assert!(status.success(), "prlimit failed");
    let held = slowloris(&addr, 20).await;
    // Long enough for a spinning accept loop to write thousands of lines,
    // shorter than the header timeout that would free the held ones.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = host.messages("admin listener: accept failed").len();
    drop(held);
    // The backoff is at most 1 s: the probe is accepted soon after
    // descriptors free up.
    healthy_within(&addr, Duration::from_secs(5)).await;
    // Not stopped first: a clean stop may need descriptors it has not got.
    let lines = host.messages("admin listener: accept failed");
    drop(host);
    assert!(during >= 1, "the limit was reached (accept failed)");
    assert!(
        lines.len() <= 2,
        "{} accept-failure lines at the descriptor limit",
        lines.len()
    );
    assert!(
        lines[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("Too many open files")),
        "{}",
        lines[0]
    );
}

/// Catches: a metrics listener that also takes writes (exposing `/metrics`
/// to a scraper would expose swaps), or an admin listener that still
/// serves the read routes once they have a listener of their own.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_and_admin_listen_apart_each_with_its_own_routes() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("listeners");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let metrics_addr = format!("127.0.0.1:{}", shardlane_testkit::free_port());
    let cfg = config("apart", &stream, &guests.echo, "").replace(
        "[admin]\nlisten = \"127.0.0.1:0\"",
        &format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n[metrics]\nlisten = \"{metrics_addr}\""
        ),
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    host.wait_for("both listeners", Duration::from_secs(60), |lines| {
        ["admin listening", "metrics listening"]
            .iter()
            .all(|m| lines.iter().any(|l| field(l, "message").starts_with(m)))
    })
    .await
    .unwrap();
    let admin_addr = admin_addr(&host);

    for path in ["/healthz", "/metrics", "/"] {
        assert_eq!(
            request(&metrics_addr, "GET", path, None).await.0,
            200,
            "{path} on metrics"
        );
        assert_eq!(
            request(&admin_addr, "GET", path, None).await.0,
            404,
            "{path} on admin"
        );
    }
    let (status, body) = request(&metrics_addr, "GET", "/metrics", None).await;
    assert_eq!(status, 200);
    assert!(body.contains("shardlane_"), "{body}");
    // A write reaches the admin API on its listener only: with the token,
    // a promote without a canary is 409 there and 404 on metrics.
    let promote = "/subscriptions/apart/canary/promote";
    assert_eq!(
        request(&metrics_addr, "POST", promote, Some(TOKEN)).await.0,
        404
    );
    assert_eq!(
        request(&admin_addr, "POST", promote, Some(TOKEN)).await.0,
        409
    );
    host.terminate().await.unwrap();
}

/// Catches: a memory-store host (no CLI reaches its store) that cannot
/// change its filter, a bad filter applied, or a report that does not name
/// the filters.
#[tokio::test(flavor = "multi_thread")]
async fn a_filter_is_set_and_cleared_through_the_admin_api() {
    let guests = guests::build().unwrap();
    let kinesis = Kinesis::start().await.unwrap();
    let stream = unique_name("admin-filter");
    kinesis.create_stream(&stream, 1).await.unwrap();
    let cfg = config("f", &stream, &guests.echo, "start = \"trim_horizon\"").replace(
        "[admin]\nlisten = \"127.0.0.1:0\"",
        &format!("[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\""),
    );
    let mut host = HostProcess::start(shardlane_bin(), &cfg, kinesis.endpoint()).unwrap();
    // Records before, with and after the filter: a `keep-` key passes it.
    let put_phase = |phase: &'static str| {
        let records: Vec<(String, Vec<u8>)> = ["keep", "drop"]
            .iter()
            .map(|kind| (format!("{kind}-1"), format!("{kind} {phase}").into_bytes()))
            .collect();
        let kinesis = &kinesis;
        let stream = &stream;
        async move { kinesis.put_records(stream, &records).await.unwrap() }
    };
    let echoed = |host: &HostProcess| -> Vec<String> {
        crate::common::guest_lines(&host.lines(), "echo ")
            .iter()
            .map(|l| crate::common::echoed_data(l))
            .collect()
    };
    let wait_echoed = async |host: &mut HostProcess, data: &str| {
        host.wait_for(
            &format!("{data} echoed"),
            Duration::from_secs(60),
            |lines| {
                crate::common::guest_lines(lines, "echo ")
                    .iter()
                    .any(|l| crate::common::echoed_data(l) == data)
            },
        )
        .await
        .unwrap();
    };
    put_phase("before").await;
    wait_echoed(&mut host, "drop before").await;
    let addr = admin_addr(&host);

    let (status, body) = put(
        &addr,
        "/subscriptions/f/filter",
        br#"{"Filters": [{"Pattern": "{\"partitionKey\": [{\"prefix\": 7}]}"}]}"#,
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body.starts_with("filter: pattern 1: partitionKey") && body.lines().count() == 1,
        "{body}"
    );

    let criteria =
        br#"{"Filters": [{"Pattern": "{\"partitionKey\": [{\"prefix\": \"keep-\"}]}"}]}"#;
    let (status, body) = put(&addr, "/subscriptions/f/filter", criteria).await;
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["old"], "none", "{body}");
    assert!(
        report["new"].as_str().unwrap().starts_with("sha256:"),
        "{body}"
    );
    assert_eq!(report["changed"], true, "{body}");
    put_phase("with").await;
    wait_echoed(&mut host, "keep with").await;

    let (status, body) = put(&addr, "/subscriptions/f/filter", b"[]").await;
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["new"], "none", "{body}");
    put_phase("after").await;
    wait_echoed(&mut host, "drop after").await;
    assert!(host.terminate().await.unwrap().success());
    let seen = echoed(&host);
    assert!(
        !seen.contains(&"drop with".to_owned()),
        "a filtered record reached the guest: {seen:?}"
    );
}
