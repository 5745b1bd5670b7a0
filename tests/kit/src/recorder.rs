//! A loopback HTTP/1.1 server that records every request it gets (head and
//! body) and answers each with one fixed response: how a test sees what the
//! real AWS SDK in the host sends (which credentials signed a call, which
//! role it asked STS for) without a service that checks it.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A running recorder; stops accepting when dropped.
pub struct Recorder {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    /// Starts on a free loopback port, answering every request with
    /// `status` and `body` (of `content_type`).
    ///
    /// # Errors
    /// When no port can be bound.
    pub fn start(status: u16, content_type: &str, body: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let requests: Arc<Mutex<Vec<String>>> = Arc::default();
        let answer = format!(
            "HTTP/1.1 {status} Answer\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let (stopping, seen) = (stop.clone(), requests.clone());
        std::thread::Builder::new()
            .name("recorder".into())
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    let Ok((stream, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut reader = BufReader::new(stream);
                    let mut head = String::new();
                    let mut length = 0usize;
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                            break;
                        }
                        if let Some((k, v)) = line.split_once(':')
                            && k.trim().eq_ignore_ascii_case("content-length")
                        {
                            length = v.trim().parse().unwrap_or(0);
                        }
                        head.push_str(&line);
                    }
                    let mut body = vec![0u8; length.min(1 << 20)];
                    let _ = reader.read_exact(&mut body);
                    seen.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(format!("{head}\r\n{}", String::from_utf8_lossy(&body)));
                    let _ = reader.get_mut().write_all(answer.as_bytes());
                }
            })?;
        Ok(Self {
            addr,
            stop,
            requests,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request so far: its head, a blank line, its body.
    pub fn requests(&self) -> Vec<String> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
