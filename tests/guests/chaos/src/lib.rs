//! Test plugin: logs `handled data=<data> attempt=<n>` for every call, then
//! misbehaves as the record's data asks:
//! - `trap…`: panics (a trap); `loop…`: loops forever; `alloc…`: allocates
//!   without bound; `flood…`: logs 10,000 lines; `reject…`: rejects;
//! - `caps`: tries to read `/etc/hostname` and `/data/hello.txt`, the
//!   environment variable `SHARDLANE_TEST_VAR`, and a TCP connection to
//!   127.0.0.1:9, logging `caps file=… preopen=… env=… socket=…`;
//! - anything else: acks.

wit_bindgen::generate!({
    world: "record-handler",
    path: "../../../wit/v0.1.0",
});

use shardlane::plugin::log::{Level, log};

struct Chaos;

fn probe<T, E: std::fmt::Display>(r: Result<T, E>, show: impl Fn(T) -> String) -> String {
    match r {
        Ok(v) => format!("ok({})", show(v)),
        Err(e) => format!("denied({e})").replace(' ', "_"),
    }
}

impl Guest for Chaos {
    fn handle(record: KinesisRecord) -> Outcome {
        let data = String::from_utf8_lossy(&record.data).into_owned();
        log(
            Level::Info,
            &format!("handled data={data} attempt={}", record.attempt),
        );
        if data.starts_with("trap") {
            panic!("asked to trap");
        } else if data.starts_with("loop") {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        } else if data.starts_with("alloc") {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1u8; 1 << 20]);
                std::hint::black_box(&hoard);
            }
        } else if data.starts_with("flood") {
            for i in 0..10_000 {
                log(Level::Info, &format!("flood line {i}"));
            }
        } else if data.starts_with("reject") {
            return Outcome::Reject(format!("{data} is never valid"));
        } else if data == "caps" {
            let file = probe(std::fs::read_to_string("/etc/hostname"), |s| {
                s.trim().to_owned()
            });
            let preopen = probe(std::fs::read_to_string("/data/hello.txt"), |s| {
                s.trim().to_owned()
            });
            let env = probe(std::env::var("SHARDLANE_TEST_VAR"), |s| s);
            let socket = probe(std::net::TcpStream::connect("127.0.0.1:9"), |_| {
                "connected".to_owned()
            });
            log(
                Level::Info,
                &format!("caps file={file} preopen={preopen} env={env} socket={socket}"),
            );
        }
        Outcome::Ack
    }
}

export!(Chaos);
