//! nginx's configuration syntax: directives (`name arg ...;`) and blocks (`name arg ... { ... }`),
//! `#` comments, single- and double-quoted strings, and `include` (with globs, relative to the
//! including file's directory as nginx resolves them against its prefix; a pattern that matches
//! nothing is reported, not fatal, as nginx itself accepts an empty glob). nginx's FastCGI
//! includes ([`STANDARD_INCLUDES`]) are kept by name, not read.

use std::path::{Path, PathBuf};

/// One directive, where it was written, and its block's directives if it has one.
#[derive(Debug, Clone)]
pub struct Directive {
    pub name: String,
    pub args: Vec<String>,
    pub block: Option<Vec<Directive>>,
    pub file: PathBuf,
    pub line: usize,
}

impl Directive {
    /// `file:line`, for notes.
    pub fn at(&self) -> String {
        format!("{}:{}", self.file.display(), self.line)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("{file}: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}:{line}: {message}")]
    Syntax {
        file: String,
        line: usize,
        message: String,
    },
}

/// nginx's FastCGI includes, known by name (they live in /etc/nginx, rarely beside the file
/// imported): kept as `include` directives, not read, for [`super::fastcgi`] to take as the
/// standard set they are.
pub const STANDARD_INCLUDES: [&str; 3] = [
    "fastcgi_params",
    "fastcgi.conf",
    "snippets/fastcgi-php.conf",
];

/// Whether `pattern` names one of [`STANDARD_INCLUDES`] (relative, or under any directory).
pub fn is_standard_include(pattern: &str) -> bool {
    STANDARD_INCLUDES
        .iter()
        .any(|name| pattern == *name || pattern.ends_with(&format!("/{name}")))
}

/// Reads `path` and every file it includes. Includes that match no file are returned as notes.
pub fn parse_file(path: &Path, notes: &mut Vec<String>) -> Result<Vec<Directive>, ParseError> {
    parse_file_at(path, notes, 0)
}

/// Includes nest at most this deep: a file that includes itself is an error, not a hang.
const MAX_DEPTH: usize = 16;

fn parse_file_at(
    path: &Path,
    notes: &mut Vec<String>,
    depth: usize,
) -> Result<Vec<Directive>, ParseError> {
    let text = std::fs::read_to_string(path).map_err(|source| ParseError::Read {
        file: path.display().to_string(),
        source,
    })?;
    let tokens = tokenize(&text).map_err(|(line, message)| ParseError::Syntax {
        file: path.display().to_string(),
        line,
        message,
    })?;
    let mut at = 0;
    let list = directives(path, &tokens, &mut at, false)?;
    expand_includes(path, list, notes, depth)
}

fn expand_includes(
    path: &Path,
    list: Vec<Directive>,
    notes: &mut Vec<String>,
    depth: usize,
) -> Result<Vec<Directive>, ParseError> {
    let mut out = Vec::with_capacity(list.len());
    for mut d in list {
        if d.name == "include" && d.block.is_none() {
            if depth >= MAX_DEPTH {
                return Err(ParseError::Syntax {
                    file: path.display().to_string(),
                    line: d.line,
                    message: format!(
                        "includes nest deeper than {MAX_DEPTH} (a file including itself?)"
                    ),
                });
            }
            let pattern = d.args.first().cloned().unwrap_or_default();
            if is_standard_include(&pattern) {
                out.push(d);
                continue;
            }
            let full = match Path::new(&pattern).is_absolute() {
                true => PathBuf::from(&pattern),
                false => path.parent().unwrap_or(Path::new(".")).join(&pattern),
            };
            let mut found: Vec<PathBuf> = glob::glob(&full.to_string_lossy())
                .map(|paths| paths.flatten().collect())
                .unwrap_or_default();
            found.sort();
            if found.is_empty() {
                notes.push(format!(
                    "{}: include {pattern}: no such file, skipped",
                    d.at()
                ));
            }
            for f in found {
                out.extend(parse_file_at(&f, notes, depth + 1)?);
            }
            continue;
        }
        if let Some(block) = d.block.take() {
            d.block = Some(expand_includes(path, block, notes, depth)?);
        }
        out.push(d);
    }
    Ok(out)
}

#[derive(Debug, PartialEq)]
enum Token {
    Word(String, usize),
    Semicolon(usize),
    Open(usize),
    Close(usize),
}

