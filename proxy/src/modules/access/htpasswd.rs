//! An htpasswd file (`auth_basic.user_file`) read into its users and their password hashes,
//! in the formats nginx takes; a format pinlb cannot verify is an error at its line, so that
//! no user is silently locked out and nobody is silently let in.
//!
//! A line is `user:hash` or `user:hash:comment` (nginx's form); empty lines and lines
//! beginning with `#` are skipped.

use std::fmt;

use base64::Engine;

/// One user of an htpasswd file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HtpasswdUser {
    /// The name as written, byte for byte (compared exactly, as nginx does).
    pub name: Vec<u8>,
    pub hash: PasswordHash,
}

/// A password hash in one of the formats nginx's `auth_basic_user_file` takes.
#[derive(Clone, PartialEq, Eq)]
pub enum PasswordHash {
    /// bcrypt, `$2y$`, `$2a$` or `$2b$`: the whole string, checked well formed.
    Bcrypt(String),
    /// `{SHA}`: base64 of the password's SHA-1.
    Sha1([u8; 20]),
    /// `{SSHA}`: base64 of SHA-1(password ‖ salt) ‖ salt.
    Ssha { digest: [u8; 20], salt: Vec<u8> },
    /// MD5-crypt: Apache's `$apr1$` or glibc's `$1$` (the same algorithm, its magic apart):
    /// the salt (up to 8 characters) and the 22-character digest.
    Md5Crypt {
        magic: &'static str,
        salt: String,
        digest: String,
    },
    /// glibc crypt's SHA-256-crypt (`$5$`) or SHA-512-crypt (`$6$`): the whole string.
    ShaCrypt(String),
    /// `{PLAIN}`: the password itself.
    Plain(Vec<u8>),
}

impl PasswordHash {
    /// The format's name, as the docs and messages call it.
    pub fn format(&self) -> &'static str {
        match self {
            PasswordHash::Bcrypt(_) => "bcrypt",
            PasswordHash::Sha1(_) => "{SHA}",
            PasswordHash::Ssha { .. } => "{SSHA}",
            PasswordHash::Md5Crypt { magic, .. } => magic,
            PasswordHash::ShaCrypt(s) if s.starts_with("$5$") => "$5$",
            PasswordHash::ShaCrypt(_) => "$6$",
            PasswordHash::Plain(_) => "{PLAIN}",
        }
    }
}

/// Only the format: a hash is not to be printed (a `{PLAIN}` one least of all).
impl fmt::Debug for PasswordHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PasswordHash({})", self.format())
    }
}

/// The characters of crypt's base64 (`./0-9A-Za-z`).
fn crypt64(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'/')
}

/// The users of an htpasswd file's `text`, in order; the first bad line's 1-based number and
/// what is wrong with it otherwise.
pub fn parse(text: &[u8]) -> Result<Vec<HtpasswdUser>, (usize, String)> {
    let mut users: Vec<(usize, HtpasswdUser)> = Vec::new();
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        let n = i + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) || line.first() == Some(&b'#') {
            continue;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Err((n, "expected user:hash, found no ':'".into()));
        };
        let name = &line[..colon];
        if name.is_empty() {
            return Err((n, "empty user name, expected user:hash".into()));
        }
        let rest = &line[colon + 1..];
        // nginx's form: anything after a second ':' is a comment.
        let hash = &rest[..rest.iter().position(|&b| b == b':').unwrap_or(rest.len())];
        let hash = password_hash(hash).map_err(|e| (n, e))?;
        if let Some((first, _)) = users.iter().find(|(_, u)| u.name == name) {
            return Err((
                n,
                format!(
                    "user {:?} again, first at line {first}: expected each user once",
                    String::from_utf8_lossy(name)
                ),
            ));
        }
        users.push((
            n,
            HtpasswdUser {
                name: name.to_vec(),
                hash,
            },
        ));
    }
    if users.is_empty() {
        return Err((0, "no users, expected user:hash lines".into()));
    }
    Ok(users.into_iter().map(|(_, u)| u).collect())
}

const REHASH: &str = "make it again with htpasswd -B (bcrypt) or openssl passwd -6";

