//! [`ConfigError`], [`ConfigErrors`] (every error a file has, in file order), and [`Source`],
//! which turns a byte span of the file into one.

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

/// Every error found in a file, in file order (line, then column), never empty: one line each,
/// then a count line when there are several. One error reads exactly as its [`ConfigError`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", render_all(&self.0))]
pub struct ConfigErrors(Vec<ConfigError>);

fn render_all(errors: &[ConfigError]) -> String {
    let mut lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    if errors.len() > 1 {
        lines.push(format!("{} errors", errors.len()));
    }
    lines.join("\n")
}

impl ConfigErrors {
    /// `errors` in file order (a stable sort: two at one place keep the order they were found
    /// in); `None` when there are none.
    pub fn new(mut errors: Vec<ConfigError>) -> Option<ConfigErrors> {
        errors.sort_by_key(|e| (e.line, e.col));
        (!errors.is_empty()).then_some(ConfigErrors(errors))
    }

    /// The errors, in file order.
    pub fn errors(&self) -> &[ConfigError] {
        &self.0
    }

    /// The errors, in file order.
    pub fn into_errors(self) -> Vec<ConfigError> {
        self.0
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> ConfigErrors {
        ConfigErrors(vec![e])
    }
}

/// The text being validated and the name it came under: every validation step holds one, so
/// that an error can name its place without carrying the text around.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source<'a> {
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
    fn several_errors_read_one_a_line_in_file_order_then_their_count() {
        let src = Source {
            file: "f.toml",
            text: "a = 1\nb = 2\n",
        };
        let one = ConfigErrors::from(src.at(6..7, "b", "bad"));
        assert_eq!(one.to_string(), "f.toml:2:1: b: bad");
        let two =
            ConfigErrors::new(vec![src.at(6..7, "b", "bad"), src.at(4..5, "a", "worse")]).unwrap();
        assert_eq!(
            two.to_string(),
            "f.toml:1:5: a: worse\nf.toml:2:1: b: bad\n2 errors"
        );
        assert_eq!(ConfigErrors::new(Vec::new()), None);
    }

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("ab\ncé d", 7), (2, 4));
        assert_eq!(line_col("", 0), (1, 1));
    }
}