fn tokenize(text: &str) -> Result<Vec<Token>, (usize, String)> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    let mut line = 1;
    while let Some(&c) = chars.peek() {
        match c {
            '\n' => {
                line += 1;
                chars.next();
            }
            c if c.is_whitespace() => {
                chars.next();
            }
            '#' => {
                while chars.peek().is_some_and(|&c| c != '\n') {
                    chars.next();
                }
            }
            ';' => {
                tokens.push(Token::Semicolon(line));
                chars.next();
            }
            '{' => {
                tokens.push(Token::Open(line));
                chars.next();
            }
            '}' => {
                tokens.push(Token::Close(line));
                chars.next();
            }
            '"' | '\'' => {
                let quote = c;
                let start = line;
                chars.next();
                let mut word = String::new();
                loop {
                    match chars.next() {
                        None => return Err((start, format!("unclosed {quote} string"))),
                        Some('\\') => match chars.next() {
                            Some(n) => word.push(n),
                            None => return Err((start, format!("unclosed {quote} string"))),
                        },
                        Some(q) if q == quote => break,
                        Some(ch) => {
                            if ch == '\n' {
                                line += 1;
                            }
                            word.push(ch);
                        }
                    }
                }
                tokens.push(Token::Word(word, start));
            }
            _ => {
                let mut word = String::new();
                while let Some(&ch) = chars.peek() {
                    if ch.is_whitespace() || matches!(ch, ';' | '{' | '}') {
                        break;
                    }
                    word.push(ch);
                    chars.next();
                }
                tokens.push(Token::Word(word, line));
            }
        }
    }
    Ok(tokens)
}

fn directives(
    path: &Path,
    tokens: &[Token],
    at: &mut usize,
    in_block: bool,
) -> Result<Vec<Directive>, ParseError> {
    let err = |line: usize, message: String| ParseError::Syntax {
        file: path.display().to_string(),
        line,
        message,
    };
    let mut list = Vec::new();
    while *at < tokens.len() {
        let (name, line) = match &tokens[*at] {
            Token::Word(w, l) => (w.clone(), *l),
            Token::Close(l) if in_block => {
                *at += 1;
                return Ok(list);
            }
            Token::Close(l) => return Err(err(*l, "unexpected \"}\"".into())),
            Token::Semicolon(l) => return Err(err(*l, "unexpected \";\"".into())),
            Token::Open(l) => return Err(err(*l, "unexpected \"{\"".into())),
        };
        *at += 1;
        let mut args = Vec::new();
        loop {
            match tokens.get(*at) {
                Some(Token::Word(w, _)) => {
                    args.push(w.clone());
                    *at += 1;
                }
                Some(Token::Semicolon(_)) => {
                    *at += 1;
                    list.push(Directive {
                        name,
                        args,
                        block: None,
                        file: path.to_path_buf(),
                        line,
                    });
                    break;
                }
                Some(Token::Open(_)) => {
                    *at += 1;
                    let block = directives(path, tokens, at, true)?;
                    list.push(Directive {
                        name,
                        args,
                        block: Some(block),
                        file: path.to_path_buf(),
                        line,
                    });
                    break;
                }
                Some(Token::Close(l)) => {
                    return Err(err(
                        *l,
                        format!("directive \"{name}\" is not terminated by \";\""),
                    ));
                }
                None => {
                    return Err(err(
                        line,
                        format!(
                            "unexpected end of file: directive \"{name}\" is not terminated by \";\""
                        ),
                    ));
                }
            }
        }
    }
    if in_block {
        return Err(err(
            tokens.last().map_or(1, |t| match t {
                Token::Word(_, l) | Token::Semicolon(l) | Token::Open(l) | Token::Close(l) => *l,
            }),
            "unexpected end of file, expecting \"}\"".into(),
        ));
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Vec<Directive> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.conf");
        std::fs::write(&file, text).unwrap();
        parse_file(&file, &mut Vec::new()).unwrap()
    }

    #[test]
    fn directives_blocks_quotes_and_comments() {
        let d = parse("a 1 '2 3';\n# c\nb { c \"x;y\"; d { e; } }\n");
        assert_eq!(
            (d[0].name.as_str(), d[0].args.clone(), d[0].line),
            ("a", vec!["1".into(), "2 3".into()], 1)
        );
        let b = d[1].block.as_ref().unwrap();
        assert_eq!(d[1].line, 3);
        assert_eq!(b[0].args, ["x;y"]);
        assert_eq!(b[1].block.as_ref().unwrap()[0].name, "e");
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.conf");
        std::fs::write(&file, "http {\n  a 1\n}\n").unwrap();
        let e = parse_file(&file, &mut Vec::new()).unwrap_err().to_string();
        assert!(
            e.ends_with(":3: directive \"a\" is not terminated by \";\""),
            "{e}"
        );
    }
}
