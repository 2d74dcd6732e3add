//! HTTP basic auth (RFC 7617) against a listener's or a route's htpasswd users: the
//! `Authorization` header read, its password verified in the user's format, and the
//! credentials verified recently remembered, so that a pinned worker does not pay a bcrypt
//! for every request.
//!
//! # The cache
//!
//! bcrypt at cost 10 or more costs tens of milliseconds of a core, and nginx pays it on every
//! request; on one of pinlb's single-threaded workers that would stall every other
//! connection of the core. So each worker keeps, per listener or route, the credentials it
//! verified in the last [`CACHE_AGE`], at most [`CACHE_SIZE`] of them (past that the oldest
//! goes): keyed by SHA-256 of a per-generation random secret and the header's value, so that
//! no password is kept in memory and a hit means the same `Authorization` value. A reload
//! (which reads the htpasswd file again) starts with an empty cache. Wrong credentials are
//! not remembered: each costs its hash, as in nginx.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use base64::Engine;
use md5::Md5;
use sha_crypt::{PasswordVerifier, ShaCrypt};
use sha1::{Digest, Sha1};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::config::BasicAuth;
use super::htpasswd::PasswordHash;
use crate::http1::request::RequestHead;

/// How long a verified credential is taken without verifying it again.
pub const CACHE_AGE: Duration = Duration::from_secs(60);
/// How many verified credentials a worker remembers per listener or route.
pub const CACHE_SIZE: usize = 256;

/// Why a request's credentials were not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// No `Authorization` header.
    Missing,
    /// Not `Basic` with base64 of `user:password`.
    Malformed,
    /// A user not in the file. Its name is not kept for the log: a name no user has is often
    /// a password typed into the wrong field.
    UnknownUser,
    /// The user's password is not this one.
    WrongPassword(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Missing => f.write_str("no credentials"),
            Refused::Malformed => f.write_str("malformed Authorization header"),
            Refused::UnknownUser => f.write_str("a user name not in the file"),
            Refused::WrongPassword(u) => write!(f, "wrong password for user {u:?}"),
        }
    }
}

/// The credentials one worker verified recently for one listener's or route's `auth_basic`:
/// their keyed digest and when. Made empty, with a secret of its own, for each generation.
pub(crate) struct Verified {
    secret: [u8; 32],
    cache: RefCell<Vec<([u8; 32], Instant)>>,
}

impl Default for Verified {
    fn default() -> Verified {
        let mut secret = [0u8; 32];
        secret.iter_mut().for_each(|b| *b = fastrand::u8(..));
        Verified {
            secret,
            cache: RefCell::new(Vec::new()),
        }
    }
}

impl Verified {
    /// Whether `head` carries the credentials of one of `auth`'s users.
    pub fn check(&self, auth: &BasicAuth, head: &RequestHead) -> Result<(), Refused> {
        let value = head.header_values("authorization").next();
        self.check_value(auth, value, Instant::now())
    }

    fn check_value(
        &self,
        auth: &BasicAuth,
        value: Option<&[u8]>,
        now: Instant,
    ) -> Result<(), Refused> {
        let value = value.ok_or(Refused::Missing)?;
        let key: [u8; 32] = Sha256::new()
            .chain_update(self.secret)
            .chain_update(value)
            .finalize()
            .into();
        let mut cache = self.cache.borrow_mut();
        cache.retain(|(_, at)| now.saturating_duration_since(*at) < CACHE_AGE);
        if cache.iter().any(|(k, _)| k == &key) {
            return Ok(());
        }
        drop(cache);
        let (user, password) = credentials(value).ok_or(Refused::Malformed)?;
        let name = || String::from_utf8_lossy(&user).into_owned();
        let Some(entry) = auth.users.iter().find(|u| u.name == user) else {
            return Err(Refused::UnknownUser);
        };
        if !verify(&entry.hash, &password) {
            return Err(Refused::WrongPassword(name()));
        }
        let mut cache = self.cache.borrow_mut();
        if cache.len() >= CACHE_SIZE {
            cache.remove(0);
        }
        cache.push((key, now));
        Ok(())
    }
}

