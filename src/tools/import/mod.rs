//! `pinlb import nginx.conf`: an nginx configuration read (its includes followed) and written as
//! a pinlb one, with a note for every directive that has no pinlb equivalent.
//!
//! - [`parse`]: nginx's syntax, directives with their `file:line`.
//! - [`template`]: nginx variables as pinlb template variables.
//! - [`rewrite`]: `rewrite ... redirect|permanent` as a route redirect, where one is exact.
//! - [`convert`]: directives to pinlb's TOML.

mod convert;
mod parse;
mod rewrite;
mod template;

use std::path::Path;

pub use parse::ParseError;

/// Why there is no configuration to print.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// Every server only serves files: nothing proxies, redirects or answers, so a pinlb
    /// configuration would have no listener. The notes say what each directive was.
    #[error("nothing to proxy: its servers only serve files; pinlb serves no files")]
    NothingToProxy { notes: Vec<String> },
}

/// The pinlb configuration as TOML text, and the notes (`file:line: ...`) on what was not
/// converted.
pub fn import(path: &Path) -> Result<(String, Vec<String>), ImportError> {
    let mut notes = Vec::new();
    let directives = parse::parse_file(path, &mut notes)?;
    let converted = convert::convert(&directives);
    notes.extend(converted.notes);
    if !converted.anything {
        return Err(ImportError::NothingToProxy { notes });
    }
    let text = toml::to_string(&converted.toml).unwrap_or_default();
    Ok((
        format!(
            "# Imported from {} by pinlb import.\n{text}",
            path.display()
        ),
        notes,
    ))
}
