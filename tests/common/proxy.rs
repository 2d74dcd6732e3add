//! pinlb run in process: a [`pinlb::Server`] on its own thread (with its own runtimes, on real
//! time), its admin listener, and `/metrics` scrapes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::{Method, StatusCode};
use tokio::sync::oneshot;

use super::{Conn, Reply, Setup, allowed, empty, request, temp_config};

/// A `pinlb::Server` running on its own thread until [`Proxy::shutdown`] or drop.
pub struct Proxy {
    /// The first listener's address.
    pub addr: SocketAddr,
    /// Every listener's address, in config order.
    pub addrs: Vec<SocketAddr>,
    /// The admin listener's address, when the config has `[admin]`.
    pub admin: Option<SocketAddr>,
    /// The config file a reload reads, for [`Proxy::start_file`].
    pub config: Option<PathBuf>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), pinlb::ServerError>>>,
}

impl Proxy {
    pub fn start(setup: &Setup) -> Proxy {
        Proxy::start_toml(&setup.toml())
    }

    pub fn start_toml(toml: &str) -> Proxy {
        let config = pinlb::Config::parse("test.toml", toml, &allowed())
            .unwrap_or_else(|e| panic!("{e}\n{toml}"));
        Proxy::run_server(pinlb::Server::bind(config).expect("bind proxy"), None)
    }

    /// Like [`Proxy::start_toml`], from a file that `POST /reload` reads again; rewrite it with
    /// [`Proxy::rewrite`].
    pub fn start_file(toml: &str) -> Proxy {
        let path = temp_config(toml);
        let config = pinlb::Config::load(&path).unwrap_or_else(|e| panic!("{e}\n{toml}"));
        let server = pinlb::Server::bind(config)
            .expect("bind proxy")
            .reload_from(path.clone());
        Proxy::run_server(server, Some(path))
    }

    /// Replaces the config file's text (for a reload).
    pub fn rewrite(&self, toml: &str) {
        std::fs::write(self.config.as_ref().expect("started from a file"), toml)
            .expect("rewrite config");
    }

    /// A request to the admin listener; `token` adds `Authorization: Bearer`.
    pub async fn admin(&self, method: Method, path: &str, token: Option<&str>) -> Reply {
        let addr = self.admin.expect("the config has [admin]");
        let mut req = request(method, path, empty());
        if let Some(t) = token {
            req.headers_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        Conn::open(addr).await.fetch(req).await
    }

    /// `GET /metrics`, without a token.
    pub async fn metrics(&self) -> Metrics {
        let r = self.admin(Method::GET, "/metrics", None).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        Metrics(r.body)
    }

    /// `GET /status` as JSON, without a token.
    pub async fn status(&self) -> serde_json::Value {
        let r = self.admin(Method::GET, "/status", None).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        serde_json::from_str(&r.body).expect("status is JSON")
    }

    fn run_server(server: pinlb::Server, config: Option<PathBuf>) -> Proxy {
        let admin = server.admin_addr();
        let addrs = server.local_addrs().to_vec();
        let addr = addrs[0];
        let (tx, rx) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            server.run(async move {
                let _ = rx.await;
            })
        });
        Proxy {
            addr,
            addrs,
            admin,
            config,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    /// Asks the server to stop; it drains in the background.
    pub fn trigger_shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    /// Waits (bounded) for `run` to return, and returns its result.
    pub async fn join(mut self, limit: Duration) -> Result<(), pinlb::ServerError> {
        self.trigger_shutdown();
        let thread = self.thread.take().unwrap();
        // A plain thread rather than spawn_blocking: if `run` never returns, the test fails
        // instead of its runtime waiting forever for the blocking task on the way out.
        let (tx, rx) = oneshot::channel();
        std::thread::spawn(move || {
            let _ = tx.send(thread.join());
        });
        tokio::time::timeout(limit, rx)
            .await
            .unwrap_or_else(|_| panic!("Server::run did not return within {limit:?}"))
            .unwrap()
            .expect("server thread panicked")
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // The thread drains on its own; the test does not wait for it.
        self.trigger_shutdown();
    }
}

/// A `/metrics` scrape.
pub struct Metrics(pub String);

impl Metrics {
    /// The value of the sample `name{labels}` (`labels` exactly as rendered, e.g.
    /// `upstream="app",backend="127.0.0.1:1"`, or empty for none); `None` when absent.
    pub fn get(&self, name: &str, labels: &str) -> Option<f64> {
        let key = if labels.is_empty() {
            format!("{name} ")
        } else {
            format!("{name}{{{labels}}} ")
        };
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(&key))
            .map(|v| v.trim().parse().expect("a number"))
    }

    /// Like [`Metrics::get`], failing the test when the sample is missing.
    pub fn value(&self, name: &str, labels: &str) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no sample {name}{{{labels}}} in:\n{}", self.0))
    }
}
