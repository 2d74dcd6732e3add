//! `openssl s_server` as a TLS backend with a certificate of its own, for the tests of TLS
//! passed through TCP listeners: a client that sees this certificate reached it untouched.

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{Cert, poll};

/// An `openssl s_server -www` with one certificate; killed on drop.
pub struct TlsServer {
    pub addr: SocketAddr,
    child: Child,
}

impl TlsServer {
    /// Serves `cert` on a free port, once it accepts connections.
    pub async fn start(cert: &Cert) -> TlsServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        TlsServer::on(port, cert).await
    }

    /// Serves `cert` on 127.0.0.1:`port`, once it accepts connections.
    pub async fn on(port: u16, cert: &Cert) -> TlsServer {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let child = Command::new("openssl")
            .args(["s_server", "-quiet", "-www", "-accept"])
            .arg(addr.to_string())
            .arg("-cert")
            .arg(&cert.cert)
            .arg("-key")
            .arg(&cert.key)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run openssl s_server");
        let server = TlsServer { addr, child };
        poll(100, Duration::from_millis(50), async || {
            tokio::net::TcpStream::connect(addr).await.ok().map(|_| ())
        })
        .await
        .expect("openssl s_server accepts connections");
        server
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
