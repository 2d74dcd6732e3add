//! MariaDB through a TCP listener: the `mariadb` client runs a query through pinlb, and a
//! `mariadbd` that is stopped is taken out by the upstream's active check (`check = "mysql"`,
//! which reads the server's greeting) and put back when it returns on the same port; a server
//! that greets with an error packet fails the check.

use crate::common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

/// A throwaway `mariadbd`: its own data directory, socket and port; killed on drop.
struct Mariadb {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Mariadb {
    /// A data directory made by `mariadb-install-db`, and the server on a free port.
    async fn start(dir: &Path) -> Mariadb {
        let data = dir.join("data");
        let made = Command::new("mariadb-install-db")
            .args(["--no-defaults", "--user=root", "--skip-test-db"])
            .arg(format!("--datadir={}", data.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run mariadb-install-db (apt-get install mariadb-server)");
        assert!(made.success(), "mariadb-install-db failed");
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut db = Mariadb {
            port,
            dir: dir.to_path_buf(),
            child: None,
        };
        db.run().await;
        db
    }

    /// Starts the server (again) on its port, once a client gets an answer from it.
    async fn run(&mut self) {
        let child = Command::new("mariadbd")
            .args(["--no-defaults", "--user=root", "--skip-grant-tables"])
            .args(["--bind-address=127.0.0.1", "--skip-log-error"])
            .arg(format!("--datadir={}", self.dir.join("data").display()))
            .arg(format!("--socket={}", self.dir.join("sock").display()))
            .arg(format!("--port={}", self.port))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run mariadbd");
        self.child = Some(child);
        let port = self.port;
        poll(300, Duration::from_millis(50), async || {
            (query(port, "select 1").await.as_deref() == Some("1")).then_some(())
        })
        .await
        .expect("mariadbd answers");
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Mariadb {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The `mariadb` client's answer to `sql` at 127.0.0.1:`port` (batch mode, no column names),
/// `None` when it failed.
async fn query(port: u16, sql: &'static str) -> Option<String> {
    let out = tokio::task::spawn_blocking(move || {
        Command::new("mariadb")
            .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root", "-N", "-B"])
            .arg(format!("-P{port}"))
            .args(["--connect-timeout=2", "-e", sql])
            .output()
            .expect("run mariadb (apt-get install mariadb-client)")
    })
    .await
    .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Whether `/status` says the one backend of upstream `db` is up.
async fn up(proxy: &Proxy) -> bool {
    let status = proxy.status().await;
    let backends = status["upstreams"][0]["backends"].as_array().cloned();
    let first = backends
        .and_then(|b| b.first().cloned())
        .unwrap_or_default();
    first["health"].as_str() == Some("up")
}

#[tokio::test]
async fn a_mariadb_query_goes_through_and_a_stopped_server_is_taken_out_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut db = Mariadb::start(dir.path()).await;
    let toml = format!(
        "[[listener]]\naddress = \"127.0.0.1:0\"\nmode = \"tcp\"\nupstream = \"db\"\n\
         [upstream.db]\nbackends = [{{ address = \"127.0.0.1:{}\" }}]\n\
         [upstream.db.health]\ncheck = \"mysql\"\ninterval = \"200ms\"\ntimeout = \"150ms\"\nrise = 1\nfall = 1\n\
         [admin]\naddress = \"127.0.0.1:0\"\n",
        db.port
    );
    let proxy = Proxy::start_toml(&toml);
    let port = proxy.addr.port();
    assert_eq!(
        query(port, "select 6 * 7").await.as_deref(),
        Some("42"),
        "a query through pinlb"
    );
    let status = proxy.status().await;
    assert!(up(&proxy).await, "up at first: {status}");

    db.stop();
    poll(100, Duration::from_millis(50), async || {
        (!up(&proxy).await).then_some(())
    })
    .await
    .expect("taken out by its check once stopped");
    assert_eq!(query(port, "select 1").await, None, "nothing answers");

    db.run().await;
    poll(100, Duration::from_millis(50), async || {
        up(&proxy).await.then_some(())
    })
    .await
    .expect("put back by its check once it answers again");
    assert_eq!(query(port, "select 1 + 1").await.as_deref(), Some("2"));
}

#[tokio::test]
async fn a_server_that_greets_with_an_error_packet_fails_the_mysql_check() {
    // What a MySQL server sends a client it will not take: an error packet, 1040 Too many
    // connections, then the close.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let message = b"#08004Too many connections";
        let mut payload = vec![0xff, 0x10, 0x04];
        payload.extend_from_slice(message);
        let len = payload.len() as u32;
        let mut packet = len.to_le_bytes()[..3].to_vec();
        packet.push(0);
        packet.extend_from_slice(&payload);
        // Bounded by the test: the runtime ends with it.
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.write_all(&packet).await;
        }
    });
    let toml = format!(
        "[[listener]]\naddress = \"127.0.0.1:0\"\nmode = \"tcp\"\nupstream = \"db\"\n\
         [upstream.db]\nbackends = [{{ address = \"{addr}\" }}]\n\
         [upstream.db.health]\ncheck = \"mysql\"\ninterval = \"200ms\"\ntimeout = \"150ms\"\nrise = 1\nfall = 1\n\
         [admin]\naddress = \"127.0.0.1:0\"\n"
    );
    let proxy = Proxy::start_toml(&toml);
    poll(100, Duration::from_millis(50), async || {
        (!up(&proxy).await).then_some(())
    })
    .await
    .expect("taken out by the mysql check");
}

#[test]
fn a_check_by_name_is_one_of_three_and_not_with_send() {
    let parse = |health: &str| {
        let toml = format!(
            "[[listener]]\naddress = \"127.0.0.1:0\"\nmode = \"tcp\"\nupstream = \"db\"\n\
             [upstream.db]\nbackends = [{{ address = \"127.0.0.1:1\" }}]\n\
             [upstream.db.health]\n{health}\n"
        );
        pinlb::Config::parse("test.toml", &toml, &allowed()).map(|_| ())
    };
    assert!(parse("check = \"redis\"").is_ok());
    let e = parse("check = \"pgsql\"").unwrap_err().to_string();
    assert!(
        e.contains("test.toml:8:")
            && e.contains("upstream.db.health.check")
            && e.contains("\"connect\", \"redis\" or \"mysql\""),
        "{e}"
    );
    let e = parse("check = \"mysql\"\nsend = \"x\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected one of them"), "{e}");
}
