//! A sweep's results: a cell per layout, proxy and concurrency, the recommendation with its
//! margin, the best layout per proxy, pinlb against each peer, and the table, Markdown, JSON and
//! SVG made from them.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use super::{Layout, Plan, SweepError};
use crate::bench::limits::limit_list;
use crate::bench::report::{cpu_list, cpu_us};
use crate::bench::{self, Errors, Latency, Spread};
use crate::peers::{Found, Proxy};
use pinlb::sys::cpus::format_cpu_list;

/// One layout and proxy at one concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// The layout's id.
    pub layout: String,
    /// The proxy in front of the backends; `None` for direct.
    pub proxy: Option<Proxy>,
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
    /// µs of CPU (user + system, from `/proc`) of the proxy's processes per response over the
    /// recorded windows of every round; `None` for direct, or when it could not be read.
    pub proxy_cpu_us_per_request: Option<f64>,
    /// The same for each backend process, in order, per response of the cell (so they add up
    /// to the backends' CPU per request).
    pub backend_cpu_us_per_request: Vec<Option<f64>>,
    /// pinlb's cells: each backend's learned concurrency limit at the end of the recorded
    /// windows, the median over the rounds (`bench::limits`); empty for direct and the peers.
    pub backend_concurrency_limit: Vec<Option<usize>>,
}

impl Cell {
    fn key(&self) -> (&str, Option<Proxy>) {
        (&self.layout, self.proxy)
    }
}

/// The best layout, and by how much.
#[derive(Debug, Clone, Serialize)]
pub struct Recommendation {
    /// The layout's id and name (with its proxy's when several proxies ran).
    pub layout: String,
    pub name: String,
    /// The proxy of the best cell; `None` when it is direct.
    pub proxy: Option<Proxy>,
    pub concurrency: usize,
    pub requests_per_sec: f64,
    /// Against direct at the same concurrency; `None` when the best is direct.
    pub vs_direct: Option<f64>,
    pub rounds_within_pct: f64,
    /// The best cell of any other layout (or proxy): its name, concurrency and requests/s.
    pub runner_up: Option<(String, usize, f64)>,
    /// Whether the best's slowest round beat the runner-up's fastest: a clear win, not noise.
    pub clear: bool,
    /// Whether cells with failures had to be considered (no cell was free of them).
    pub with_failures: bool,
}

/// The best cell (highest median requests/s among cells without failures, or among all when
/// every cell has some), with its ratio to direct and the runner-up from another layout or
/// proxy. `with_proxy`: names say the proxy ("1 proxy core + 1 backend, nginx").
pub fn recommend(layouts: &[Layout], cells: &[Cell], with_proxy: bool) -> Option<Recommendation> {
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
    let name_of = |c: &Cell| label(layouts, &c.layout, c.proxy, with_proxy);
    let runner = pool
        .iter()
        .filter(|c| c.key() != best.key())
        .max_by(by_rate);
    Some(Recommendation {
        layout: best.layout.clone(),
        name: name_of(best),
        proxy: best.proxy,
        concurrency: best.concurrency,
        requests_per_sec: best.requests_per_sec.median,
        vs_direct: best.vs_direct,
        rounds_within_pct: best.rounds_within_pct,
        runner_up: runner.map(|r| (name_of(r), r.concurrency, r.requests_per_sec.median)),
        clear: runner.is_none_or(|r| best.requests_per_sec.min > r.requests_per_sec.max),
        with_failures,
    })
}

/// A layout's name, and its proxy's after a comma when `with_proxy` and it has one.
fn label(layouts: &[Layout], id: &str, proxy: Option<Proxy>, with_proxy: bool) -> String {
    let name = layouts
        .iter()
        .find(|l| l.id == id)
        .map_or_else(|| id.to_string(), |l| l.name.clone());
    match proxy {
        Some(p) if with_proxy => format!("{name}, {}", p.display_name()),
        _ => name,
    }
}

impl Recommendation {
    /// "best: 1 proxy core + 3 backends, 2,471 req/s at c=1000, 1.9× direct (rounds within
    /// ±4%); runner-up: ...".
    pub fn sentence(&self) -> String {
        self.sentence_as("best")
    }

