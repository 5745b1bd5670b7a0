//! A fault proxy: a loopback HTTP/1.1 proxy in front of an emulator (or an
//! artifact store: moto's S3, a registry) that can refuse connections,
//! reset them, hang (accept a request and never answer), delay requests,
//! or answer chosen operations with an AWS error (throttling, say) — what
//! a test needs to show that the host survives a bad network, a hung
//! store and a throttled service.
//!
//! Point the host at [`FaultProxy::endpoint`] instead of the emulator's
//! and change [`Faults`] while it runs. Every request is forwarded with
//! `Connection: close`, so each one arrives on a fresh connection and the
//! current faults apply to every request, never only to new connections.
//! Operations are recognised by the `X-Amz-Target` header the AWS JSON
//! protocols send (`Kinesis_20131202.GetRecords`,
//! `DynamoDB_20120810.UpdateItem`).
//!
//! Only loopback: it listens on 127.0.0.1 and forwards to the emulator's
//! loopback address. Tests bound how long each fault lasts.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;

/// Largest request head the proxy reads (AWS SDK heads are ~1 KB).
const MAX_HEAD: usize = 64 << 10;

/// An AWS error answer for one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injection {
    /// A substring of the `X-Amz-Target` header, e.g. `"GetRecords"`.
    pub operation: String,
    /// The AWS error type, e.g. `"ProvisionedThroughputExceededException"`.
    pub error: String,
    /// The HTTP status (400 for throttling).
    pub status: u16,
    /// Only requests whose body holds this (e.g. `"StreamName":"orders"`,
    /// to fault one stream's calls and not another's).
    pub body: Option<String>,
}

impl Injection {
    /// Throttling for `operation`, as Kinesis and DynamoDB answer it.
    pub fn throttle(operation: &str) -> Self {
        Self {
            operation: operation.to_owned(),
            error: "ProvisionedThroughputExceededException".to_owned(),
            status: 400,
            body: None,
        }
    }

    /// Throttling for `operation` on the requests whose body holds `body`.
    pub fn throttle_where(operation: &str, body: &str) -> Self {
        Self {
            body: Some(body.to_owned()),
            ..Self::throttle(operation)
        }
    }
}

/// What the proxy does to traffic now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// Nothing listens: connections are refused.
    pub refuse: bool,
    /// Connections are accepted, then reset at once.
    pub reset: bool,
    /// Requests are read and never answered: the connection stays open
    /// until the client gives up (a hung store).
    pub hang: bool,
    /// Each request waits this long before it is forwarded.
    pub delay: Duration,
    /// Requests for this operation get this error instead of an answer.
    pub inject: Option<Injection>,
    /// A forwarded answer still streaming after this long is cut (the
    /// connection closed mid-answer): how a long-lived answer such as a
    /// SubscribeToShard event stream ends without warning.
    pub cut_after: Option<Duration>,
}

