//! A `unix:/path` backend's file, checked when the config is read (and at every reload): it
//! must exist and be a socket, as nginx's upstream would otherwise fail every request with
//! "No such file or directory" or "Connection refused" at run time. TLS on a socket is refused:
//! a local socket has no network to protect, and nginx's users put `ssl` on TCP upstreams only.

use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// Why `path` cannot be a backend's socket; `tls` says the upstream has a `[tls]` table.
pub(super) fn check(path: &Path, tls: bool) -> Result<(), String> {
    if tls {
        return Err(format!(
            "unix:{} with [upstream.NAME.tls]: TLS over a Unix socket is not supported, expected a TCP address (IP:PORT) for a TLS upstream, or no tls table",
            path.display()
        ));
    }
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        ErrorKind::NotFound => format!(
            "{} does not exist, expected the path of a listening Unix socket (start the backend first)",
            path.display()
        ),
        ErrorKind::PermissionDenied => format!(
            "{} cannot be looked at ({e}): pinlb's user may not search its directory, expected a socket pinlb can reach",
            path.display()
        ),
        _ => format!("{} cannot be looked at: {e}", path.display()),
    })?;
    if !meta.file_type().is_socket() {
        return Err(format!(
            "{} is {}, not a socket, expected the path of a listening Unix socket",
            path.display(),
            kind(&meta.file_type())
        ));
    }
    Ok(())
}

/// What a file that is not a socket is, in words.
fn kind(t: &std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_file() {
        "a regular file"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "a file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_path_a_file_and_tls_are_refused_and_a_socket_passes() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.sock");
        let e = check(&missing, false).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let e = check(&file, false).unwrap_err();
        assert!(e.contains("a regular file, not a socket"), "{e}");
        let e = check(dir.path(), false).unwrap_err();
        assert!(e.contains("a directory, not a socket"), "{e}");
        let sock = dir.path().join("app.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        check(&sock, false).unwrap();
        let e = check(&sock, true).unwrap_err();
        assert!(e.contains("TLS over a Unix socket"), "{e}");
    }
}
