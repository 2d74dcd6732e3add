//! The normalised form of a request path, which routes match on, so that `/public/../admin`,
//! `/public/%2e%2e/admin` and `//admin` can't slip past a route for `/admin`.
//!
//! The rules (RFC 3986 §6.2.2, as Envoy's `normalize_path` and `merge_slashes`):
//! - percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded (`%7E` → `~`,
//!   `%2e` → `.`); every other escape is kept, its hex digits upper-cased (`%2f` → `%2F`: an
//!   encoded slash stays data, not a separator);
//! - dot segments are removed (`/a/./b` → `/a/b`, `/a/../b` → `/b`; `..` above the root stays
//!   at the root);
//! - repeated slashes are merged (`//admin` → `/admin`), as nginx's `merge_slashes on`;
//! - the query is not part of the path.
//!
//! Most paths need none of this: [`normalize`] borrows those unchanged, so matching them costs no
//! allocation.

use std::borrow::Cow;

/// The normalised path of an origin-form target (its query dropped).
pub fn normalize(target: &[u8]) -> Cow<'_, [u8]> {
    let path = match target.iter().position(|&b| b == b'?') {
        Some(q) => &target[..q],
        None => target,
    };
    if is_normal(path) {
        return Cow::Borrowed(path);
    }
    let decoded = decode_unreserved(path);
    let mut out: Vec<u8> = Vec::with_capacity(decoded.len());
    for segment in decoded.split(|&b| b == b'/').skip(1) {
        match segment {
            // Empty segments are merged slashes; "." is this segment.
            b"" | b"." => {}
            b".." => {
                let keep = out.iter().rposition(|&b| b == b'/').unwrap_or(0);
                out.truncate(keep);
            }
            s => {
                out.push(b'/');
                out.extend_from_slice(s);
            }
        }
    }
    // A trailing slash, or one left after "." or "..", says "a directory": keep it.
    let ends_in_dir =
        decoded.ends_with(b"/") || decoded.ends_with(b"/.") || decoded.ends_with(b"/..");
    if out.is_empty() || ends_in_dir {
        out.push(b'/');
    }
    Cow::Owned(out)
}

/// Whether `path` is already normal: starts with `/`, no `%`, no `//`, no `.` or `..` segment.
fn is_normal(path: &[u8]) -> bool {
    if path.first() != Some(&b'/') || path.contains(&b'%') {
        return false;
    }
    path.windows(2).all(|w| w != b"//")
        && path.split(|&b| b == b'/').all(|s| s != b"." && s != b"..")
}

/// `%XX` of an unreserved character decoded; other escapes kept with upper-case hex.
fn decode_unreserved(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len() + 1);
    if path.first() != Some(&b'/') {
        out.push(b'/');
    }
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        let hex = |at: usize| path.get(at).and_then(|&c| (c as char).to_digit(16));
        match (b, hex(i + 1), hex(i + 2)) {
            (b'%', Some(h), Some(l)) => {
                let c = (h * 16 + l) as u8;
                if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
                    out.push(c);
                } else {
                    out.push(b'%');
                    out.push(path[i + 1].to_ascii_uppercase());
                    out.push(path[i + 2].to_ascii_uppercase());
                }
                i += 3;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(p: &str) -> String {
        String::from_utf8(normalize(p.as_bytes()).into_owned()).unwrap()
    }

    #[test]
    fn ordinary_paths_are_borrowed_unchanged() {
        for p in ["/", "/api/v1/users", "/a.b/c..d/.e", "/x/"] {
            assert!(matches!(normalize(p.as_bytes()), Cow::Borrowed(_)), "{p}");
            assert_eq!(n(p), p);
        }
        assert!(matches!(normalize(b"/a?b=/../c"), Cow::Borrowed(b"/a")));
    }

    #[test]
    fn dot_segments_encoded_dots_and_double_slashes_cannot_escape_a_prefix() {
        assert_eq!(n("/public/../admin"), "/admin");
        assert_eq!(n("/public/%2e%2e/admin"), "/admin");
        assert_eq!(n("/public/%2E%2e/admin/"), "/admin/");
        assert_eq!(n("//admin"), "/admin");
        assert_eq!(n("/./admin"), "/admin");
        assert_eq!(n("/a/b/../../../../admin"), "/admin");
        assert_eq!(n("/public/.."), "/");
        assert_eq!(n("/a/b/."), "/a/b/");
    }

    #[test]
    fn unreserved_escapes_are_decoded_and_others_kept_upper_case() {
        assert_eq!(n("/%61dmin"), "/admin");
        assert_eq!(n("/a%7eb"), "/a~b");
        assert_eq!(n("/a%2fb"), "/a%2Fb");
        assert_eq!(n("/a%20b"), "/a%20b");
        assert_eq!(n("/bad%zz"), "/bad%zz");
        assert_eq!(n("/end%2"), "/end%2");
    }
}