/// A running fault proxy; stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    faults: watch::Sender<Faults>,
    injected: Arc<AtomicU64>,
    forwarded: Arc<AtomicU64>,
    reset: Arc<AtomicU64>,
    hung: Arc<AtomicU64>,
    by_operation: Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy on a free loopback port in front of `upstream`
    /// (`http://127.0.0.1:PORT`), passing everything through.
    ///
    /// # Errors
    /// When `upstream` is not a loopback `http://host:port` or no port can
    /// be bound.
    pub async fn start(upstream: &str) -> anyhow::Result<Self> {
        let upstream: SocketAddr = upstream
            .strip_prefix("http://")
            .and_then(|rest| rest.split('/').next())
            .with_context(|| format!("fault proxy: {upstream:?} is not http://host:port"))?
            .replace("localhost", "127.0.0.1")
            .parse()
            .with_context(|| format!("fault proxy: {upstream:?} is not http://host:port"))?;
        anyhow::ensure!(
            upstream.ip().is_loopback(),
            "fault proxy: only loopback upstreams"
        );
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let addr = listener.local_addr()?;
        let (faults, rx) = watch::channel(Faults::default());
        let injected = Arc::new(AtomicU64::new(0));
        let forwarded = Arc::new(AtomicU64::new(0));
        let reset = Arc::new(AtomicU64::new(0));
        let hung = Arc::new(AtomicU64::new(0));
        let by_operation = Arc::default();
        let counters = Counters {
            injected: injected.clone(),
            forwarded: forwarded.clone(),
            reset: reset.clone(),
            hung: hung.clone(),
            by_operation: Arc::clone(&by_operation),
        };
        let task = tokio::spawn(serve(Some(listener), addr, upstream, rx, counters));
        Ok(Self {
            addr,
            faults,
            injected,
            forwarded,
            reset,
            hung,
            by_operation,
            task,
        })
    }

    /// The endpoint to give the host, e.g. as `AWS_ENDPOINT_URL_KINESIS`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Applies `faults` from now on.
    pub fn set(&self, faults: Faults) {
        self.faults.send_replace(faults);
    }

    /// Passes everything through again.
    pub fn clear(&self) {
        self.set(Faults::default());
    }

    /// Requests answered with an injected error so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// Requests forwarded to the upstream so far.
    pub fn forwarded(&self) -> u64 {
        self.forwarded.load(Ordering::Relaxed)
    }

    /// Requests forwarded so far per operation (the `X-Amz-Target` after
    /// its last `.`, e.g. `UpdateItem`): what a benchmark counts.
    pub fn forwarded_by_operation(&self) -> std::collections::BTreeMap<String, u64> {
        self.by_operation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Requests held unanswered (under [`Faults::hang`]) so far.
    pub fn hung(&self) -> u64 {
        self.hung.load(Ordering::Relaxed)
    }

    /// Connections reset (under [`Faults::reset`]) so far: each one a
    /// request the client tried to send.
    pub fn reset_count(&self) -> u64 {
        self.reset.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let socket = TcpSocket::new_v4()?;
    // Refusing drops the listener; listening again must get the same port.
    socket.set_reuseaddr(true)?;
    socket
        .bind(addr)
        .with_context(|| format!("fault proxy: cannot bind {addr}"))?;
    Ok(socket.listen(1024)?)
}

/// What the proxy counts, shared with its connection tasks.
#[derive(Clone)]
struct Counters {
    injected: Arc<AtomicU64>,
    forwarded: Arc<AtomicU64>,
    reset: Arc<AtomicU64>,
    hung: Arc<AtomicU64>,
    by_operation: Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>>,
}

async fn serve(
    mut listener: Option<tokio::net::TcpListener>,
    addr: SocketAddr,
    upstream: SocketAddr,
    mut faults: watch::Receiver<Faults>,
    counters: Counters,
) {
    loop {
        let refuse = faults.borrow().refuse;
        if refuse {
            listener = None;
            if faults.changed().await.is_err() {
                return;
            }
            continue;
        }
        let Some(current) = listener.as_ref() else {
            match bind(addr) {
                Ok(l) => listener = Some(l),
                // The port is briefly unavailable: try again shortly.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
            continue;
        };
        tokio::select! {
            changed = faults.changed() => if changed.is_err() { return },
            accepted = current.accept() => {
                let Ok((client, _)) = accepted else { continue };
                let now = faults.borrow().clone();
                let counters = counters.clone();
                tokio::spawn(async move {
                    let _ = handle(client, upstream, now, &counters).await;
                });
            }
        }
    }
}

/// One request: read it, then reset, delay, inject or forward it.
async fn handle(
    mut client: TcpStream,
    upstream: SocketAddr,
    faults: Faults,
    counters: &Counters,
) -> anyhow::Result<()> {
    let Counters {
        injected,
        forwarded,
        reset,
        hung,
        by_operation,
    } = counters;
    if faults.reset {
        reset.fetch_add(1, Ordering::Relaxed);
        // A zero linger makes the close a reset (RST). Deprecated because a
        // non-zero linger blocks the thread on drop; zero never does.
        #[allow(deprecated)]
        client.set_linger(Some(Duration::ZERO))?;
        return Ok(());
    }
    let (head, body) = read_request(&mut client).await?;
    if faults.hang {
        hung.fetch_add(1, Ordering::Relaxed);
        // Until the client closes (a read of 0), or an hour.
        let mut buf = [0u8; 1024];
        let _ = tokio::time::timeout(Duration::from_secs(3600), async {
            while client.read(&mut buf).await.is_ok_and(|n| n > 0) {}
        })
        .await;
        return Ok(());
    }
    if !faults.delay.is_zero() {
        tokio::time::sleep(faults.delay).await;
    }
    let target = header(&head, "x-amz-target").unwrap_or_default();
    if let Some(inject) = &faults.inject
        && target.contains(&inject.operation)
        && inject.body.as_ref().is_none_or(|held| {
            body.windows(held.len().max(1))
                .any(|w| w == held.as_bytes())
        })
    {
        injected.fetch_add(1, Ordering::Relaxed);
        let body = format!(
            "{{\"__type\":\"{}\",\"message\":\"injected by the test fault proxy\"}}",
            inject.error
        );
        let answer = format!(
            "HTTP/1.1 {} Error\r\ncontent-type: application/x-amz-json-1.1\r\nx-amzn-errortype: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            inject.status,
            inject.error,
            body.len()
        );
        client.write_all(answer.as_bytes()).await?;
        client.shutdown().await?;
        return Ok(());
    }
    let mut server = TcpStream::connect(upstream).await?;
    forwarded.fetch_add(1, Ordering::Relaxed);
    let operation = target.rsplit('.').next().unwrap_or_default().to_owned();
    *by_operation
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(operation)
        .or_default() += 1;
    server.write_all(&close_after(&head)).await?;
    server.write_all(&body).await?;
    match faults.cut_after {
        Some(after) => {
            // Elapsed: both connections are dropped mid-answer.
            if let Ok(copied) =
                tokio::time::timeout(after, tokio::io::copy(&mut server, &mut client)).await
            {
                copied?;
                client.shutdown().await?;
            }
        }
        None => {
            tokio::io::copy(&mut server, &mut client).await?;
            client.shutdown().await?;
        }
    }
    Ok(())
}

/// Reads a request head and its `Content-Length` body.
async fn read_request(client: &mut TcpStream) -> anyhow::Result<(String, Vec<u8>)> {
    let mut buf = Vec::with_capacity(4096);
    let end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        anyhow::ensure!(buf.len() < MAX_HEAD, "request head too long");
        let mut chunk = [0u8; 4096];
        let n = client.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "connection closed before a whole request head");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let length: usize = header(&head, "content-length")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = buf[end..].to_vec();
    while body.len() < length {
        let mut chunk = vec![0u8; (length - body.len()).min(64 << 10)];
        let n = client.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "connection closed before the whole body");
        body.extend_from_slice(&chunk[..n]);
    }
    Ok((head, body))
}

/// A header's value (names compare case-insensitively).
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n").skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// The head with `Connection: close` in place of any connection header.
fn close_after(head: &str) -> Vec<u8> {
    let mut out = String::with_capacity(head.len() + 20);
    for line in head.trim_end_matches("\r\n").split("\r\n") {
        let is_connection = line
            .split_once(':')
            .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("connection"));
        if !is_connection {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("connection: close\r\n\r\n");
    out.into_bytes()
}
