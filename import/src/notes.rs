//! The notes in the order a reader meets their directives: by file, the main one first and
//! each included one where nginx first reads it, then by line.
//!
//! The converter notes a directive when it decides about it, which is often after the
//! directives that follow it (a location's note waits for its server's routes, the
//! `worker_processes` note for the whole file); sorting once here keeps every module free to
//! note in the order it works.

use std::path::{Path, PathBuf};

use super::parse::Directive;

/// Notes that `d` was not converted, for want of `expected`: once, however many locations
/// inherit it.
pub(super) fn not_converted(notes: &mut Vec<String>, d: &Directive, expected: &str) {
    let line = format!("{}: {} not converted: expected {expected}", d.at(), d.name);
    if !notes.contains(&line) {
        notes.push(line);
    }
}

/// The files `directives` came from, `main` first, then each included file in the order its
/// first directive is read (nginx's include order).
pub(super) fn files(main: &Path, directives: &[Directive]) -> Vec<PathBuf> {
    fn walk(list: &[Directive], out: &mut Vec<PathBuf>) {
        for d in list {
            if !out.contains(&d.file) {
                out.push(d.file.clone());
            }
            walk(d.block.as_deref().unwrap_or_default(), out);
        }
    }
    let mut out = vec![main.to_path_buf()];
    walk(directives, &mut out);
    out
}

/// Sorts `notes` (`file:line: ...`) by the file's place in `files`, then by line; a note
/// that names no file of `files` goes last. The sort is stable: notes on one line keep the
/// order they were made in.
pub(super) fn sort(notes: &mut [String], files: &[PathBuf]) {
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    notes.sort_by_cached_key(|n| place(n, &names));
}

/// A note's (file index, line); `(files, 0)` when it starts with none of `names`.
fn place(note: &str, names: &[String]) -> (usize, usize) {
    // The longest name that matches: `a.conf` must not take the notes of `a.conf.d/x`.
    let found = (names.iter().enumerate())
        .filter_map(|(i, name)| {
            let rest = note.strip_prefix(name.as_str())?.strip_prefix(':')?;
            let digits = rest.find(|c: char| !c.is_ascii_digit())?;
            let line = rest[..digits].parse().ok()?;
            rest[digits..]
                .starts_with(':')
                .then_some((i, line, name.len()))
        })
        .max_by_key(|(_, _, len)| *len);
    match found {
        Some((i, line, _)) => (i, line),
        None => (names.len(), 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn directive(file: &str, line: usize, block: Option<Vec<Directive>>) -> Directive {
        Directive {
            name: "x".into(),
            args: Vec::new(),
            block,
            file: file.into(),
            line,
        }
    }

    #[test]
    fn files_are_in_include_order_with_the_main_file_first() {
        let tree = [
            directive("conf.d/a.conf", 1, None),
            directive(
                "nginx.conf",
                3,
                Some(vec![
                    directive("sites/b", 2, None),
                    directive("conf.d/a.conf", 5, None),
                ]),
            ),
        ];
        let names: Vec<String> = files(Path::new("nginx.conf"), &tree)
            .iter()
            .map(|f| f.display().to_string())
            .collect();
        assert_eq!(names, ["nginx.conf", "conf.d/a.conf", "sites/b"]);
    }

    #[test]
    fn notes_sort_by_file_then_line_keeping_one_line_s_notes_in_order() {
        let files: Vec<PathBuf> = ["nginx.conf", "nginx.conf.d/x"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let mut notes: Vec<String> = [
            "nginx.conf.d/x:2: included",
            "nginx.conf:46: b",
            "nginx.conf:45: a",
            "no file: last",
            "nginx.conf:46: c",
            "nginx.conf:1: first",
            "nginx.conf:100: d",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        sort(&mut notes, &files);
        assert_eq!(
            notes,
            [
                "nginx.conf:1: first",
                "nginx.conf:45: a",
                "nginx.conf:46: b",
                "nginx.conf:46: c",
                "nginx.conf:100: d",
                "nginx.conf.d/x:2: included",
                "no file: last",
            ]
        );
    }
}
