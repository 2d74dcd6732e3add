//! Arbitrary bytes as what a FastCGI application sends back, through pinlb's hand-written
//! FastCGI codec: records decoded off a read buffer (`fastcgi::record::decode`), their
//! FCGI_STDOUT gathered and read as a CGI head (`fastcgi::response::parse`).
//!
//! Asserted for every input: no panic; a record is taken whole or not at all (decoding the
//! input in two reads, split anywhere, takes the same records as decoding it at once); a CGI
//! head never claims more bytes than were written; and a head that parses carries no `Status`
//! line nor a hop-by-hop header among the lines passed on.
//!
//! The body of the `fastcgi` fuzz target (`fuzz/fuzz_targets/fastcgi.rs`), also replayed over
//! `fuzz/seeds/fastcgi/` and `fuzz/regressions/fastcgi/` by `tests/fuzz_replay.rs`.

use bytes::BytesMut;
use pinlb::fastcgi::record::{Record, decode};
use pinlb::fastcgi::response::parse;

/// Every record the bytes hold, read as `cut` bytes then the rest; the error, if any, ends it.
fn records(data: &[u8], cut: usize) -> Vec<Result<Record, String>> {
    let mut out = Vec::new();
    let mut buf = BytesMut::from(&data[..cut]);
    let mut rest = Some(&data[cut..]);
    // Bounded by the input: every pass takes a record, or the rest of it, or ends.
    loop {
        match decode(&mut buf, 1) {
            Ok(Some(r)) => out.push(Ok(r)),
            Ok(None) => match rest.take() {
                Some(more) => buf.extend_from_slice(more),
                None => return out,
            },
            Err(e) => {
                out.push(Err(e.to_string()));
                return out;
            }
        }
    }
}

/// Panics when `data` breaks the target's invariant.
pub fn check(data: &[u8]) {
    let Some((&split, data)) = data.split_first() else {
        return;
    };
    let whole = records(data, 0);
    let cut = usize::from(split) * data.len() / 256;
    assert_eq!(records(data, cut), whole, "split at {cut}");
    let mut stdout = Vec::new();
    for r in whole.iter().flatten() {
        if let Record::Stdout(d) = r {
            stdout.extend_from_slice(d);
        }
    }
    // The raw input as a head too, so the parser sees text the record layer did not shape.
    for text in [&stdout[..], data] {
        if let Ok(Some((head, len))) = parse(text) {
            assert!(len <= text.len());
            for line in head
                .headers
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
            {
                let name = line.split(|&b| b == b':').next().unwrap_or_default();
                for banned in [
                    "status",
                    "content-length",
                    "connection",
                    "transfer-encoding",
                ] {
                    assert!(!name.eq_ignore_ascii_case(banned.as_bytes()), "{line:?}");
                }
            }
        }
    }
}
