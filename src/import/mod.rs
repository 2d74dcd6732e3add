//! `pinlb import nginx.conf`: an nginx configuration read (its includes followed) and written as
//! a pinlb one, with a note for every directive that has no pinlb equivalent.
//!
//! - [`parse`]: nginx's syntax, directives with their `file:line`.
//! - [`convert`]: directives to pinlb's TOML.

mod convert;
mod parse;

use std::path::Path;

pub use parse::ParseError;

/// The pinlb configuration as TOML text, and the notes (`file:line: ...`) on what was not
/// converted.
pub fn import(path: &Path) -> Result<(String, Vec<String>), ParseError> {
    let mut notes = Vec::new();
    let directives = parse::parse_file(path, &mut notes)?;
    let converted = convert::convert(&directives);
    notes.extend(converted.notes);
    let text = toml::to_string(&converted.toml).unwrap_or_default();
    Ok((
        format!(
            "# Imported from {} by pinlb import.\n{text}",
            path.display()
        ),
        notes,
    ))
}
