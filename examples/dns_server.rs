//! A DNS server on loopback whose SRV set changes on a clock, for `benches/dns.sh`.
//!
//! ```text
//! dns_server NAME EVERY FOR PORT...
//! ```
//!
//! Answers for `test.` on one UDP and TCP port of 127.0.0.1 (tests/common/dns.rs, the tests'
//! own server) and prints `listening on ADDR` on stdout. NAME (e.g. `_http._tcp.app.test.`)
//! gets SRV records pointing at 127.0.0.1, first at every PORT; then every EVERY (`2s`), for
//! FOR (`60s`), the set moves on: one port leaves and the one that left before comes back, so
//! each change removes a backend and adds one. Prints `changes N` when done and exits.

#[path = "../tests/common/dns.rs"]
#[allow(dead_code)]
mod dns;

use std::io::Write as _;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: dns_server NAME EVERY FOR PORT... (dns_server _http._tcp.app.test. 2s 60s 8881 8882 8883)";
    let (Some(name), Some(every), Some(total)) = (args.first(), args.get(1), args.get(2)) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let every = humantime::parse_duration(every).expect("EVERY, such as 2s");
    let total = humantime::parse_duration(total).expect("FOR, such as 60s");
    let ports: Vec<u16> = args[3..].iter().map(|p| p.parse().expect("PORT")).collect();
    assert!(
        ports.len() >= 2,
        "{usage}: at least two ports, so one can leave"
    );
    let server = dns::DnsServer::start();
    let all: Vec<(u16, u16)> = ports.iter().map(|&p| (p, 1)).collect();
    server.set_srv(name, &all);
    println!("listening on {}", server.addr);
    let _ = std::io::stdout().flush();

    let start = Instant::now();
    let mut changes = 0usize;
    while start.elapsed() + every <= total {
        std::thread::sleep(every);
        // Change k leaves out port k mod n: the one left out before comes back.
        let out = changes % ports.len();
        let set: Vec<(u16, u16)> = all
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != out)
            .map(|(_, p)| *p)
            .collect();
        server.set_srv(name, &set);
        changes += 1;
        eprintln!(
            "{:>5.1}s: SRV {name} -> {:?}",
            start.elapsed().as_secs_f64(),
            set.iter().map(|p| p.0).collect::<Vec<_>>()
        );
    }
    std::thread::sleep(total.saturating_sub(start.elapsed()));
    println!("changes {changes}");
    drop(server);
}
