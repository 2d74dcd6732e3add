//! Cores: parsing core lists and pinning threads to them.
//!
//! Pinning is Linux's `sched_setaffinity` on the calling thread (through `nix`). A thread created
//! afterwards inherits its creator's mask, which is why pinlb pins the main thread to the whole
//! `runtime.cpus` set before it starts anything else: no thread it starts can float outside it.

use std::fmt::Write;

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// Parses a Linux-style core list: `"3"`, `"2-5"`, `"0,2-3"`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim) {
        if part.is_empty() {
            return Err("empty entry".into());
        }
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (parse_core(a)?, parse_core(b)?),
            None => {
                let c = parse_core(part)?;
                (c, c)
            }
        };
        if lo > hi {
            return Err(format!("range {lo}-{hi} is backwards"));
        }
        out.extend(lo..=hi);
    }
    Ok(out)
}

fn parse_core(s: &str) -> Result<usize, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("\"{}\" is not a core number", s.trim()))
}

/// Formats cores compactly, the way `/proc/*/status` does: `0-3,6`.
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            let _ = write!(out, "{start}");
        } else {
            let _ = write!(out, "{start}-{end}");
        }
        i += 1;
    }
    out
}

/// The cores this process (its calling thread) is allowed to run on.
pub fn allowed_cpus() -> Result<Vec<usize>, nix::Error> {
    let set = sched_getaffinity(Pid::from_raw(0))?;
    Ok((0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

/// Pins the calling thread to `cpus`. Threads it creates later inherit the mask.
/// The machine's online cores, from sysfs; `None` where it can't be read.
pub fn online_cpus() -> Option<Vec<usize>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    parse_cpu_list(text.trim()).ok()
}

pub fn pin_current_thread(cpus: &[usize]) -> Result<(), nix::Error> {
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c)?;
    }
    sched_setaffinity(Pid::from_raw(0), &set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_single_ranges_and_lists() {
        assert_eq!(parse_cpu_list("3"), Ok(vec![3]));
        assert_eq!(parse_cpu_list("2-5"), Ok(vec![2, 3, 4, 5]));
        assert_eq!(parse_cpu_list("0, 2-3"), Ok(vec![0, 2, 3]));
    }

    #[test]
    fn rejects_garbage_and_backwards_ranges() {
        assert!(parse_cpu_list("").is_err());
        assert!(parse_cpu_list("a").is_err());
        assert!(parse_cpu_list("5-2").unwrap_err().contains("backwards"));
        assert!(parse_cpu_list("1,,2").is_err());
    }

    #[test]
    fn formats_like_proc_status() {
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 6]), "0-3,6");
        assert_eq!(format_cpu_list(&[5, 1]), "1,5");
        assert_eq!(format_cpu_list(&[]), "");
    }

    #[test]
    fn the_current_thread_has_some_allowed_core() {
        assert!(!allowed_cpus().unwrap().is_empty());
    }
}
