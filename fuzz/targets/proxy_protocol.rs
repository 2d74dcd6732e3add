//! Arbitrary bytes as the start of a connection on a `proxy_protocol` listener, through
//! pinlb's framing (`header_len`, hand-written) and the `ppp` parse behind it.
//!
//! Asserted for every input: no panic; the framing never claims more than its bound (v1:
//! `V1_MAX`, v2: `V2_MAX`) nor fewer bytes than it has seen of a v1 line; framing a prefix of
//! the input never disagrees with framing the whole (what the reader relies on to stop at the
//! header's end); and a header that parses to addresses is rebuilt by `v1`/`v2` into bytes that
//! frame and parse back to the same addresses.
//!
//! The body of the `proxy_protocol` fuzz target (`fuzz/fuzz_targets/proxy_protocol.rs`), also replayed over
//! `fuzz/seeds/proxy_protocol/` and `fuzz/regressions/proxy_protocol/` by `tests/fuzz_replay.rs`.

use pinlb::proxy_protocol::{Header, V1_MAX, V2_MAX, header_len, parse, v1, v2};

/// Panics when `data` breaks the target's invariant.
pub fn check(data: &[u8]) {
    let whole = header_len(data);
    if let Ok(Some(n)) = &whole {
        assert!(*n <= V1_MAX.max(V2_MAX));
    }
    // Every prefix frames as "more", or as the same as the whole: the reader peeks a prefix
    // and must never stop earlier or later than the whole input would say.
    for cut in 0..data.len().min(64) {
        match (header_len(&data[..cut]), &whole) {
            (Ok(None), _) => {}
            (Ok(Some(n)), Ok(Some(m))) => assert_eq!(n, *m, "prefix {cut}"),
            (Err(_), Err(_)) => {}
            (a, b) => panic!("prefix {cut} framed {a:?}, the whole {b:?}"),
        }
    }
    let Ok(Some(n)) = whole else { return };
    if n > data.len() {
        return;
    }
    if let Ok(Header::Proxied {
        source,
        destination,
    }) = parse(&data[..n])
    {
        for built in [v1(source, destination), v2(source, destination)] {
            let len = header_len(&built).expect("frames").expect("whole");
            assert_eq!(len, built.len());
            let back = parse(&built).expect("parses");
            let same_family = source.is_ipv4() == destination.is_ipv4();
            if same_family {
                assert_eq!(
                    back,
                    Header::Proxied {
                        source,
                        destination
                    }
                );
            }
        }
    }
}
