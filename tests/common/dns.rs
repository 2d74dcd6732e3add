//! A real DNS server on loopback (UDP and TCP, one port), authoritative for `test.` from an
//! in-memory zone that the test (or `examples/dns_server.rs`) changes while pinlb runs. It runs
//! on a runtime of its own thread, stopped by [`DnsServer::stop`] or drop.

use std::net::{Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::rr::rdata::{A, SOA, SRV};
use hickory_proto::rr::{LowerName, Name, RData, Record, RecordType, RrKey};
use hickory_server::ServerFuture;
use hickory_server::authority::{Catalog, ZoneType};
use hickory_server::store::in_memory::InMemoryAuthority;

/// Every record's TTL, in seconds: short, so a change is looked up soon.
pub const TTL: u32 = 1;

/// The zone every name is under.
pub const ZONE: &str = "test.";

/// The host every SRV record points at: 127.0.0.1 (loopback only; ports tell backends apart).
pub const LOOPBACK_HOST: &str = "lo.test.";

pub struct DnsServer {
    pub addr: SocketAddr,
    authority: Arc<InMemoryAuthority>,
    /// The server's runtime, which lives on its own thread: a test's runtime may neither
    /// block on it nor drop it.
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DnsServer {
    /// Binds UDP and TCP on one port of 127.0.0.1 and starts answering for [`ZONE`], with an
    /// SOA and `lo.test. A 127.0.0.1`.
    pub fn start() -> DnsServer {
        let origin = Name::from_str(ZONE).unwrap();
        let mut authority = InMemoryAuthority::empty(origin.clone(), ZoneType::Primary, false);
        let soa = SOA::new(
            Name::from_str("ns.test.").unwrap(),
            Name::from_str("admin.test.").unwrap(),
            1,
            60,
            60,
            60,
            TTL,
        );
        authority.upsert_mut(Record::from_rdata(origin.clone(), TTL, RData::SOA(soa)), 1);
        authority.upsert_mut(
            Record::from_rdata(
                Name::from_str(LOOPBACK_HOST).unwrap(),
                TTL,
                RData::A(A(Ipv4Addr::LOCALHOST)),
            ),
            1,
        );
        let authority = Arc::new(authority);
        let mut catalog = Catalog::new();
        catalog.upsert(LowerName::new(&origin), vec![authority.clone()]);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("DNS server runtime");
            runtime.block_on(async move {
                let mut server = ServerFuture::new(catalog);
                // The same port for UDP and TCP (a truncated answer is asked again over TCP);
                // bounded tries, in case another test took the TCP port meanwhile.
                let mut bound = None;
                for _ in 0..50 {
                    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
                    let addr = udp.local_addr().unwrap();
                    if let Ok(tcp) = tokio::net::TcpListener::bind(addr).await {
                        bound = Some((udp, tcp, addr));
                        break;
                    }
                }
                let (udp, tcp, addr) = bound.expect("a free UDP and TCP port");
                server.register_socket(udp);
                server.register_listener(tcp, Duration::from_secs(5));
                let _ = ready_tx.send((addr, tokio::runtime::Handle::current()));
                let _ = stopped.await;
                let _ = server.shutdown_gracefully().await;
            });
        });
        let (addr, handle) = ready
            .recv_timeout(Duration::from_secs(10))
            .expect("the DNS server started");
        DnsServer {
            addr,
            authority,
            handle,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Replaces `name`'s SRV records: one per port, each pointing at [`LOOPBACK_HOST`] with its
    /// weight, all of priority 10.
    pub fn set_srv(&self, name: &str, ports: &[(u16, u16)]) {
        let owner = Name::from_str(name).unwrap();
        let records = ports
            .iter()
            .map(|&(port, weight)| {
                let srv = SRV::new(10, weight, port, Name::from_str(LOOPBACK_HOST).unwrap());
                Record::from_rdata(owner.clone(), TTL, RData::SRV(srv))
            })
            .collect();
        self.replace(owner, RecordType::SRV, records);
    }

    /// Replaces `name`'s A records.
    pub fn set_a(&self, name: &str, ips: &[Ipv4Addr]) {
        let owner = Name::from_str(name).unwrap();
        let records = ips
            .iter()
            .map(|&ip| Record::from_rdata(owner.clone(), TTL, RData::A(A(ip))))
            .collect();
        self.replace(owner, RecordType::A, records);
    }

    fn replace(&self, owner: Name, kind: RecordType, records: Vec<Record>) {
        let authority = self.authority.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        // On the server's own runtime; this thread only waits for it, briefly.
        self.handle.spawn(async move {
            let key = RrKey::new(LowerName::new(&owner), kind);
            authority.records_mut().await.remove(&key);
            let serial = authority.serial().await + 1;
            for r in records {
                authority.upsert(r, serial).await;
            }
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(5))
            .expect("the zone was updated");
    }

    /// Stops answering: the ports close, so lookups fail at once (UDP: port unreachable).
    pub fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop();
    }
}
