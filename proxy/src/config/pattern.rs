//! A regular expression from the file (a route's `path_regex`, a FastCGI upstream's
//! `split_path_info`): compiled once at load, compared by its pattern, and a bad one an error
//! at its place in the file.

use toml::Spanned;

use crate::syntax::error::{ConfigError, Source};

/// A compiled regular expression, compared by its pattern (two with the same pattern match the
/// same bytes).
#[derive(Debug, Clone)]
pub struct Pattern(pub regex::bytes::Regex);

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Eq for Pattern {}

/// `x` compiled; an error at it otherwise, naming `key`, the regex crate's reason and what was
/// `expected` (an example of the key's use).
pub(super) fn compile(
    src: &Source,
    key: &str,
    x: &Spanned<String>,
    expected: &str,
) -> Result<Pattern, ConfigError> {
    regex::bytes::Regex::new(x.get_ref())
        .map(Pattern)
        .map_err(|e| {
            let message = e.to_string();
            let last = message.lines().last().unwrap_or_default().trim();
            let last = last.strip_prefix("error: ").unwrap_or(last);
            src.at(
                x.span(),
                key,
                format!("invalid regular expression ({last}), expected {expected}"),
            )
        })
}
