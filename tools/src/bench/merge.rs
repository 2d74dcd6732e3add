//! `pinlb bench merge`: the `--json` reports of several load generators that ran at the same
//! time (`--start-at`) added up into one, printed as a single run's table.
//!
//! Per target and round, the machines' histograms and counts are added and their rates summed
//! (they loaded the target together); the percentiles are then read from the added histogram,
//! never averaged. The merged report is written in the same format, so merges compose.

use std::path::PathBuf;
use std::process::ExitCode;

use super::BenchError;
use super::report::{Report, RoundReport, TargetReport};
use super::stats::{Latency, new_histogram};

/// Why reports could not be merged.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not a `pinlb bench --json` report: {source}", path.display())]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{} does not line up with {}: {what}", path.display(), first.display())]
    Mismatch {
        path: PathBuf,
        first: PathBuf,
        what: String,
    },
    #[error("no reports to merge")]
    Empty,
    #[error(transparent)]
    Histogram(#[from] BenchError),
}

/// `pinlb bench merge`'s command line.
#[derive(Debug, clap::Args)]
pub struct MergeArgs {
    /// `pinlb bench --json` reports of runs that loaded the same targets at the same time.
    #[arg(required = true, value_name = "FILE.json")]
    pub files: Vec<PathBuf>,
    /// Also write the merged report as JSON to FILE, in the same format (so merges compose).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// Reads each file as a report.
pub fn read(files: &[PathBuf]) -> Result<Vec<(PathBuf, Report)>, MergeError> {
    files
        .iter()
        .map(|path| {
            let bytes = std::fs::read(path).map_err(|source| MergeError::Read {
                path: path.clone(),
                source,
            })?;
            let report = serde_json::from_slice(&bytes).map_err(|source| MergeError::Parse {
                path: path.clone(),
                source,
            })?;
            Ok((path.clone(), report))
        })
        .collect()
}

/// What differs between `first` and `other` that a merge cannot add up: their targets (in
/// order, by name and URL), their rounds, what a request is. `None` when they line up.
fn mismatch(first: &Report, other: &Report) -> Option<String> {
    let names = |r: &Report| {
        r.targets
            .iter()
            .map(|t| format!("{}={}", t.name, t.url))
            .collect::<Vec<_>>()
    };
    if names(first) != names(other) {
        return Some(format!(
            "targets [{}] against [{}]",
            names(other).join(", "),
            names(first).join(", ")
        ));
    }
    for (a, b) in first.targets.iter().zip(&other.targets) {
        if a.rounds.len() != b.rounds.len() {
            return Some(format!(
                "target {}: {} round(s) against {}",
                a.name,
                b.rounds.len(),
                a.rounds.len()
            ));
        }
    }
    if first.unit() != other.unit() {
        return Some(format!(
            "it counts {} against {}",
            other.unit(),
            first.unit()
        ));
    }
    let request = |r: &Report| format!("{} over HTTP/{}", r.method, r.http_version);
    if request(first) != request(other) {
        return Some(format!(
            "its requests are {} against {}",
            request(other),
            request(first)
        ));
    }
    None
}

/// One report adding up `reports` (at least one), which must line up (see [`mismatch`]).
pub fn merge(reports: Vec<(PathBuf, Report)>) -> Result<Report, MergeError> {
    let mut iter = reports.into_iter();
    let (first_path, first) = iter.next().ok_or(MergeError::Empty)?;
    let mut sums: Vec<Vec<RoundSum>> = first
        .targets
        .iter()
        .map(|t| t.rounds.iter().map(RoundSum::of).collect())
        .collect::<Result<_, _>>()?;
    let mut merged = first;
    let mut connect_failures: Vec<Option<String>> = merged
        .targets
        .iter()
        .map(|t| t.connect_failure.clone())
        .collect();
    for (path, other) in iter {
        if let Some(what) = mismatch(&merged, &other) {
            return Err(MergeError::Mismatch {
                path,
                first: first_path,
                what,
            });
        }
        for ((target, rounds), failure) in other
            .targets
            .iter()
            .zip(&mut sums)
            .zip(&mut connect_failures)
        {
            for (round, sum) in target.rounds.iter().zip(rounds.iter_mut()) {
                sum.add(round)?;
            }
            if failure.is_none() {
                failure.clone_from(&target.connect_failure);
            }
        }
        merged.machines += other.machines;
        merged.connections += other.connections;
        merged.threads += other.threads;
        merged.started_at = earliest(merged.started_at, other.started_at, false);
        merged.ended_at = earliest(merged.ended_at, other.ended_at, true);
    }
    let mut targets: Vec<TargetReport> = Vec::with_capacity(sums.len());
    for ((target, rounds), failure) in merged.targets.iter().zip(sums).zip(connect_failures) {
        let rounds = rounds.into_iter().map(RoundSum::into_round).collect();
        let t = TargetReport::of_rounds(
            target.name.clone(),
            target.url.clone(),
            rounds,
            failure,
            targets.first(),
        )?;
        targets.push(t);
    }
    merged.targets = targets;
    Ok(merged)
}

/// The earlier of two RFC 3339 times (the later with `latest`); a missing one is ignored.
/// RFC 3339 UTC times of one format sort as strings.
fn earliest(a: Option<String>, b: Option<String>, latest: bool) -> Option<String> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if (a <= b) != latest { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// One round of one target, added up over machines.
struct RoundSum {
    round: RoundReport,
}

impl RoundSum {
    fn of(r: &RoundReport) -> Result<RoundSum, BenchError> {
        let mut histogram = new_histogram()?;
        histogram.add(&r.histogram)?;
        Ok(RoundSum {
            round: RoundReport {
                histogram,
                ..r.clone()
            },
        })
    }

    /// Another machine's same round: it ran at the same time, so its rate adds to this one's,
    /// and the round lasted until the later of the two ended.
    fn add(&mut self, r: &RoundReport) -> Result<(), BenchError> {
        let s = &mut self.round;
        s.histogram.add(&r.histogram)?;
        s.requests_per_sec += r.requests_per_sec;
        s.elapsed_s = s.elapsed_s.max(r.elapsed_s);
        s.requests.add(&r.requests);
        s.warmup.add(&r.warmup);
        Ok(())
    }

    fn into_round(self) -> RoundReport {
        let mut r = self.round;
        r.latency = Latency::of(&r.histogram);
        r
    }
}

/// `pinlb bench merge`: prints the merged table, writes `--json`; exits 1 when a file cannot be
/// read or merged.
pub fn main(args: &MergeArgs) -> ExitCode {
    let mut merged = match read(&args.files).and_then(merge) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pinlb bench merge: {e}");
            return ExitCode::FAILURE;
        }
    };
    merged.command = std::env::args().collect();
    print!("{}", merged.table());
    if let Some(path) = &args.json {
        if let Err(e) = merged.write_json(path) {
            eprintln!("pinlb bench merge: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::tests::{opts, run};

    /// A report of two targets over two rounds, each request taking `us` µs, `n` per round.
    fn report(n: f64, us: u64) -> Report {
        let runs = vec![
            vec![run(n, us), run(n * 2.0, us)],
            vec![run(n, us + 50), run(n, us + 50)],
        ];
        Report::build(&opts(), &[1], runs).unwrap()
    }

    /// Through JSON and back, as `bench merge` reads them.
    fn written(r: &Report) -> Report {
        serde_json::from_slice(&serde_json::to_vec(r).unwrap()).unwrap()
    }

    #[test]
    fn a_merge_adds_counts_and_histograms_and_sums_the_rates_of_each_round() {
        let (a, b) = (report(1000.0, 100), report(3000.0, 400));
        let m = merge(vec![
            ("a.json".into(), written(&a)),
            ("b.json".into(), written(&b)),
        ])
        .unwrap();
        assert_eq!(m.machines, 2);
        assert_eq!(m.connections, a.connections + b.connections);
        let (t, ta, tb) = (&m.targets[0], &a.targets[0], &b.targets[0]);
        assert_eq!(t.requests.sent, ta.requests.sent + tb.requests.sent);
        assert_eq!(t.requests.statuses.classes[1], 12000);
        assert_eq!(t.rounds[0].requests_per_sec, 4000.0);
        assert_eq!(t.rounds[1].requests_per_sec, 8000.0);
        let mut both = new_histogram().unwrap();
        both.add(&ta.histogram).unwrap();
        both.add(&tb.histogram).unwrap();
        assert_eq!(t.histogram, both);
        assert_eq!(t.latency, Latency::of(&both));
        // A quarter of the samples are at 100 µs, the rest at 400: the median is 400, which no
        // average of the two runs' medians (100, 400) would give.
        assert!((t.latency.p50_us - 400.0).abs() < 1.0, "{:?}", t.latency);
        assert!(m.targets[1].vs_first.is_some());
        assert!(
            m.table().contains("| direct | 6000 | 4000 | 8000 |"),
            "{}",
            m.table()
        );
    }

    #[test]
    fn merges_compose() {
        let (a, b, c) = (report(1000.0, 100), report(2000.0, 200), report(500.0, 900));
        let ab = merge(vec![("a".into(), written(&a)), ("b".into(), written(&b))]).unwrap();
        let ab_c = merge(vec![("ab".into(), written(&ab)), ("c".into(), written(&c))]).unwrap();
        let abc = merge(vec![
            ("a".into(), written(&a)),
            ("b".into(), written(&b)),
            ("c".into(), written(&c)),
        ])
        .unwrap();
        assert_eq!(ab_c.machines, 3);
        for (x, y) in ab_c.targets.iter().zip(&abc.targets) {
            assert_eq!(x.histogram, y.histogram);
            assert_eq!(x.requests, y.requests);
            assert_eq!(x.requests_per_sec, y.requests_per_sec);
        }
    }

    #[test]
    fn reports_that_do_not_line_up_are_refused_naming_the_file_and_the_difference() {
        let a = report(1000.0, 100);
        let mut other_target = written(&a);
        other_target.targets[1].url = "http://127.0.0.1:9/".into();
        let e = merge(vec![
            ("a.json".into(), written(&a)),
            ("b.json".into(), other_target),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("b.json does not line up with a.json"), "{e}");
        assert!(e.contains("proxied=http://127.0.0.1:9/"), "{e}");

        let mut fewer = written(&a);
        for t in &mut fewer.targets {
            t.rounds.pop();
        }
        let e = merge(vec![
            ("a.json".into(), written(&a)),
            ("c.json".into(), fewer),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("c.json") && e.contains("1 round(s) against 2"),
            "{e}"
        );

        let mut ws = written(&a);
        ws.message_size = Some(64);
        let e = merge(vec![("a.json".into(), written(&a)), ("d.json".into(), ws)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("msg/s against req/s"), "{e}");
    }
}
