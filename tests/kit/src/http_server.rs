//! A small real HTTP/1.1 server on a free loopback port, for the plugins'
//! outbound HTTP: each connection gets one answer, then closes.
//!
//! | path | answer |
//! |---|---|
//! | `/ok` | 200, `hello` |
//! | `/customers/<key>` | 200, `{"id":"<key>","name":"customer <key>"}`; for a key starting with `flaky`, 503 the first time |
//! | `/fail` | 503, `unavailable` |
//! | `/slow` | 200 after 3 s |
//! | `/big` | 200, 2 MiB of `x` |
//! | anything else | 404 |

use std::collections::HashSet;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A running server; stops accepting when dropped.
pub struct HttpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
}

impl HttpServer {
    /// Starts on a free loopback port.
    ///
    /// # Errors
    /// When no port can be bound.
    pub fn start() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicU64::new(0));
        let (stopping, counted) = (stop.clone(), requests.clone());
        let seen: Arc<Mutex<HashSet<String>>> = Arc::default();
        std::thread::Builder::new()
            .name("test-http".into())
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            counted.fetch_add(1, Ordering::Relaxed);
                            let seen = seen.clone();
                            std::thread::spawn(move || {
                                let _ = answer(stream, &seen);
                            });
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })?;
        Ok(Self {
            addr,
            stop,
            requests,
        })
    }

    /// `127.0.0.1:PORT`.
    pub fn authority(&self) -> String {
        self.addr.to_string()
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Connections accepted so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn answer(stream: TcpStream, seen: &Mutex<HashSet<String>>) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // The rest of the head.
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/");
    let (status, body): (&str, Vec<u8>) = if path == "/ok" {
        ("200 OK", b"hello".to_vec())
    } else if let Some(key) = path.strip_prefix("/customers/")
        && key.starts_with("flaky")
        && seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_owned())
    {
        ("503 Service Unavailable", b"try again".to_vec())
    } else if let Some(key) = path.strip_prefix("/customers/") {
        (
            "200 OK",
            format!("{{\"id\":\"{key}\",\"name\":\"customer {key}\"}}").into_bytes(),
        )
    } else if path == "/fail" {
        ("503 Service Unavailable", b"unavailable".to_vec())
    } else if path == "/slow" {
        std::thread::sleep(Duration::from_secs(3));
        ("200 OK", b"late".to_vec())
    } else if path == "/big" {
        ("200 OK", vec![b'x'; 2 << 20])
    } else {
        ("404 Not Found", b"no such path".to_vec())
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(&body)?;
    stream.flush()
}
