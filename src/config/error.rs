//! [`ConfigError`], and [`Source`], which turns a byte span of the file into one.

use std::ops::Range;

/// A configuration error that points at the offending place in the file: `file:line:col: key:
/// message`, or `file: message` for an error of the whole file (it is missing, say).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", render(self))]
pub struct ConfigError {
    /// The file name as the user gave it.
    pub file: String,
    /// 1-based line of the offending value; 0 when the error is about the whole file.
    pub line: usize,
    /// 1-based column (in characters) of the offending value.
    pub col: usize,
    /// Dotted key path, e.g. `upstream.app.algorithm`; empty for syntax errors.
    pub key: String,
    /// What was wrong and what was expected.
    pub message: String,
}

fn render(e: &ConfigError) -> String {
    let key = if e.key.is_empty() {
        String::new()
    } else {
        format!("{}: ", e.key)
    };
    if e.line == 0 {
        format!("{}: {key}{}", e.file, e.message)
    } else {
        format!("{}:{}:{}: {key}{}", e.file, e.line, e.col, e.message)
    }
}

impl ConfigError {
    /// The file `file` could not be read: missing says so plainly, and where it was looked for
    /// when the name is relative.
    pub fn unreadable(file: &str, e: &std::io::Error) -> ConfigError {
        let message = match e.kind() {
            std::io::ErrorKind::NotFound => {
                let path = std::path::Path::new(file);
                match std::env::current_dir() {
                    Ok(dir) if path.is_relative() => {
                        format!("no such configuration file (looked in {})", dir.display())
                    }
                    _ => "no such configuration file".to_string(),
                }
            }
            std::io::ErrorKind::PermissionDenied => {
                "cannot read the configuration file: permission denied".to_string()
            }
            _ => format!("cannot read the configuration file: {e}"),
        };
        ConfigError {
            file: file.to_string(),
            line: 0,
            col: 0,
            key: String::new(),
            message,
        }
    }
}

/// The text being validated and the name it came under: every validation step holds one, so
/// that an error can name its place without carrying the text around.
#[derive(Debug, Clone, Copy)]
pub(super) struct Source<'a> {
    pub file: &'a str,
    pub text: &'a str,
}

impl Source<'_> {
    /// The error for the value at byte `span` of the text, under `key`.
    pub fn at(&self, span: Range<usize>, key: &str, message: impl Into<String>) -> ConfigError {
        let (line, col) = line_col(self.text, span.start);
        ConfigError {
            file: self.file.to_string(),
            line,
            col,
            key: key.to_string(),
            message: message.into(),
        }
    }
}

/// 1-based line and column (in characters) of byte offset `pos`.
fn line_col(text: &str, pos: usize) -> (usize, usize) {
    let pos = pos.min(text.len());
    let before = &text[..pos];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = text[line_start..pos].chars().count() + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_says_so_without_a_position() {
        let e = std::io::Error::from(std::io::ErrorKind::NotFound);
        let msg = ConfigError::unreadable("/etc/nope.toml", &e).to_string();
        assert_eq!(msg, "/etc/nope.toml: no such configuration file");
        let msg = ConfigError::unreadable("nope.toml", &e).to_string();
        assert!(
            msg.starts_with("nope.toml: no such configuration file (looked in /"),
            "{msg}"
        );
    }

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("ab\ncé d", 7), (2, 4));
        assert_eq!(line_col("", 0), (1, 1));
    }
}
