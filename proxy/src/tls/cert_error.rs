//! Why a certificate, key, CA or CRL file could not be used: one error for every TLS file a
//! listener reads (its certificates and keys, and its client certificates' CAs and CRLs).

use std::path::{Path, PathBuf};

/// Why a certificate, key, CA or CRL file could not be used. Each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot read {}: {source}", .file.display())]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {what}", .file.display())]
    Invalid { file: PathBuf, what: String },
    #[error("the key in {} does not match the certificate in {}", .key.display(), .cert.display())]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error("cannot build the TLS configuration: {0}")]
    Config(rustls::Error),
}

impl CertError {
    /// The file at fault: for a key that does not match, the key's.
    pub fn file(&self) -> Option<&Path> {
        match self {
            CertError::Read { file, .. } | CertError::Invalid { file, .. } => Some(file),
            CertError::Mismatch { key, .. } => Some(key),
            CertError::Config(_) => None,
        }
    }
}

/// `file`'s bytes, or the error that names it.
pub fn read_file(file: &Path) -> Result<Vec<u8>, CertError> {
    std::fs::read(file).map_err(|source| CertError::Read {
        file: file.to_path_buf(),
        source,
    })
}

/// `file` is not what it should be: `what`.
pub fn invalid(file: &Path, what: String) -> CertError {
    CertError::Invalid {
        file: file.to_path_buf(),
        what,
    }
}
