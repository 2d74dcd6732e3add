//! The active health check of a FastCGI upstream: a `GET` of the health path as a FastCGI
//! request on a connection of its own (without FCGI_KEEP_CONN, so the application closes it),
//! whose CGI `Status:` is the probe's status. php-fpm answers its `ping.path` (`/ping` →
//! `pong`) and `pm.status_path` itself, without running a script.

use std::future::poll_fn;
use std::net::SocketAddr;

use crate::backend_address::BackendAddress;

use bytes::BytesMut;

use crate::config::{Fastcgi, Health};
use crate::fastcgi::params::{self, Scripts};
use crate::fastcgi::record::{self, Record};
use crate::fastcgi::response;
use crate::http1::client::connect;
use crate::tls::client::Connector;

/// The probe's request ID (its connection carries no other).
const ID: u16 = 1;

/// The probe over FastCGI; the response's status. Without `fastcgi` (a spawned backend's
/// probe), the script is the health path itself.
pub(crate) async fn exchange(
    addr: BackendAddress,
    health: &Health,
    tls: Option<&Connector>,
    first: &[u8],
    fastcgi: Option<&Fastcgi>,
) -> Result<u16, String> {
    let mut conn = connect(addr, health.timeout, tls, first)
        .await
        .map_err(|e| e.cause)?;
    let host = health.host.clone().unwrap_or_else(|| addr.host());
    let root = fastcgi.map_or("", |f| f.root.as_str());
    let scripts = Scripts {
        root,
        index: fastcgi.map_or(Fastcgi::INDEX, |f| f.index.as_str()),
        script: fastcgi.and_then(|f| f.script.as_deref()),
        split: fastcgi
            .and_then(|f| f.split_path_info.as_ref())
            .map(|s| &s.0),
    };
    let script = scripts.script(health.path.as_bytes());
    let request = params::Request {
        method: "GET",
        target: health.path.as_bytes(),
        host: host.as_bytes(),
        lines: b"user-agent: pinlb-health\r\n",
        content_length: None,
        protocol: "HTTP/1.1",
        https: false,
        client: SocketAddr::from(([127, 0, 0, 1], 0)),
        // A socket backend has no address of its own to name: loopback, port 0, as the client.
        server: addr.tcp().unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
    };
    let mut pairs = Vec::new();
    let extra = fastcgi.map_or(&[][..], |f| &f.params[..]);
    params::encode(&mut pairs, &request, root, &script, extra);
    let mut out = Vec::with_capacity(pairs.len() + 64);
    record::begin_request(&mut out, ID, false);
    record::stream(&mut out, record::PARAMS, ID, &pairs);
    record::stream(&mut out, record::STDIN, ID, b"");
    let mut bufs = [std::io::IoSlice::new(&out)];
    conn.write_all_within(&mut bufs, health.timeout)
        .await
        .map_err(|e| format!("sending the probe failed: {e}"))?;
    let mut stdout = BytesMut::new();
    // Bounded by what the backend sends, and by the probe's timeout around it.
    loop {
        match record::decode(conn.read_buf(), ID) {
            Ok(Some(Record::Stdout(data))) => stdout.extend_from_slice(&data),
            Ok(Some(Record::End { .. })) => break,
            Ok(Some(_)) => {}
            Ok(None) => {
                let n = poll_fn(|cx| conn.poll_fill(cx))
                    .await
                    .map_err(|e| format!("reading the answer failed: {e}"))?;
                if n == 0 {
                    return Err(
                        "the FastCGI application closed the connection before ending the request"
                            .into(),
                    );
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    match response::parse(&stdout) {
        Ok(Some((head, _))) => Ok(head.status.as_u16()),
        Ok(None) => Err("the FastCGI answer had no whole CGI head".into()),
        Err(e) => Err(e.to_string()),
    }
}