/// The user and password of an `Authorization: Basic …` value: the scheme case-insensitive,
/// the base64 padded or not, the user up to the first `:`.
pub fn credentials(value: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let (scheme, token) = value.split_at(value.iter().position(|&b| b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return None;
    }
    let token = token.trim_ascii();
    let decoded = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(
            token
                .strip_suffix(b"==")
                .or(token.strip_suffix(b"="))
                .unwrap_or(token),
        )
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    Some((decoded[..colon].to_vec(), decoded[colon + 1..].to_vec()))
}

/// Whether `password` is the one `hash` was made from; digests compared in constant time.
pub fn verify(hash: &PasswordHash, password: &[u8]) -> bool {
    match hash {
        PasswordHash::Bcrypt(h) => bcrypt::verify(password, h).unwrap_or(false),
        PasswordHash::Sha1(d) => Sha1::digest(password).as_slice().ct_eq(d).into(),
        PasswordHash::Ssha { digest, salt } => Sha1::new()
            .chain_update(password)
            .chain_update(salt)
            .finalize()
            .as_slice()
            .ct_eq(digest)
            .into(),
        PasswordHash::Md5Crypt {
            magic,
            salt,
            digest,
        } => md5_crypt(password, magic.as_bytes(), salt.as_bytes())
            .ct_eq(digest.as_bytes())
            .into(),
        PasswordHash::ShaCrypt(h) => ShaCrypt::default()
            .verify_password(password, h.as_str())
            .is_ok(),
        PasswordHash::Plain(p) => password.ct_eq(p).into(),
    }
}

/// MD5-crypt's 22-character digest (Poul-Henning Kamp's, as Apache's `$apr1$` and glibc's
/// `$1$` make it: `magic` is one of those). No maintained crate offers `$apr1$`; the
/// algorithm is short and fixed, and the tests check it against `openssl passwd`.
fn md5_crypt(password: &[u8], magic: &[u8], salt: &[u8]) -> [u8; 22] {
    let alt = Md5::new()
        .chain_update(password)
        .chain_update(salt)
        .chain_update(password)
        .finalize();
    let mut ctx = Md5::new()
        .chain_update(password)
        .chain_update(magic)
        .chain_update(salt);
    for chunk in password.chunks(16) {
        ctx.update(&alt[..chunk.len()]);
    }
    let mut i = password.len();
    while i > 0 {
        if i & 1 == 1 {
            ctx.update([0u8]);
        } else {
            ctx.update(&password[..1]);
        }
        i >>= 1;
    }
    let mut f = ctx.finalize();
    for round in 0..1000 {
        let mut c = Md5::new();
        if round & 1 == 1 {
            c.update(password);
        } else {
            c.update(f);
        }
        if round % 3 != 0 {
            c.update(salt);
        }
        if round % 7 != 0 {
            c.update(password);
        }
        if round & 1 == 1 {
            c.update(f);
        } else {
            c.update(password);
        }
        f = c.finalize();
    }
    const ITOA: &[u8; 64] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut out = [0u8; 22];
    let groups = [(0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 5)];
    let mut at = 0;
    let mut put = |mut v: u32, n: usize| {
        for _ in 0..n {
            out[at] = ITOA[(v & 0x3f) as usize];
            v >>= 6;
            at += 1;
        }
    };
    for (a, b, c) in groups {
        put(
            (u32::from(f[a]) << 16) | (u32::from(f[b]) << 8) | u32::from(f[c]),
            4,
        );
    }
    put(u32::from(f[11]), 2);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hashes of "secret", made with `openssl passwd` and `htpasswd -B -C 5`.
    const SECRET: [&str; 8] = [
        "$2y$05$EUwLOS8HyrFCbUWYcGgm6.SHbid5DbXBkXuw511bQeI2N8azMVq.G",
        "{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=",
        "{SSHA}gVK8WC9YyFT1gMsQHTGCgT3sSv5zYWx0",
        "$apr1$salt$VEpBc9VHGUKwI9.yg13Iu0",
        "$1$salt$ez2vlPGdaLYkJam5pWs/Y1",
        "$5$salt$kpa26zwgX83BPSR8d7w93OIXbFt/d3UOTZaAu5vsTM6",
        "$6$salt$egUxKNxDs8kPfh8iPMNcosMhb2eWah6d3R44JDm5Rj/j/XWR5E33QPd0YmHXoDHOIDR6kL5D3JcQcz0O8FHE00",
        "{PLAIN}secret",
    ];

    fn users(hash: &str) -> BasicAuth {
        let text = format!("ann:{hash}\n");
        BasicAuth {
            realm: "R".into(),
            user_file: "h".into(),
            users: crate::modules::access::htpasswd::parse(text.as_bytes()).unwrap(),
        }
    }

    #[test]
    fn each_format_takes_its_password_and_no_other() {
        for hash in SECRET {
            let auth = users(hash);
            let hash = &auth.users[0].hash;
            assert!(verify(hash, b"secret"), "{hash:?}");
            assert!(!verify(hash, b"secreT"), "{hash:?}");
            assert!(!verify(hash, b""), "{hash:?}");
        }
    }

    #[test]
    fn md5_crypt_matches_openssl_for_long_passwords_too() {
        // openssl passwd -apr1 -salt abcdefgh 'a password longer than sixteen bytes'
        assert_eq!(
            &md5_crypt(
                b"a password longer than sixteen bytes",
                b"$apr1$",
                b"abcdefgh"
            ),
            b"KxnTlry9zkkkUhSc6GrVg/"
        );
    }

    #[test]
    fn the_header_is_read_as_browsers_send_it() {
        assert_eq!(
            credentials(b"Basic YW5uOnNlY3JldA=="),
            Some((b"ann".to_vec(), b"secret".to_vec()))
        );
        assert_eq!(
            credentials(b"basic   YW5uOnM6dA"),
            Some((b"ann".to_vec(), b"s:t".to_vec()))
        );
        assert_eq!(credentials(b"Bearer YW5uOnNlY3JldA=="), None);
        assert_eq!(credentials(b"Basic !!!"), None);
        assert_eq!(credentials(b"Basic YW5u"), None, "no colon");
        assert_eq!(credentials(b"Basic"), None);
    }

    #[test]
    fn a_verified_credential_is_remembered_for_a_while_and_no_longer() {
        let (auth, check) = (users(SECRET[7]), Verified::default());
        let good = Some(&b"Basic YW5uOnNlY3JldA=="[..]);
        let t0 = Instant::now();
        assert_eq!(check.check_value(&auth, good, t0), Ok(()));
        assert_eq!(check.cache.borrow().len(), 1);
        assert_eq!(check.check_value(&auth, good, t0 + Duration::from_secs(1)), Ok(()));
        assert_eq!(check.cache.borrow().len(), 1);
        assert_eq!(check.check_value(&auth, good, t0 + CACHE_AGE), Ok(()));
        assert_eq!(check.cache.borrow()[0].1, t0 + CACHE_AGE, "verified anew");
        let wrong = Some(&b"Basic YW5uOnNlY3JldDI="[..]);
        assert_eq!(
            check.check_value(&auth, wrong, t0),
            Err(Refused::WrongPassword("ann".into()))
        );
        assert_eq!(check.cache.borrow().len(), 1, "a failure is not remembered");
        let bob = Some(&b"Basic Ym9iOnNlY3JldA=="[..]);
        assert_eq!(check.check_value(&auth, bob, t0), Err(Refused::UnknownUser));
        assert_eq!(check.check_value(&auth, None, t0), Err(Refused::Missing));
        assert_eq!(
            check.check_value(&auth, Some(b"Basic %%%"), t0),
            Err(Refused::Malformed)
        );
    }

    #[test]
    fn the_cache_holds_at_most_its_size() {
        let (auth, check) = (users("{PLAIN}secret"), Verified::default());
        let t0 = Instant::now();
        let b64 = base64::engine::general_purpose::STANDARD;
        // The same user and password, the header's value written differently each time.
        for i in 0..CACHE_SIZE + 10 {
            let value = format!("Basic {}{}", b64.encode("ann:secret"), " ".repeat(i));
            assert_eq!(check.check_value(&auth, Some(value.as_bytes()), t0), Ok(()));
            assert_eq!(check.cache.borrow().len(), (i + 1).min(CACHE_SIZE));
        }
    }

    proptest::proptest! {
        /// Any header value: no panic, and what a browser would send reads back.
        #[test]
        fn any_header_value_is_read_without_panic(
            value in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
            user in "[^:]{0,12}",
            password in ".{0,12}",
        ) {
            let _ = credentials(&value);
            let b64 = base64::engine::general_purpose::STANDARD;
            let sent = format!("Basic {}", b64.encode(format!("{user}:{password}")));
            proptest::prop_assert_eq!(
                credentials(sent.as_bytes()),
                Some((user.into_bytes(), password.into_bytes()))
            );
        }
    }
}