    /// [`Self::sentence`] beginning with `what` ("best with nginx") instead of "best".
    pub fn sentence_as(&self, what: &str) -> String {
        let mut s = format!(
            "{what}: {}, {} req/s at c={}",
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

/// pinlb against one peer: each at its best layout by requests/s, and their proxies' CPU per
/// request at pinlb's best layout and concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct Versus {
    pub peer: Proxy,
    /// Each one's best cell: layout id, concurrency, median requests/s.
    pub pinlb_best: (String, usize, f64),
    pub peer_best: (String, usize, f64),
    /// pinlb's best requests/s ÷ the peer's.
    pub throughput_ratio: f64,
    /// Whether the rounds separate them: the faster one's slowest round beat the other's
    /// fastest. Otherwise a tie within this run's noise.
    pub clear: bool,
    /// Where the CPU is compared: pinlb's best layout id and concurrency.
    pub cpu_at: (String, usize),
    /// µs of CPU per request of each one's proxy processes there.
    pub pinlb_cpu_us: Option<f64>,
    pub peer_cpu_us: Option<f64>,
    /// pinlb's ÷ the peer's: below 1 is leaner.
    pub cpu_ratio: Option<f64>,
    /// Layout names, for the sentence.
    #[serde(skip)]
    names: (String, String),
}

/// pinlb against each other proxy that ran, from each one's best (`best`, one per proxy as
/// [`recommend`] found them among its own cells); empty without pinlb or without a peer.
pub fn versus(layouts: &[Layout], cells: &[Cell], best: &[Recommendation]) -> Vec<Versus> {
    let Some(ours) = best.iter().find(|b| b.proxy == Some(Proxy::Pinlb)) else {
        return Vec::new();
    };
    let cell = |layout: &str, proxy: Proxy, c: usize| {
        cells
            .iter()
            .find(|x| x.layout == layout && x.proxy == Some(proxy) && x.concurrency == c)
    };
    let Some(our_cell) = cell(&ours.layout, Proxy::Pinlb, ours.concurrency) else {
        return Vec::new();
    };
    let name = |id: &str| label(layouts, id, None, false);
    best.iter()
        .filter_map(|b| {
            let peer = b.proxy.filter(|p| *p != Proxy::Pinlb)?;
            let their_cell = cell(&b.layout, peer, b.concurrency)?;
            let (a, t) = (&our_cell.requests_per_sec, &their_cell.requests_per_sec);
            let peer_cpu =
                cell(&ours.layout, peer, ours.concurrency).and_then(|c| c.proxy_cpu_us_per_request);
            let pinlb_cpu = our_cell.proxy_cpu_us_per_request;
            Some(Versus {
                peer,
                pinlb_best: (ours.layout.clone(), ours.concurrency, a.median),
                peer_best: (b.layout.clone(), b.concurrency, t.median),
                throughput_ratio: bench::stats::ratio(a.median, t.median).unwrap_or(f64::NAN),
                clear: a.min > t.max || t.min > a.max,
                cpu_at: (ours.layout.clone(), ours.concurrency),
                pinlb_cpu_us: pinlb_cpu,
                peer_cpu_us: peer_cpu,
                cpu_ratio: pinlb_cpu
                    .zip(peer_cpu)
                    .and_then(|(p, q)| bench::stats::ratio(p, q)),
                names: (name(&ours.layout), name(&b.layout)),
            })
        })
        .collect()
}

impl Versus {
    /// "pinlb vs nginx here: by req/s pinlb is ahead, 10,234 (1 proxy core + 1 backend, c=100)
    /// against 9,100 (...), 1.12×, its slowest round above nginx's fastest; by CPU per request
    /// at 1 proxy core + 1 backend, c=100, pinlb is leaner: 23.1 µs against 30.2 µs (0.76×)."
    pub fn sentence(&self) -> String {
        let peer = self.peer.display_name();
        let (ours, theirs) = (&self.pinlb_best, &self.peer_best);
        let r = self.throughput_ratio;
        let verdict = if !self.clear {
            format!("a tie within this run's noise (their rounds overlap), {r:.2}×")
        } else if r > 1.0 {
            format!("pinlb is ahead, {r:.2}× (its slowest round beat {peer}'s fastest)")
        } else {
            format!(
                "pinlb is behind: {peer} is {:.2}× faster (its slowest round beat pinlb's fastest)",
                1.0 / r
            )
        };
        let mut s = format!(
            "pinlb vs {peer} here: by req/s {verdict}: {} at {}, c={} against {} at {}, c={}, each at its best",
            grouped(ours.2),
            self.names.0,
            ours.1,
            grouped(theirs.2),
            self.names.1,
            theirs.1
        );
        let at = format!("{}, c={}", self.names.0, self.cpu_at.1);
        match (self.pinlb_cpu_us, self.peer_cpu_us, self.cpu_ratio) {
            (Some(p), Some(q), Some(c)) => {
                let verdict = if (0.95..=1.05).contains(&c) {
                    "about the same".to_string()
                } else if c < 1.0 {
                    format!("pinlb is leaner, {c:.2}×")
                } else {
                    format!("pinlb uses more, {c:.2}×")
                };
                let _ = write!(
                    s,
                    "; by the proxy's CPU per request at {at}: {verdict}, {p:.1} µs against {q:.1} µs"
                );
            }
            _ => {
                let _ = write!(
                    s,
                    "; the proxies' CPU per request at {at} could not be read for both"
                );
            }
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
    /// The proxies that ran, in order, with their programs and versions.
    pub proxies: Vec<Found>,
    /// A line for each proxy asked for that is not installed.
    pub skipped: Vec<String>,
    pub cells: Vec<Cell>,
    /// The best cell of all, direct included.
    pub recommendation: Option<Recommendation>,
    /// Each proxy's best layout among its own cells.
    pub best_per_proxy: Vec<Recommendation>,
    /// pinlb against each peer that ran.
    pub versus: Vec<Versus>,
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
    /// The cells in the table's order: by layout, then proxy (in `--proxy`'s order), then
    /// concurrency as run.
    fn ordered(&self) -> Vec<(&Layout, Option<Proxy>, Vec<&Cell>)> {
        let mut out = Vec::new();
        for l in &self.plan.layouts {
            let proxies: Vec<Option<Proxy>> = if l.proxy.is_empty() {
                vec![None]
            } else {
                self.proxies.iter().map(|f| Some(f.proxy)).collect()
            };
            for p in proxies {
                let cells = self
                    .cells
                    .iter()
                    .filter(|c| c.layout == l.id && c.proxy == p)
                    .collect();
                out.push((l, p, cells));
            }
        }
        out
    }

    /// What the sweep concludes, a line each: the best cell of all, and with several proxies
    /// each one's best layout and pinlb against each peer.
    pub fn conclusions(&self) -> Vec<String> {
        let mut out = vec![match &self.recommendation {
            Some(r) => r.sentence(),
            None => "no recommendation: no layout completed a request".into(),
        }];
        if self.proxies.len() > 1 {
            for r in &self.best_per_proxy {
                let p = r.proxy.map_or("direct", Proxy::display_name);
                out.push(r.sentence_as(&format!("best layout with {p}")));
            }
            out.extend(self.versus.iter().map(Versus::sentence));
        }
        out
    }

    /// The table of every layout at every concurrency, as Markdown whose columns line up in a
    /// terminal too.
    pub fn table(&self) -> String {
        let header = [
            "layout",
            "proxy",
            "c",
            "req/s",
            "rounds",
            "mean ms",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "failures",
            "vs direct",
            "proxy CPU µs/req",
            "backend CPU µs/req",
            "backend limit",
        ];
        let mut rows: Vec<Vec<String>> = Vec::with_capacity(self.cells.len());
        for (l, p, cells) in self.ordered() {
            for c in cells {
                rows.push(vec![
                    l.name.clone(),
                    p.map_or("–", Proxy::as_str).to_string(),
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
                    cpu_us(c.proxy_cpu_us_per_request),
                    cpu_list(&c.backend_cpu_us_per_request),
                    limit_list(&c.backend_concurrency_limit),
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
        for f in &self.proxies {
            let _ = writeln!(
                s,
                "- proxy {} {} (`{}`)",
                f.proxy.display_name(),
                f.version,
                f.program.display()
            );
        }
        for n in self.plan.notes.iter().chain(&self.skipped) {
            let _ = writeln!(s, "\n**Note:** {n}");
        }
        let _ = writeln!(
            s,
            "\n{}\nCPU: user + system time of the proxy's processes and of each backend process, from /proc, per response of the recorded windows of every round.\n",
            self.table()
        );
        for line in self.conclusions() {
            let _ = writeln!(s, "**{line}**\n");
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
        let several = self.proxies.len() > 1;
        let lines: Vec<(String, Vec<(f64, f64)>)> = self
            .ordered()
            .into_iter()
            .map(|(l, p, cells)| {
                let mut pts: Vec<(f64, f64)> = cells
                    .iter()
                    .map(|c| (c.concurrency as f64, c.requests_per_sec.median))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                (label(&self.plan.layouts, &l.id, p, several), pts)
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
    use crate::sweep::plan;

    fn cell(layout: &str, c: usize, rps: [f64; 3], failures: u64, vs: Option<f64>) -> Cell {
        let proxy = (layout != "direct").then_some(Proxy::Pinlb);
        proxied(layout, proxy, c, rps, failures, vs)
    }

    fn proxied(
        layout: &str,
        proxy: Option<Proxy>,
        c: usize,
        rps: [f64; 3],
        failures: u64,
        vs: Option<f64>,
    ) -> Cell {
        let mut sorted = rps;
        sorted.sort_by(f64::total_cmp);
        let spread = Spread {
            median: sorted[1],
            min: sorted[0],
            max: sorted[2],
        };
        Cell {
            layout: layout.into(),
            proxy,
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
            proxy_cpu_us_per_request: proxy.map(|_| 20.0),
            backend_cpu_us_per_request: vec![Some(40.0)],
            backend_concurrency_limit: match proxy {
                Some(Proxy::Pinlb) => vec![Some(12)],
                _ => Vec::new(),
            },
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
        let r = recommend(&p.layouts, &cells, false).unwrap();
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
        let r = recommend(&p.layouts, &cells, false).unwrap();
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
        let r = recommend(&p.layouts, &cells, false).unwrap();
        assert_eq!(r.name, "direct (1 backend)");
        assert_eq!(r.vs_direct, None);
        assert!(!r.sentence().contains("× direct"));

        let cells = vec![
            cell("direct", 10, [2000.0, 2000.0, 2000.0], 3, None),
            cell("p1b1", 10, [1000.0, 1000.0, 1000.0], 1, Some(0.5)),
        ];
        let r = recommend(&p.layouts, &cells, false).unwrap();
        assert!(r.with_failures);
        assert_eq!(r.layout, "direct");
        assert!(recommend(&p.layouts, &[], false).is_none());
    }

    fn bests(p: &Plan, cells: &[Cell]) -> Vec<Recommendation> {
        Proxy::ALL
            .iter()
            .filter_map(|x| {
                let own: Vec<Cell> = cells
                    .iter()
                    .filter(|c| c.proxy == Some(*x))
                    .cloned()
                    .collect();
                recommend(&p.layouts, &own, false)
            })
            .collect()
    }

    #[test]
    fn pinlb_against_a_peer_says_who_wins_by_how_much_and_by_cpu() {
        let p = plan(&[0, 1]);
        let mut ours = proxied(
            "p1b1",
            Some(Proxy::Pinlb),
            100,
            [1100.0, 1150.0, 1120.0],
            0,
            None,
        );
        ours.proxy_cpu_us_per_request = Some(20.0);
        let mut theirs = proxied(
            "p1b1",
            Some(Proxy::Nginx),
            100,
            [1000.0, 1010.0, 990.0],
            0,
            None,
        );
        theirs.proxy_cpu_us_per_request = Some(25.0);
        let cells = vec![
            cell("direct", 100, [900.0, 900.0, 900.0], 0, None),
            ours.clone(),
            theirs.clone(),
        ];
        let r = recommend(&p.layouts, &cells, true).unwrap();
        assert_eq!(r.name, "1 proxy core + 1 backend, pinlb");
        assert_eq!(r.proxy, Some(Proxy::Pinlb));
        assert_eq!(
            r.runner_up.as_ref().map(|x| x.0.as_str()),
            Some("1 proxy core + 1 backend, nginx")
        );
        let v = versus(&p.layouts, &cells, &bests(&p, &cells));
        assert_eq!(v.len(), 1);
        assert!(v[0].clear);
        let line = v[0].sentence();
        assert!(
            line.starts_with("pinlb vs nginx here: by req/s pinlb is ahead, 1.12×")
                && line.contains("pinlb is leaner, 0.80×, 20.0 µs against 25.0 µs"),
            "{line}"
        );

        // The other way round, it says so.
        ours.requests_per_sec = theirs.requests_per_sec;
        theirs.requests_per_sec = Spread {
            median: 1120.0,
            min: 1100.0,
            max: 1150.0,
        };
        ours.proxy_cpu_us_per_request = Some(30.0);
        let cells = vec![ours.clone(), theirs.clone()];
        let line = versus(&p.layouts, &cells, &bests(&p, &cells))[0].sentence();
        assert!(
            line.contains("pinlb is behind: nginx is 1.12× faster")
                && line.contains("pinlb uses more, 1.20×"),
            "{line}"
        );

        // Overlapping rounds are a tie.
        theirs.requests_per_sec = Spread {
            median: 1005.0,
            min: 950.0,
            max: 1050.0,
        };
        let cells = vec![ours, theirs];
        let line = versus(&p.layouts, &cells, &bests(&p, &cells))[0].sentence();
        assert!(line.contains("a tie within this run's noise"), "{line}");
        // Without pinlb there is nothing to compare.
        let nginx_only: Vec<Cell> = cells
            .iter()
            .filter(|c| c.proxy == Some(Proxy::Nginx))
            .cloned()
            .collect();
        assert!(versus(&p.layouts, &nginx_only, &bests(&p, &nginx_only)).is_empty());
    }

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(grouped(2471.4), "2,471");
        assert_eq!(grouped(999.0), "999");
        assert_eq!(grouped(1234567.0), "1,234,567");
        assert_eq!(grouped(0.0), "0");
    }
}
