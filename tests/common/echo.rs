//! Echo backends for the TCP and UDP listeners' tests: each on a kernel-chosen port of
//! `127.0.0.1`, served until the test's runtime ends.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A TCP backend that writes `greeting` and a newline to each connection (when there is one),
/// then echoes what it reads until the client closes.
pub async fn tcp_echo(greeting: Option<&'static str>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        // Bounded by the test: the runtime ends with it.
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Some(name) = greeting {
                    let _ = s.write_all(format!("{name}\n").as_bytes()).await;
                }
                let mut buf = [0u8; 1024];
                // Bounded: each pass reads at least a byte, or ends at the client's close.
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

/// A UDP backend that answers each datagram with itself.
pub async fn udp_echo() -> SocketAddr {
    let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = s.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        // Bounded by the test: the runtime ends with it.
        while let Ok((n, from)) = s.recv_from(&mut buf).await {
            let _ = s.send_to(&buf[..n], from).await;
        }
    });
    addr
}

/// Writes `msg` on `c` and reads its echo back, within `WAIT`.
pub async fn echoed(c: &mut tokio::net::TcpStream, msg: &[u8]) -> Vec<u8> {
    c.write_all(msg).await.unwrap();
    let mut back = vec![0u8; msg.len()];
    tokio::time::timeout(super::WAIT, c.read_exact(&mut back))
        .await
        .expect("echoed in time")
        .unwrap();
    back
}
