//! A sweep's results: a cell per layout and concurrency, the recommendation with its margin,
//! and the table, Markdown, JSON and SVG made from them.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use super::{Layout, Plan, SweepError};
use crate::sys::cpus::format_cpu_list;
use crate::tools::bench::{self, Errors, Latency, Spread};

/// One layout at one concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// The layout's id.
    pub layout: String,
    pub concurrency: usize,
    /// Responses per second of each round: median, min and max.
    pub requests_per_sec: Spread,
    /// Half the range of the rounds, in percent of the median: "rounds within ±4%".
    pub rounds_within_pct: f64,
    /// Of the recorded windows of every round; `mean_us` is ab's "time per request".
    pub latency: Latency,
    /// Responses in the recorded windows.
    pub responses: u64,
    pub failures: Errors,
    /// requests/s ÷ direct's at the same concurrency, paired per round; `None` for direct.
    pub vs_direct: Option<f64>,
}

/// The best layout, and by how much.
#[derive(Debug, Clone, Serialize)]
pub struct Recommendation {
    /// The layout's id and name.
    pub layout: String,
    pub name: String,
    pub concurrency: usize,
    pub requests_per_sec: f64,
    /// Against direct at the same concurrency; `None` when the best is direct.
    pub vs_direct: Option<f64>,
    pub rounds_within_pct: f64,
    /// The best cell of any other layout: its name, concurrency and requests/s.
    pub runner_up: Option<(String, usize, f64)>,
    /// Whether the best's slowest round beat the runner-up's fastest: a clear win, not noise.
    pub clear: bool,
    /// Whether cells with failures had to be considered (no cell was free of them).
    pub with_failures: bool,
}

/// The best cell (highest median requests/s among cells without failures, or among all when
/// every cell has some), with its ratio to direct and the runner-up from another layout.
pub fn recommend(layouts: &[Layout], cells: &[Cell]) -> Option<Recommendation> {
    let clean: Vec<&Cell> = cells
        .iter()
        .filter(|c| c.failures.total() == 0 && c.requests_per_sec.median > 0.0)
        .collect();
    let with_failures = clean.is_empty();
    let pool: Vec<&Cell> = if with_failures {
        cells
            .iter()
            .filter(|c| c.requests_per_sec.median > 0.0)
            .collect()
    } else {
        clean
    };
    let by_rate = |a: &&&Cell, b: &&&Cell| {
        a.requests_per_sec
            .median
            .total_cmp(&b.requests_per_sec.median)
    };
    let best = *pool.iter().max_by(by_rate)?;
    let name_of = |id: &str| {
        layouts
            .iter()
            .find(|l| l.id == id)
            .map_or_else(|| id.to_string(), |l| l.name.clone())
    };
    let runner = pool
        .iter()
        .filter(|c| c.layout != best.layout)
        .max_by(by_rate);
    Some(Recommendation {
        layout: best.layout.clone(),
        name: name_of(&best.layout),
        concurrency: best.concurrency,
        requests_per_sec: best.requests_per_sec.median,
        vs_direct: best.vs_direct,
        rounds_within_pct: best.rounds_within_pct,
        runner_up: runner.map(|r| (name_of(&r.layout), r.concurrency, r.requests_per_sec.median)),
        clear: runner.is_none_or(|r| best.requests_per_sec.min > r.requests_per_sec.max),
        with_failures,
    })
}

impl Recommendation {
    /// "best: 1 proxy core + 3 backends, 2,471 req/s at c=1000, 1.9× direct (rounds within
    /// ±4%); runner-up: ...".
    pub fn sentence(&self) -> String {
        let mut s = format!(
            "best: {}, {} req/s at c={}",
            self.name,
            grouped(self.requests_per_sec),
            self.concurrency
        );
        if let Some(r) = self.vs_direct {
            let _ = write!(s, ", {r:.2}× direct");
        }
        let _ = write!(s, " (rounds within ±{:.0}%)", self.rounds_within_pct.ceil());
        if let Some((name, c, rps)) = &self.runner_up {
            let _ = write!(
                s,
                "; runner-up: {name}, {} req/s at c={c}, {:.2}× less",
                grouped(*rps),
                bench::stats::ratio(self.requests_per_sec, *rps).unwrap_or(f64::NAN)
            );
            if !self.clear {
                s.push_str(
                    " — their rounds overlap: a tie within this run's noise, measure longer to split them",
                );
            }
        }
        if self.with_failures {
            s.push_str(" — every cell had failures: see the table");
        }
        s
    }
}

