//! A small real OTLP/HTTP receiver on a free loopback port: it takes
//! `POST /v1/traces` (protobuf `ExportTraceServiceRequest`, as the OTLP
//! exporters send it), answers 200 with an empty
//! `ExportTraceServiceResponse`, and keeps every span it was sent, decoded
//! with `opentelemetry-proto`'s messages.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message as _;

/// One span as received, with its resource's attributes.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// The span's name.
    pub name: String,
    /// Its kind (OTLP's number: 5 is consumer).
    pub kind: i32,
    /// Its attributes, string-valued (others as their debug form).
    pub attributes: Vec<(String, String)>,
    /// Its resource's attributes, likewise.
    pub resource: Vec<(String, String)>,
}

impl ReceivedSpan {
    /// The attribute `key`, if set.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        find(&self.attributes, key)
    }

    /// The resource attribute `key`, if set.
    pub fn resource_attribute(&self, key: &str) -> Option<&str> {
        find(&self.resource, key)
    }
}

fn find<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// A running receiver; stops accepting when dropped.
pub struct OtlpReceiver {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

impl OtlpReceiver {
    /// Starts on a free loopback port.
    ///
    /// # Errors
    /// When no port can be bound.
    pub fn start() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let spans: Arc<Mutex<Vec<ReceivedSpan>>> = Arc::default();
        let (stopping, kept) = (stop.clone(), spans.clone());
        std::thread::Builder::new()
            .name("test-otlp".into())
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let kept = kept.clone();
                            std::thread::spawn(move || {
                                let _ = serve(stream, &kept);
                            });
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })?;
        Ok(Self { addr, stop, spans })
    }

    /// `http://127.0.0.1:PORT`: the collector's base URL.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn text(value: Option<&Value>) -> String {
    match value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(n)) => n.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn pairs(attributes: &[KeyValue]) -> Vec<(String, String)> {
    attributes
        .iter()
        .map(|kv| {
            (
                kv.key.clone(),
                text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
            )
        })
        .collect()
}

/// Serves requests on one connection until it closes (keep-alive).
fn serve(stream: TcpStream, spans: &Mutex<Vec<ReceivedSpan>>) -> anyhow::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut stream = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse()?;
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        let path = request_line.split_whitespace().nth(1).unwrap_or("/");
        let status = if path == "/v1/traces" {
            let request = ExportTraceServiceRequest::decode(body.as_slice())?;
            let mut kept = spans.lock().unwrap_or_else(|e| e.into_inner());
            for resource_spans in request.resource_spans {
                let resource = resource_spans
                    .resource
                    .map(|r| pairs(&r.attributes))
                    .unwrap_or_default();
                for scope in resource_spans.scope_spans {
                    for span in scope.spans {
                        kept.push(ReceivedSpan {
                            name: span.name,
                            kind: span.kind,
                            attributes: pairs(&span.attributes),
                            resource: resource.clone(),
                        });
                    }
                }
            }
            "200 OK"
        } else {
            "404 Not Found"
        };
        write!(
            stream,
            "HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n"
        )?;
        stream.flush()?;
    }
}
