//! Header names (and the few tokens of header values) compared with a name pinlb knows,
//! ignoring ASCII case.
//!
//! Every request and every response compares several of its header names this way (the
//! hop-by-hop table, Host, Content-Length, Date, Connection's tokens). `eq_ignore_ascii_case`
//! lowers both sides a byte at a time, about 5 instructions a byte, some 250 per proxied request
//! (`benches/callgrind.sh`); [`is`] compares eight bytes at a time.

/// Each byte's 0x20 bit, eight bytes wide.
const FOLD: u64 = 0x2020_2020_2020_2020;

/// Whether `bytes` is `lower`, ignoring ASCII case.
///
/// `lower` is written in lowercase letters, digits and `-`. `bytes` is part of a head httparse
/// accepted: a name's token characters, or a value's (HTAB, space, visible ASCII, obs-text), so
/// never CR, LF or another control byte. Setting the 0x20 bit of each byte of `bytes` then folds
/// its case and nothing else that matters: an uppercase letter becomes its lowercase letter; the
/// only other bytes it turns into a lowercase letter, a digit or `-` are control bytes, and CR
/// (the one that becomes `-`), which such bytes never hold. The bytes of `lower` keep their
/// value under it.
#[inline(always)]
pub fn is(bytes: &[u8], lower: &[u8]) -> bool {
    debug_assert!(
        lower
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-'),
        "not a lowercase name: {lower:?}"
    );
    if bytes.len() != lower.len() {
        return false;
    }
    if bytes.len() < 8 {
        return bytes.iter().zip(lower).all(|(b, l)| b | 0x20 == *l);
    }
    let word = |s: &[u8]| s.first_chunk::<8>().map_or(0, |w| u64::from_ne_bytes(*w));
    let last = |s: &[u8]| s.last_chunk::<8>().map_or(0, |w| u64::from_ne_bytes(*w));
    // Whole words from the start, then the last eight bytes (which may overlap the words).
    bytes
        .chunks_exact(8)
        .zip(lower.chunks_exact(8))
        .all(|(b, l)| word(b) | FOLD == word(l))
        && last(bytes) | FOLD == last(lower)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: &[&str] = &[
        "te",
        "host",
        "date",
        "close",
        "expect",
        "upgrade",
        "trailer",
        "referer",
        "x-real-ip",
        "forwarded",
        "connection",
        "keep-alive",
        "user-agent",
        "content-length",
        "x-forwarded-for",
        "proxy-connection",
        "transfer-encoding",
        "x-forwarded-proto",
    ];

    #[test]
    fn a_name_matches_itself_in_any_case_and_nothing_else_of_its_length() {
        for lower in NAMES {
            let n = lower.len();
            assert!(is(lower.as_bytes(), lower.as_bytes()));
            assert!(is(lower.to_ascii_uppercase().as_bytes(), lower.as_bytes()));
            // Every byte a head may hold, at every position: only the two cases of the letter
            // that stands there match.
            for at in 0..n {
                for b in (0x20..=0xffu8).chain([b'\t']).filter(|b| *b != 0x7f) {
                    let mut other = lower.as_bytes().to_vec();
                    other[at] = b;
                    let expect = other.eq_ignore_ascii_case(lower.as_bytes());
                    assert_eq!(
                        is(&other, lower.as_bytes()),
                        expect,
                        "{lower} with {b:#04x} at {at}"
                    );
                }
            }
            assert!(!is(&lower.as_bytes()[..n - 1], lower.as_bytes()));
        }
    }
}