/// Everything a sweep measured, with what it ran.
#[derive(Debug, Clone, Serialize)]
pub struct Sweep {
    /// The command that reproduces this run.
    pub command: String,
    pub pinlb_version: String,
    pub cores: Vec<usize>,
    /// The backend: `--cmd`, or `pinlb backend` with its work per request.
    pub backend: String,
    pub concurrency: Vec<usize>,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub rounds: usize,
    pub plan: Plan,
    pub cells: Vec<Cell>,
    pub recommendation: Option<Recommendation>,
}

/// Half the range of the rounds in percent of their median.
pub(super) fn within_pct(s: &Spread) -> f64 {
    if s.median > 0.0 {
        (s.max - s.min) / 2.0 / s.median * 100.0
    } else {
        0.0
    }
}

/// 2471.3 as "2,471".
fn grouped(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn ms(us: f64) -> String {
    format!("{:.2}", us / 1000.0)
}

impl Sweep {
    fn name(&self, id: &str) -> String {
        self.plan
            .layouts
            .iter()
            .find(|l| l.id == id)
            .map_or_else(|| id.to_string(), |l| l.name.clone())
    }

    /// The table of every layout at every concurrency, as Markdown whose columns line up in a
    /// terminal too.
    pub fn table(&self) -> String {
        let header = [
            "layout",
            "c",
            "req/s",
            "rounds",
            "mean ms",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "failures",
            "vs direct",
        ];
        let mut rows: Vec<Vec<String>> = Vec::with_capacity(self.cells.len());
        for l in &self.plan.layouts {
            for c in self.cells.iter().filter(|c| c.layout == l.id) {
                rows.push(vec![
                    l.name.clone(),
                    c.concurrency.to_string(),
                    grouped(c.requests_per_sec.median),
                    format!("±{:.1}%", c.rounds_within_pct),
                    ms(c.latency.mean_us),
                    ms(c.latency.p50_us),
                    ms(c.latency.p90_us),
                    ms(c.latency.p99_us),
                    bench::report::errors(&c.failures),
                    c.vs_direct
                        .map_or_else(|| "-".into(), |r| format!("{r:.2}×")),
                ]);
            }
        }
        let widths: Vec<usize> = (0..header.len())
            .map(|i| {
                rows.iter()
                    .map(|r| r[i].chars().count())
                    .chain([header[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: Vec<String>| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            format!("| {} |\n", padded.join(" | "))
        };
        let mut s = line(header.iter().map(|h| h.to_string()).collect());
        s.push_str(&line(widths.iter().map(|w| "-".repeat(*w)).collect()));
        for r in rows {
            s.push_str(&line(r));
        }
        s
    }

    /// The Markdown report: how it ran, the layouts, the notes, the table, the recommendation.
    pub fn markdown(&self) -> String {
        let mut s = String::from("# pinlb sweep\n\n");
        let _ = writeln!(s, "```\n{}\n```\n", self.command);
        let _ = writeln!(
            s,
            "pinlb {} · cores {} · load generator on {} · backend: `{}` · {} round(s) of {} s after {} s of warm-up, layouts interleaved\n",
            self.pinlb_version,
            format_cpu_list(&self.cores),
            format_cpu_list(&self.plan.load),
            self.backend,
            self.rounds,
            self.duration_s,
            self.warmup_s
        );
        for l in &self.plan.layouts {
            if l.proxy.is_empty() {
                let _ = writeln!(s, "- {}: backend on core {}", l.name, l.backends[0]);
            } else {
                let _ = writeln!(
                    s,
                    "- {}: proxy on cores {}, backends on cores {}",
                    l.name,
                    format_cpu_list(&l.proxy),
                    format_cpu_list(&l.backends)
                );
            }
        }
        for n in &self.plan.notes {
            let _ = writeln!(s, "\n**Note:** {n}");
        }
        let _ = writeln!(s, "\n{}", self.table());
        match &self.recommendation {
            Some(r) => {
                let _ = writeln!(s, "**{}**", r.sentence());
            }
            None => s.push_str("No recommendation: no layout completed a request.\n"),
        }
        s
    }

    /// Writes sweep.md, sweep.json and sweep.svg into `dir`.
    pub fn write(&self, dir: &Path) -> Result<(), SweepError> {
        let write = |name: &str, bytes: Vec<u8>| {
            let path = dir.join(name);
            std::fs::write(&path, bytes).map_err(|e| SweepError::Write {
                path,
                reason: e.to_string(),
            })
        };
        write("sweep.md", self.markdown().into_bytes())?;
        let json = serde_json::to_vec_pretty(self).map_err(|e| SweepError::Write {
            path: dir.join("sweep.json"),
            reason: e.to_string(),
        })?;
        write("sweep.json", json)?;
        let svg = self.svg().map_err(|reason| SweepError::Write {
            path: dir.join("sweep.svg"),
            reason,
        })?;
        write("sweep.svg", svg.into_bytes())
    }

    /// Requests/s against concurrency, a line per layout; the x axis is logarithmic when the
    /// concurrencies span a decade or more, as sweeps usually do.
    pub fn svg(&self) -> Result<String, String> {
        let lines: Vec<(String, Vec<(f64, f64)>)> = self
            .plan
            .layouts
            .iter()
            .map(|l| {
                let mut pts: Vec<(f64, f64)> = self
                    .cells
                    .iter()
                    .filter(|c| c.layout == l.id)
                    .map(|c| (c.concurrency as f64, c.requests_per_sec.median))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                (self.name(&l.id), pts)
            })
            .collect();
        let xs = || lines.iter().flat_map(|(_, p)| p.iter().map(|q| q.0));
        let min_x = xs().fold(f64::INFINITY, f64::min).max(1.0);
        let max_x = xs().fold(0.0f64, f64::max).max(min_x * 1.01);
        let max_y = lines
            .iter()
            .flat_map(|(_, p)| p.iter().map(|q| q.1))
            .fold(0.0f64, f64::max);
        let max_y = if max_y > 0.0 { max_y * 1.1 } else { 1.0 };
        let (lo, hi) = (min_x / 1.2, max_x * 1.2);
        let subtitle = format!(
            "{} round(s) of {} s per cell · load on cores {} · pinlb {} · {}",
            self.rounds,
            self.duration_s,
            format_cpu_list(&self.plan.load),
            self.pinlb_version,
            self.backend
        );
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (900, 560)).into_drawing_area();
            root.fill(&WHITE).map_err(|e| e.to_string())?;
            let (top, body) = root.split_vertically(48);
            top.draw(&Text::new(
                subtitle,
                (16, 30),
                ("sans-serif", 13).into_font().color(&BLACK.mix(0.75)),
            ))
            .map_err(|e| e.to_string())?;
            let mut builder = ChartBuilder::on(&body);
            builder
                .caption("throughput by concurrency", ("sans-serif", 22))
                .margin(16)
                .margin_right(40)
                .x_label_area_size(44)
                .y_label_area_size(72);
            macro_rules! draw {
                ($chart:expr) => {{
                    let mut chart = $chart;
                    chart
                        .configure_mesh()
                        .x_desc("concurrent connections")
                        .y_desc("requests/s")
                        .max_light_lines(4)
                        .draw()
                        .map_err(|e| e.to_string())?;
                    for (i, (name, pts)) in lines.iter().enumerate() {
                        let color = Palette99::pick(i).to_rgba();
                        chart
                            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
                            .map_err(|e| e.to_string())?;
                        chart
                            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                            .map_err(|e| e.to_string())?
                            .label(name.as_str())
                            .legend(move |(x, y)| {
                                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                            });
                    }
                    chart
                        .configure_series_labels()
                        .position(SeriesLabelPosition::LowerRight)
                        .background_style(WHITE.mix(0.8))
                        .border_style(BLACK)
                        .draw()
                        .map_err(|e| e.to_string())?;
                }};
            }
            if max_x / min_x >= 10.0 {
                draw!(
                    builder
                        .build_cartesian_2d((lo..hi).log_scale(), 0.0..max_y)
                        .map_err(|e| e.to_string())?
                );
            } else {
                draw!(
                    builder
                        .build_cartesian_2d(lo..hi, 0.0..max_y)
                        .map_err(|e| e.to_string())?
                );
            }
            root.present().map_err(|e| e.to_string())?;
        }
        Ok(svg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::sweep::plan;

    fn cell(layout: &str, c: usize, rps: [f64; 3], failures: u64, vs: Option<f64>) -> Cell {
        let mut sorted = rps;
        sorted.sort_by(f64::total_cmp);
        let spread = Spread {
            median: sorted[1],
            min: sorted[0],
            max: sorted[2],
        };
        Cell {
            layout: layout.into(),
            concurrency: c,
            requests_per_sec: spread,
            rounds_within_pct: within_pct(&spread),
            latency: Latency {
                p50_us: 0.0,
                p90_us: 0.0,
                p99_us: 0.0,
                p999_us: 0.0,
                max_us: 0.0,
                mean_us: 0.0,
            },
            responses: 1,
            failures: Errors {
                timeout: failures,
                ..Errors::default()
            },
            vs_direct: vs,
        }
    }

    #[test]
    fn the_best_clean_cell_is_recommended_with_its_margin_over_direct_and_the_runner_up() {
        let p = plan(&[0, 1, 2, 3]);
        let cells = vec![
            cell("direct", 100, [1000.0, 1040.0, 960.0], 0, None),
            cell("p1b2", 100, [1900.0, 1980.0, 1820.0], 0, Some(1.9)),
            // Faster, but with failures: not a recommendation while clean cells exist.
            cell("p2b1", 100, [3000.0, 3000.0, 3000.0], 5, Some(3.0)),
            cell("p2b1", 10, [1200.0, 1250.0, 1150.0], 0, Some(1.2)),
        ];
        let r = recommend(&p.layouts, &cells).unwrap();
        assert_eq!((r.layout.as_str(), r.concurrency), ("p1b2", 100));
        assert_eq!(r.vs_direct, Some(1.9));
        assert!(
            (r.rounds_within_pct - 4.21).abs() < 0.01,
            "{}",
            r.rounds_within_pct
        );
        assert!(r.clear && !r.with_failures);
        assert_eq!(
            r.runner_up,
            Some(("2 proxy cores + 1 backend".to_string(), 10, 1200.0))
        );
        assert_eq!(
            r.sentence(),
            "best: 1 proxy core + 2 backends, 1,900 req/s at c=100, 1.90× direct (rounds within ±5%); runner-up: 2 proxy cores + 1 backend, 1,200 req/s at c=10, 1.58× less"
        );
    }

    #[test]
    fn overlapping_rounds_make_a_tie_not_a_win() {
        let p = plan(&[0, 1]);
        let cells = vec![
            cell("direct", 10, [1000.0, 1100.0, 900.0], 0, None),
            cell("p1b1", 10, [1050.0, 1150.0, 950.0], 0, Some(1.05)),
        ];
        let r = recommend(&p.layouts, &cells).unwrap();
        assert_eq!(r.layout, "p1b1");
        assert!(!r.clear);
        assert!(
            r.sentence().contains("a tie within this run's noise"),
            "{}",
            r.sentence()
        );
    }

    #[test]
    fn direct_can_be_the_answer_and_failures_only_count_when_nothing_is_clean() {
        let p = plan(&[0, 1]);
        let cells = vec![
            cell("direct", 10, [2000.0, 2000.0, 2000.0], 0, None),
            cell("p1b1", 10, [1000.0, 1000.0, 1000.0], 0, Some(0.5)),
        ];
        let r = recommend(&p.layouts, &cells).unwrap();
        assert_eq!(r.name, "direct (1 backend)");
        assert_eq!(r.vs_direct, None);
        assert!(!r.sentence().contains("× direct"));

        let cells = vec![
            cell("direct", 10, [2000.0, 2000.0, 2000.0], 3, None),
            cell("p1b1", 10, [1000.0, 1000.0, 1000.0], 1, Some(0.5)),
        ];
        let r = recommend(&p.layouts, &cells).unwrap();
        assert!(r.with_failures);
        assert_eq!(r.layout, "direct");
        assert!(recommend(&p.layouts, &[]).is_none());
    }

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(grouped(2471.4), "2,471");
        assert_eq!(grouped(999.0), "999");
        assert_eq!(grouped(1234567.0), "1,234,567");
        assert_eq!(grouped(0.0), "0");
    }
}
