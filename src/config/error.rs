//! [`ConfigError`], and [`Source`], which turns a byte span of the file into one.

use std::ops::Range;

/// A configuration error that points at the offending place in the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{col}: {}{message}", key_prefix(.key))]
pub struct ConfigError {
    /// The file name as the user gave it.
    pub file: String,
    /// 1-based line of the offending value.
    pub line: usize,
    /// 1-based column (in characters) of the offending value.
    pub col: usize,
    /// Dotted key path, e.g. `upstream.app.algorithm`; empty for syntax errors.
    pub key: String,
    /// What was wrong and what was expected.
    pub message: String,
}

fn key_prefix(key: &str) -> String {
    if key.is_empty() {
        String::new()
    } else {
        format!("{key}: ")
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
    fn line_col_counts_characters() {
        assert_eq!(line_col("ab\ncé d", 7), (2, 4));
        assert_eq!(line_col("", 0), (1, 1));
    }
}
