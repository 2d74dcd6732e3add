//! Each backend's learned concurrency limit (pinlb's `adaptive`), read from the `GET /status`
//! of a pinlb target's admin listener at the end of each of its recorded windows: where the
//! load of that window left it, shown beside each backend's CPU per request. Read between
//! windows, never during one. A target that is not pinlb, or whose admin listener is not known
//! (a URL given to `bench`), has none.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One target's limits, round by round.
#[derive(Debug)]
pub(super) struct Limits {
    status: Option<SocketAddr>,
    rounds: Vec<Vec<Option<usize>>>,
}

impl Limits {
    pub(super) fn new(status: Option<SocketAddr>) -> Limits {
        Limits {
            status,
            rounds: Vec::new(),
        }
    }

    /// A recorded window ended: each backend's limit now. A `/status` that does not answer
    /// leaves that round out.
    pub(super) fn window_ended(&mut self) {
        if let Some(limits) = self.status.and_then(|a| read(a).ok()) {
            self.rounds.push(limits);
        }
    }

    /// Each backend's median over the rounds read (the higher of the middle two for an even
    /// count); `None` for one that learned none in any; empty when nothing was read.
    pub(super) fn medians(&self) -> Vec<Option<usize>> {
        let backends = self.rounds.iter().map(Vec::len).max().unwrap_or(0);
        (0..backends)
            .map(|i| {
                let mut seen: Vec<usize> = self
                    .rounds
                    .iter()
                    .filter_map(|r| r.get(i).copied().flatten())
                    .collect();
                seen.sort_unstable();
                seen.get(seen.len() / 2).copied()
            })
            .collect()
    }
}

/// The learned limit of each backend of pinlb's first upstream, in order (`bench --proxy` and
/// `sweep` give it one, their backends in the order given), from `GET /status` on its admin
/// listener at `admin`; `None` for a backend that learns none.
pub fn read(admin: SocketAddr) -> std::io::Result<Vec<Option<usize>>> {
    let limit = Duration::from_secs(2);
    let mut s = TcpStream::connect_timeout(&admin, limit)?;
    s.set_read_timeout(Some(limit))?;
    s.set_write_timeout(Some(limit))?;
    s.write_all(
        format!("GET /status HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut reply = Vec::new();
    // Bounded by the read timeout and the admin listener's own bound on a connection.
    s.take(16 << 20).read_to_end(&mut reply)?;
    let bad = |why: &str| std::io::Error::other(format!("GET /status on {admin}: {why}"));
    let at = reply
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of the response head"))?;
    if !reply.starts_with(b"HTTP/1.1 200 ") {
        return Err(bad("not a 200"));
    }
    let status: serde_json::Value =
        serde_json::from_slice(&reply[at + 4..]).map_err(|e| bad(&e.to_string()))?;
    Ok(of_status(&status))
}

/// The limits in a `/status` answer: its first upstream's backends' `concurrency_limit`.
fn of_status(status: &serde_json::Value) -> Vec<Option<usize>> {
    status["upstreams"][0]["backends"]
        .as_array()
        .map(|bs| {
            bs.iter()
                .map(|b| {
                    b["concurrency_limit"]
                        .as_u64()
                        .and_then(|l| usize::try_from(l).ok())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Each backend's limit joined with ", ", "–" for one that learns none; "–" alone when none
/// is known.
pub fn limit_list(v: &[Option<usize>]) -> String {
    if v.iter().all(Option::is_none) {
        return "–".into();
    }
    v.iter()
        .map(|l| l.map_or_else(|| "–".into(), |l| l.to_string()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Answers one connection with `status` and `body` as pinlb's admin listener would.
    fn admin_answering(status: &'static str, body: &'static str) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut head = [0u8; 1024];
            let n = c.read(&mut head).unwrap();
            assert!(head[..n].starts_with(b"GET /status HTTP/1.1\r\n"));
            let reply = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            c.write_all(reply.as_bytes()).unwrap();
        });
        addr
    }

    #[test]
    fn each_backends_limit_is_read_from_status_in_order() {
        let admin = admin_answering(
            "200 OK",
            r#"{"upstreams":[{"name":"app","backends":[{"concurrency_limit":17},{"concurrency_limit":null,"max_conns":8}]}]}"#,
        );
        assert_eq!(read(admin).unwrap(), [Some(17), None]);
        // An admin listener with a token (bench does not know it) answers 401: the round is
        // left out.
        let refused = admin_answering("401 Unauthorized", "401 Unauthorized\n");
        assert!(read(refused).is_err());
        let refused = admin_answering("401 Unauthorized", "401 Unauthorized\n");
        let mut limits = Limits::new(Some(refused));
        limits.window_ended();
        assert!(limits.medians().is_empty());
        assert_eq!(limit_list(&limits.medians()), "–");
    }

    #[test]
    fn the_median_of_the_rounds_is_shown_per_backend() {
        let mut limits = Limits::new(None);
        limits.rounds = vec![
            vec![Some(20), None],
            vec![Some(9), None],
            vec![Some(11), None],
            vec![Some(40), None],
        ];
        assert_eq!(limits.medians(), [Some(20), None]);
        assert_eq!(limit_list(&limits.medians()), "20, –");
        limits.rounds.truncate(3);
        assert_eq!(limits.medians(), [Some(11), None]);
    }
}
