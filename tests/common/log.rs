//! Access logs: a log file in a fresh temporary path, its `[log]` table, and its lines once the
//! proxy has stopped; and [`LogLine`], the fields the tests of every protocol compare.

use std::path::{Path, PathBuf};

use super::{Proto, Proxy, Setup, WAIT, temp_config};

/// A log file in a fresh temporary path, and the `[log]` table writing `format` to it.
pub fn log_table(format: &str) -> (PathBuf, String) {
    let path = temp_config("");
    let table = format!(
        "[log]\naccess = \"{}\"\nformat = '{format}'\n",
        path.display()
    );
    (path, table)
}

/// `setup` with an access log in `format`, and the log's path.
pub fn with_log(mut setup: Setup, format: &str) -> (Setup, PathBuf) {
    let (path, table) = log_table(format);
    setup.extra += &table;
    (setup, path)
}

/// `setup` with an access log in nginx's combined format, and the log's path.
pub fn with_combined_log(setup: Setup) -> (Setup, PathBuf) {
    with_log(setup, "combined")
}

/// The log's lines once the proxy has stopped (its log thread writes everything queued); the
/// file is removed.
pub async fn lines_after(proxy: Proxy, path: &Path) -> Vec<String> {
    proxy.join(WAIT).await.unwrap();
    let text = std::fs::read_to_string(path).unwrap();
    let _ = std::fs::remove_file(path);
    text.lines().map(str::to_string).collect()
}

/// One line of the log format [`LogLine::FORMAT`]: what a request's line must say whichever
/// protocol carried it, and the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub method: String,
    pub uri: String,
    pub protocol: String,
    pub status: u16,
    pub bytes: u64,
    /// The backend that answered, `-` for an answer of pinlb's own.
    pub upstream: String,
    /// `-` when requests have no IDs.
    pub request_id: String,
}

impl LogLine {
    /// The template whose lines [`LogLine::parse`] reads.
    pub const FORMAT: &str = "{request_method} {request_uri} {server_protocol} {status} {body_bytes_sent} {upstream_addr} {request_id}";

    pub fn parse(line: &str) -> LogLine {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 7, "not a line of {}: {line}", LogLine::FORMAT);
        LogLine {
            method: f[0].to_string(),
            uri: f[1].to_string(),
            protocol: f[2].to_string(),
            status: f[3].parse().unwrap_or_else(|_| panic!("a status: {line}")),
            bytes: f[4].parse().unwrap_or_else(|_| panic!("bytes: {line}")),
            upstream: f[5].to_string(),
            request_id: f[6].to_string(),
        }
    }

    /// `method target status bytes upstream`: the line less the protocol and the request ID,
    /// which tests compare on their own.
    pub fn request(&self) -> String {
        format!(
            "{} {} {} {} {}",
            self.method, self.uri, self.status, self.bytes, self.upstream
        )
    }
}

/// `setup` with an access log of [`LogLine::FORMAT`], and the log's path.
pub fn with_fields_log(setup: Setup) -> (Setup, PathBuf) {
    with_log(setup, LogLine::FORMAT)
}

/// The lines of a [`with_fields_log`] log once the proxy has stopped, each checked to name
/// `proto`'s protocol.
pub async fn log_lines(proxy: Proxy, path: &Path, proto: Proto) -> Vec<LogLine> {
    let lines: Vec<LogLine> = lines_after(proxy, path)
        .await
        .iter()
        .map(|l| LogLine::parse(l))
        .collect();
    for l in &lines {
        assert_eq!(l.protocol, proto.log_protocol(), "{l:?}");
    }
    lines
}
