//! Talking to a host's admin server: one HTTP/1.1 request over a plain
//! socket (no client crate needed for loopback requests in tests), and
//! reading counters from its `/metrics` text.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;

/// One HTTP/1.1 request to `addr`; returns (status, body).
///
/// # Panics
/// When the server cannot be reached or answers something that is not
/// HTTP: a test or benchmark cannot go on without it.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to admin");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .expect("send the request head");
    stream.write_all(body).expect("send the request body");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).expect("read the answer");
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The sum of every sample of metric `name` (any labels) whose labels
/// contain each of `labels` (`key="value"` text) in a `/metrics` page.
pub fn metric_sum(page: &str, name: &str, labels: &[&str]) -> f64 {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            (metric == name && labels.iter().all(|want| rest.contains(want)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::metric_sum;

    #[test]
    fn sums_the_samples_whose_labels_match() {
        let page = "# TYPE a counter\na{s=\"x\",o=\"ack\"} 3\na{s=\"x\",o=\"retry\"} 1\na{s=\"y\",o=\"ack\"} 2\nab{s=\"x\"} 9\na 4\n";
        assert_eq!(metric_sum(page, "a", &["o=\"ack\""]), 5.0);
        assert_eq!(metric_sum(page, "a", &[]), 10.0);
        assert_eq!(metric_sum(page, "ab", &[]), 9.0);
    }
}
