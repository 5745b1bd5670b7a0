//! Test plugin: logs `enter data=<data>`, sleeps for the milliseconds given
//! by a `sleep=<ms>;` prefix of the data (through WASI clocks, so the host
//! can run other lanes meanwhile), logs `exit data=<data>` and acks.

wit_bindgen::generate!({
    world: "record-handler",
    path: "../../../wit/v0.1.0",
});

use shardlane::plugin::log::{Level, log};

struct Slow;

fn sleep_ms(data: &str) -> u64 {
    data.strip_prefix("sleep=")
        .and_then(|rest| rest.split(';').next())
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(0)
}

impl Guest for Slow {
    fn handle(record: KinesisRecord) -> Outcome {
        let data = String::from_utf8_lossy(&record.data);
        log(Level::Info, &format!("enter data={data}"));
        let ms = sleep_ms(&data);
        if ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        log(Level::Info, &format!("exit data={data}"));
        Outcome::Ack
    }
}

export!(Slow);