/// One line's hash, checked well formed in its format.
fn password_hash(hash: &[u8]) -> Result<PasswordHash, String> {
    if let Some(plain) = hash.strip_prefix(b"{PLAIN}") {
        return Ok(PasswordHash::Plain(plain.to_vec()));
    }
    let Ok(hash) = std::str::from_utf8(hash) else {
        return Err(format!(
            "the hash is not text, expected one nginx takes; {REHASH}"
        ));
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    if let Some(v) = hash.strip_prefix("{SHA}") {
        return match b64
            .decode(v)
            .ok()
            .and_then(|d| <[u8; 20]>::try_from(d).ok())
        {
            Some(d) => Ok(PasswordHash::Sha1(d)),
            None => Err("{SHA}: expected the base64 of a 20-byte SHA-1 digest".into()),
        };
    }
    if let Some(v) = hash.strip_prefix("{SSHA}") {
        return match b64.decode(v) {
            Ok(d) if d.len() > 20 => {
                let (digest, salt) = d.split_at(20);
                Ok(PasswordHash::Ssha {
                    digest: digest.try_into().unwrap_or([0; 20]),
                    salt: salt.to_vec(),
                })
            }
            _ => Err("{SSHA}: expected the base64 of a SHA-1 digest and its salt".into()),
        };
    }
    for magic in ["$2y$", "$2a$", "$2b$"] {
        if hash.starts_with(magic) {
            return match hash.parse::<bcrypt::HashParts>() {
                Ok(_) => Ok(PasswordHash::Bcrypt(hash.to_string())),
                Err(e) => Err(format!("bcrypt: {e}, expected $2y$CC$ and 53 characters")),
            };
        }
    }
    for magic in ["$apr1$", "$1$"] {
        if let Some(v) = hash.strip_prefix(magic) {
            return match v.split_once('$') {
                Some((salt, digest))
                    if salt.len() <= 8
                        && crypt64(salt)
                        && digest.len() == 22
                        && crypt64(digest) =>
                {
                    Ok(PasswordHash::Md5Crypt {
                        magic,
                        salt: salt.to_string(),
                        digest: digest.to_string(),
                    })
                }
                _ => Err(format!(
                    "{magic}: expected {magic}SALT$DIGEST, a salt of up to 8 and a digest of 22 characters of ./0-9A-Za-z"
                )),
            };
        }
    }
    for (magic, len) in [("$5$", 43), ("$6$", 86)] {
        if let Some(v) = hash.strip_prefix(magic) {
            return match sha_crypt_fields(v, len) {
                Ok(()) => Ok(PasswordHash::ShaCrypt(hash.to_string())),
                Err(e) => Err(format!("{magic}: {e}")),
            };
        }
    }
    if let Some(rest) = hash.strip_prefix('$') {
        let id = rest.split('$').next().unwrap_or("");
        return Err(format!(
            "the crypt format ${id}$ is not one pinlb takes (bcrypt $2y$/$2a$/$2b$, $apr1$, $1$, $5$, $6$, {{SHA}}, {{SSHA}}, {{PLAIN}}); {REHASH}"
        ));
    }
    if hash.len() == 13 && crypt64(hash) {
        return Err(format!(
            "DES crypt is not taken: it reads only a password's first 8 characters; {REHASH}"
        ));
    }
    Err(format!(
        "not a password hash pinlb takes (bcrypt $2y$/$2a$/$2b$, $apr1$, $1$, $5$, $6$, {{SHA}}, {{SSHA}}, {{PLAIN}}); {REHASH}"
    ))
}

/// `[rounds=N$]SALT$DIGEST` of SHA-crypt, with a digest of `len` characters. Rounds are
/// glibc's 1,000 to 999,999,999.
fn sha_crypt_fields(v: &str, len: usize) -> Result<(), String> {
    let v = match v.strip_prefix("rounds=") {
        Some(r) => {
            let (n, rest) = r.split_once('$').unwrap_or((r, ""));
            match n.parse::<u32>() {
                Ok(n) if (1_000..=999_999_999).contains(&n) => rest,
                _ => return Err("rounds=N: expected N from 1000 to 999999999".into()),
            }
        }
        None => v,
    };
    match v.split_once('$') {
        Some((salt, digest))
            if salt.len() <= 16
                && !salt.contains(':')
                && digest.len() == len
                && crypt64(digest) =>
        {
            Ok(())
        }
        _ => Err(format!(
            "expected [rounds=N$]SALT$DIGEST, a salt of up to 16 characters and a digest of {len}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(line: &str) -> Result<PasswordHash, String> {
        parse(line.as_bytes())
            .map(|mut u| u.remove(0).hash)
            .map_err(|(_, e)| e)
    }

    #[test]
    fn each_format_nginx_takes_is_read() {
        let cases = [
            (
                "a:$2y$05$EUwLOS8HyrFCbUWYcGgm6.SHbid5DbXBkXuw511bQeI2N8azMVq.G",
                "bcrypt",
            ),
            ("a:{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=", "{SHA}"),
            ("a:{SSHA}gVK8WC9YyFT1gMsQHTGCgT3sSv5zYWx0", "{SSHA}"),
            ("a:$apr1$salt$VEpBc9VHGUKwI9.yg13Iu0", "$apr1$"),
            ("a:$1$salt$ez2vlPGdaLYkJam5pWs/Y1", "$1$"),
            (
                "a:$5$salt$kpa26zwgX83BPSR8d7w93OIXbFt/d3UOTZaAu5vsTM6",
                "$5$",
            ),
            (
                "a:$6$rounds=5000$salt$egUxKNxDs8kPfh8iPMNcosMhb2eWah6d3R44JDm5Rj/j/XWR5E33QPd0YmHXoDHOIDR6kL5D3JcQcz0O8FHE00",
                "$6$",
            ),
            ("a:{PLAIN}secret", "{PLAIN}"),
        ];
        for (line, format) in cases {
            assert_eq!(one(line).map(|h| h.format()), Ok(format), "{line}");
        }
    }

    #[test]
    fn comments_blank_lines_and_trailing_fields_are_skipped() {
        let users = parse(b"# who\n\nann:{PLAIN}x:Ann Smith\r\nbob:{PLAIN}y\n").unwrap();
        let names: Vec<&[u8]> = users.iter().map(|u| &u.name[..]).collect();
        assert_eq!(names, [&b"ann"[..], b"bob"]);
        assert_eq!(users[0].hash, PasswordHash::Plain(b"x".to_vec()));
    }

    #[test]
    fn a_bad_line_is_an_error_at_its_number() {
        let text = b"ann:{PLAIN}x\nbob:abJnggxhB/yWI\n";
        let (line, e) = parse(text).unwrap_err();
        assert_eq!(line, 2);
        assert!(e.contains("DES crypt"), "{e}");
        for (text, wanted) in [
            (&b"nocolon\n"[..], "no ':'"),
            (b":{PLAIN}x\n", "empty user name"),
            (b"a:$2y$05$short\n", "bcrypt"),
            (b"a:{SHA}notbase64!\n", "{SHA}"),
            (b"a:$apr1$toolongsalt$Xxd1irWT9ycqoYxGFn4cb.\n", "$apr1$"),
            (b"a:$6$salt$short\n", "$6$"),
            (
                b"a:$5$rounds=10$salt$Gcm6FsVtF/Qa77ZKD.iwsJlCVPY0XSMgLJL0Hnww/c1\n",
                "rounds",
            ),
            (b"a:$y$j9T$salt$hash\n", "$y$"),
            (b"a:{PLAIN}x\na:{PLAIN}y\n", "first at line 1"),
            (b"# nobody\n", "no users"),
        ] {
            let e = parse(text).unwrap_err().1;
            assert!(e.contains(wanted), "{}: {e}", String::from_utf8_lossy(text));
        }
    }

    proptest::proptest! {
        /// Any file: no panic; a line number it blames is one of the file's.
        #[test]
        fn any_file_is_read_without_panic(
            text in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::num::u8::ANY,
                    proptest::sample::select(b":$\n{}#".to_vec()),
                ],
                0..200,
            ),
        ) {
            if let Err((line, _)) = parse(&text) {
                proptest::prop_assert!(line <= text.split(|&b| b == b'\n').count());
            }
        }
    }
}
