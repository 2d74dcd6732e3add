//! A bench's results: built from the runs, and written out as a text table (what the command
//! prints), JSON (`--json`) and an SVG latency-percentile chart (`--plot`).

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use hdrhistogram::Histogram;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use super::load::RunResult;
use super::stats::{
    self, AddedLatency, Counts, CurvePoint, Errors, Latency, Spread, new_histogram,
    percentile_to_x, x_label,
};
use super::{BenchError, BenchOptions, hdr};
use pinlb::sys::cpus::format_cpu_list;

/// Everything a bench measured, with the settings it ran with. `bench merge` reads it back from
/// `--json` files, so every field deserialises too.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// The command line that ran it (for a merge, `pinlb bench merge FILE...`).
    #[serde(default)]
    pub command: Vec<String>,
    /// When the first warm-up began and the last recorded window ended, RFC 3339 UTC: with
    /// `--start-at`, how close together several machines began. A merge spans its runs.
    #[serde(default)]
    pub started_at: Option<String>,
    #[serde(default)]
    pub ended_at: Option<String>,
    /// Load generators whose runs this report adds up: 1 for a run, the sum for a merge.
    #[serde(default = "one")]
    pub machines: usize,
    /// Summed over the machines in a merge, as are `threads`.
    pub connections: usize,
    pub threads: usize,
    /// The cores the load threads were pinned to.
    pub cpus: Vec<usize>,
    pub rounds: usize,
    pub duration_s: f64,
    /// `-n`: each run was this many requests, and `duration_s` does not apply.
    pub requests_per_run: Option<u64>,
    /// The method and HTTP version of the requests, and whether connections were kept alive.
    pub method: String,
    pub http_version: String,
    pub keep_alive: bool,
    /// What a reader of the chart needs to trust it: pinlb's version and the machine's cores.
    pub pinlb_version: String,
    pub machine_cores: usize,
    pub warmup_s: f64,
    pub timeout_s: f64,
    /// Requests per second in open loop; `None` for closed loop.
    pub rate: Option<f64>,
    /// `--ws`: the bytes of each WebSocket message; `None` for HTTP. With it, a request is a
    /// message and its response the echo, so `requests_per_sec` is messages per second.
    pub message_size: Option<usize>,
    /// `--h2`: the concurrent streams per connection; `None` for HTTP/1.x. `http_version` is
    /// then `"2"`.
    pub streams: Option<usize>,
    /// In the order given; the first is what the others are compared against.
    pub targets: Vec<TargetReport>,
}

/// One target's results over all rounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetReport {
    pub name: String,
    pub url: String,
    /// Responses per second of each round: median, min and max.
    pub requests_per_sec: Spread,
    /// From the recorded windows of all rounds, merged.
    pub latency: Latency,
    /// The recorded windows of all rounds, summed.
    pub requests: Counts,
    /// The warm-ups of all rounds, summed: not in any other figure, but the server saw them.
    pub warmup: Counts,
    /// Against the first target; `None` for the first itself.
    pub vs_first: Option<Overhead>,
    pub rounds: Vec<RoundReport>,
    /// Latency by percentile, for plotting (the chart's points).
    pub percentiles: Vec<CurvePoint>,
    /// The merged latency histogram of the recorded windows, in ns (see [`hdr`] for its
    /// encoding in the JSON).
    #[serde(with = "hdr")]
    pub histogram: Histogram<u64>,
    /// Why the first failed connect failed ("connection refused"), if one did.
    pub connect_failure: Option<String>,
    /// CPU per response of the processes behind the target, read from `/proc` over the
    /// recorded windows (see [`super::cpu`]); `None` when they are not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<super::cpu::CpuUse>,
    /// Each backend's learned concurrency limit (pinlb's `adaptive`) at the end of the recorded
    /// windows, the median over the rounds, from pinlb's `/status` ([`super::limits`]): `None`
    /// for a backend that learns none (a `max_conns`); empty when the target is not a pinlb
    /// whose admin listener is known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends_concurrency_limit: Vec<Option<usize>>,
    /// pinlb's own time per request, from the `pinlb` metric of the `Server-Timing` header its
    /// responses carry when `server_timing` is on (see `proxy/src/proxy/timing.rs`), over the
    /// recorded windows of all rounds; `None` when no response carried one. A `bench merge`
    /// leaves it out: percentiles can't be added up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinlb_time: Option<Latency>,
}

impl TargetReport {
    /// A target's figures from its rounds: the histograms and counts added up, the rates'
    /// spread, and against `first` (the first target, already built) its overhead. A single
    /// run and a merge both end here, so they print alike.
    pub(crate) fn of_rounds(
        name: String,
        url: String,
        rounds: Vec<RoundReport>,
        connect_failure: Option<String>,
        first: Option<&TargetReport>,
    ) -> Result<TargetReport, BenchError> {
        let mut histogram = new_histogram()?;
        let mut requests = Counts::default();
        let mut warmup = Counts::default();
        for r in &rounds {
            histogram.add(&r.histogram)?;
            requests.add(&r.requests);
            warmup.add(&r.warmup);
        }
        let rps: Vec<f64> = rounds.iter().map(|r| r.requests_per_sec).collect();
        let latency = Latency::of(&histogram);
        let vs_first = first.map(|first| {
            let first_rps: Vec<f64> = first.rounds.iter().map(|r| r.requests_per_sec).collect();
            let band = |pick: fn(&Latency) -> f64| {
                half_range(first.rounds.iter().map(|r| pick(&r.latency)))
                    + half_range(rounds.iter().map(|r| pick(&r.latency)))
            };
            Overhead {
                against: first.name.clone(),
                throughput_ratio: stats::paired_ratio(&rps, &first_rps),
                added_latency: latency.minus(&first.latency),
                noise: AddedLatency {
                    p50_us: band(|l| l.p50_us),
                    p90_us: band(|l| l.p90_us),
                    p99_us: band(|l| l.p99_us),
                    p999_us: band(|l| l.p999_us),
                    max_us: band(|l| l.max_us),
                },
            }
        });
        Ok(TargetReport {
            name,
            url,
            requests_per_sec: stats::spread(&rps).unwrap_or(Spread {
                median: 0.0,
                min: 0.0,
                max: 0.0,
            }),
            latency,
            requests,
            warmup,
            vs_first,
            rounds,
            percentiles: stats::percentile_curve(&histogram),
            histogram,
            connect_failure,
            cpu: None,
            backends_concurrency_limit: Vec::new(),
            pinlb_time: None,
        })
    }
}

/// One round of one target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoundReport {
    /// Responses in the recorded window divided by `elapsed_s`; in a merge, the machines'
    /// rates summed (they ran at the same time).
    pub requests_per_sec: f64,
    /// From the start of the recorded window until every request sent in it was answered or
    /// timed out: the duration plus the last responses' latency.
    pub elapsed_s: f64,
    pub latency: Latency,
    pub requests: Counts,
    pub warmup: Counts,
    /// The recorded window's latency histogram in ns (see [`hdr`]): what a merge adds up.
    #[serde(with = "hdr")]
    pub histogram: Histogram<u64>,
}

/// What a target costs on top of the first: "the proxy's overhead" when the first is the backend
/// alone and this one the proxy in front of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Overhead {
    /// The first target's name.
    pub against: String,
    /// This target's requests/s ÷ the first's, paired per round and the median taken (see
    /// [`stats::paired_ratio`]); `None` when the first completed nothing.
    pub throughput_ratio: Option<f64>,
    /// This target's latency − the first's, at each percentile of the merged histograms.
    pub added_latency: AddedLatency,
    /// How far each percentile moved between rounds: half the range of the first target's
    /// per-round values plus half of this one's. An added latency within it is noise, and the
    /// table prints it as "≈0".
    pub noise: AddedLatency,
}

impl Report {
    /// Builds the report from `runs[target][round]`.
    pub(crate) fn build(
        opts: &BenchOptions,
        cpus: &[usize],
        runs: Vec<Vec<RunResult>>,
    ) -> Result<Report, BenchError> {
        let mut targets: Vec<TargetReport> = Vec::with_capacity(runs.len());
        for (target, rounds) in opts.targets.iter().zip(runs) {
            let connect_failure = rounds
                .iter()
                .find_map(|r| r.connect_failure)
                .map(|k| k.to_string());
            let mut pinlb_time = new_histogram()?;
            for r in &rounds {
                pinlb_time.add(&r.pinlb_time)?;
            }
            let per_round = rounds
                .into_iter()
                .map(|r| {
                    let elapsed = r.elapsed.as_secs_f64();
                    RoundReport {
                        requests_per_sec: stats::ratio(r.recorded.responses as f64, elapsed)
                            .unwrap_or(0.0),
                        elapsed_s: elapsed,
                        latency: Latency::of(&r.histogram),
                        requests: r.recorded,
                        warmup: r.warmup,
                        histogram: r.histogram,
                    }
                })
                .collect();
            let mut t = TargetReport::of_rounds(
                target.name.clone(),
                target.url.to_string(),
                per_round,
                connect_failure,
                targets.first(),
            )?;
            t.pinlb_time = (!pinlb_time.is_empty()).then(|| Latency::of(&pinlb_time));
            targets.push(t);
        }
        Ok(Report {
            command: std::env::args().collect(),
            started_at: None,
            ended_at: None,
            machines: 1,
            connections: opts.connections,
            threads: opts.threads,
            cpus: cpus.to_vec(),
            rounds: opts.rounds,
            duration_s: opts.duration.as_secs_f64(),
            requests_per_run: opts.requests,
            method: opts.request.method.to_string(),
            http_version: match (opts.http2, opts.request.http10) {
                (Some(_), _) => "2",
                (None, true) => "1.0",
                (None, false) => "1.1",
            }
            .into(),
            keep_alive: opts.request.keep_alive,
            pinlb_version: env!("CARGO_PKG_VERSION").into(),
            machine_cores: machine_cores(),
            warmup_s: opts.warmup.as_secs_f64(),
            timeout_s: opts.timeout.as_secs_f64(),
            rate: opts.rate,
            message_size: opts.websocket,
            streams: opts.http2,
            targets,
        })
    }

    /// The results as Markdown tables with a line saying how they were measured: what `pinlb
    /// bench` prints.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{}\n", self.describe());
        let _ = writeln!(
            out,
            "| target | {} | min | max | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | errors |",
            self.unit()
        );
        out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
        for t in &self.targets {
            let l = &t.latency;
            let _ = writeln!(
                out,
                "| {} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} |",
                t.name,
                t.requests_per_sec.median,
                t.requests_per_sec.min,
                t.requests_per_sec.max,
                us(l.p50_us),
                us(l.p90_us),
                us(l.p99_us),
                us(l.p999_us),
                us(l.max_us),
                errors(&t.requests.errors),
            );
        }
        out.push_str(
            "\nresponses (recorded windows, all rounds):\n\n| target | 1xx | 2xx | 3xx | 4xx | 5xx | codes | bytes read |\n|---|---:|---:|---:|---:|---:|---|---:|\n",
        );
        for t in &self.targets {
            let st = &t.requests.statuses;
            let c = st.classes;
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                t.name,
                c[0],
                c[1],
                c[2],
                c[3],
                c[4],
                codes(st),
                t.requests.bytes_read,
            );
        }
        let others: Vec<&TargetReport> = self.targets.iter().skip(1).collect();
        if let (Some(first), false) = (self.targets.first(), others.is_empty()) {
            let _ = writeln!(
                out,
                "\nagainst {} (throughput: the median of per-round ratios; latency: the difference at each percentile):\n",
                first.name
            );
            out.push_str(
                "| target | throughput | +p50 µs | +p90 µs | +p99 µs | +p99.9 µs | +max µs |\n",
            );
            out.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
            for t in others {
                let Some(o) = &t.vs_first else { continue };
                let a = &o.added_latency;
                // A target that answered nothing has no ratio and no latency to compare.
                if t.requests.responses == 0 || first.requests.responses == 0 {
                    let _ = writeln!(out, "| {} | n/a | n/a | n/a | n/a | n/a | n/a |", t.name);
                    continue;
                }
                let ratio = o
                    .throughput_ratio
                    .map_or_else(|| "n/a".into(), |r| format!("{r:.2}×"));
                let n = &o.noise;
                let _ = writeln!(
                    out,
                    "| {} | {ratio} | {} | {} | {} | {} | {} |",
                    t.name,
                    added(a.p50_us, n.p50_us),
                    added(a.p90_us, n.p90_us),
                    added(a.p99_us, n.p99_us),
                    added(a.p999_us, n.p999_us),
                    added(a.max_us, n.max_us),
                );
            }
        }
        if self.targets.iter().any(|t| t.cpu.is_some()) {
            out.push_str(&self.cpu_table());
        }
        if self.targets.iter().any(|t| t.pinlb_time.is_some()) {
            out.push_str(&self.pinlb_time_table());
        }
        out
    }

    /// pinlb's own time per request beside the latency, for the targets whose responses said
    /// it.
    fn pinlb_time_table(&self) -> String {
        let mut out = String::from(
            "
pinlb's own time per request (the `pinlb` metric of its `Server-Timing` header: the route, the pick and the request head written, without the backend's time):

| target | p50 µs | p90 µs | p99 µs | p99.9 µs | of latency at p50 |
|---|---:|---:|---:|---:|---:|
",
        );
        for t in &self.targets {
            let Some(p) = &t.pinlb_time else {
                let _ = writeln!(out, "| {} | – | – | – | – | – |", t.name);
                continue;
            };
            let share = stats::ratio(p.p50_us * 100.0, t.latency.p50_us)
                .map_or_else(|| "n/a".into(), |r| format!("{r:.1}%"));
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {share} |",
                t.name,
                us(p.p50_us),
                us(p.p90_us),
                us(p.p99_us),
                us(p.p999_us),
            );
        }
        out
    }

    /// CPU per request of each target's processes, where they are known.
    fn cpu_table(&self) -> String {
        let mut out = String::from(
            "
CPU per request (user + system µs per response of the recorded windows, from /proc; server: what answers at the target's address, with its child processes):

| target | server µs/req | backends µs/req | backends' learned limit | server pids |
|---|---:|---:|---:|---|
",
        );
        for t in &self.targets {
            let (server, backends, pids) = match &t.cpu {
                Some(c) => (
                    cpu_us(c.server_us_per_request),
                    cpu_list(&c.backends_us_per_request),
                    c.server_pids
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(" "),
                ),
                None => ("–".into(), "–".into(), "–".into()),
            };
            let pids = if pids.is_empty() { "–".into() } else { pids };
            let limits = super::limits::limit_list(&t.backends_concurrency_limit);
            let _ = writeln!(
                out,
                "| {} | {server} | {backends} | {limits} | {pids} |",
                t.name
            );
        }
        out
    }

    /// One line per target that answered nothing at all, saying why: `pinlb bench` exits 1
    /// when there are any, since no figure of the run then means anything.
    pub fn failures(&self) -> Vec<String> {
        self.targets
            .iter()
            .filter(|t| t.requests.responses == 0)
            .map(|t| {
                let e = &t.requests.errors;
                let what = if self.message_size.is_some() {
                    "message"
                } else {
                    "request"
                };
                let why = match (&t.connect_failure, e.connect) {
                    (Some(kind), n) if n > 0 => format!("{n} connect(s) failed: {kind}"),
                    _ if e.total() > 0 => format!("errors: {}", errors(e)),
                    // Nothing failed either: the window ended first, which no error counts.
                    _ if t.requests.sent == 0 => format!(
                        "no {what} was sent within the {} window and no error was counted: {}",
                        self.window(),
                        if self.message_size.is_some() {
                            "the WebSocket handshakes were not answered (or the first messages not written) before it ended; a longer -d, or a --timeout shorter than it to count a handshake that hangs as an error"
                        } else {
                            "no connection was ready before it ended; a longer -d, or a --timeout shorter than it to count a connection that hangs as an error"
                        }
                    ),
                    _ => format!(
                        "{} {what}(s) sent, none answered within the {} window and no error was counted",
                        t.requests.sent,
                        self.window()
                    ),
                };
                let answered = if self.message_size.is_some() {
                    "echoed no message"
                } else {
                    "answered no request"
                };
                format!("target {} ({}) {answered}; {why}", t.name, t.url)
            })
            .collect()
    }

    /// Each round's recorded window, for a message: `0.2 s`, or `10-request`.
    fn window(&self) -> String {
        match self.requests_per_run {
            Some(n) => format!(
                "{n}-{}",
                if self.message_size.is_some() {
                    "message"
                } else {
                    "request"
                }
            ),
            None => format!("{} s", secs(self.duration_s)),
        }
    }

    /// What the rates count: `req/s`, or `msg/s` for WebSocket messages.
    pub fn unit(&self) -> &'static str {
        if self.message_size.is_some() {
            "msg/s"
        } else {
            "req/s"
        }
    }

    /// One line: the loop, the connections and threads, the cores, the rounds.
    fn describe(&self) -> String {
        let mut mode = match self.rate {
            Some(r) => format!("open loop at {r:.0} req/s (latency from the scheduled send time)"),
            None => "closed loop".into(),
        };
        if let Some(size) = self.message_size {
            mode.push_str(&format!(
                ", WebSocket echo of {size}-byte messages (latency from each message's write to its echo's end; handshakes not timed)"
            ));
        }
        let warmup = if self.warmup_s > 0.0 {
            format!(" after {} s of warm-up", secs(self.warmup_s))
        } else {
            String::new()
        };
        let window = match self.requests_per_run {
            Some(n) => format!("{n} requests"),
            None => format!("{} s", secs(self.duration_s)),
        };
        let request = if self.message_size.is_some() {
            String::new()
        } else {
            format!(
                "; {} over HTTP/{}{}",
                self.method,
                self.http_version,
                match (self.streams, self.keep_alive) {
                    (Some(m), _) => format!(", {m} concurrent stream(s) per connection"),
                    (None, true) => String::new(),
                    (None, false) => ", a new connection per request".into(),
                }
            )
        };
        // A merge's connections and threads are every machine's together; its cores are the
        // first machine's, each machine having its own.
        let load = if self.machines > 1 {
            format!(
                "{} connection(s) on {} thread(s) over {} machines merged (rates summed per round, percentiles from the added histograms), cores {} each",
                self.connections,
                self.threads,
                self.machines,
                format_cpu_list(&self.cpus),
            )
        } else {
            format!(
                "{} connection(s) on {} thread(s), cores {}",
                self.connections,
                self.threads,
                format_cpu_list(&self.cpus),
            )
        };
        format!(
            "{} target(s), {} interleaved round(s) of {window}{warmup}; {mode}{request}; {load}; timeout {} s",
            self.targets.len(),
            self.rounds,
            secs(self.timeout_s),
        )
    }

    /// Writes the report as pretty-printed JSON.
    pub fn write_json(&self, path: &Path) -> io::Result<()> {
        let json = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        std::fs::write(path, json)
    }

    /// Writes a latency-by-percentile chart of every target as SVG: the x axis is `1/(1-p)` on a
    /// log scale labelled 0%, 90%, 99%, 99.9%, …, so every "nine" gets the same width, as in
    /// HdrHistogram's plots; y is latency in milliseconds; one line per target.
    pub fn write_svg(&self, path: &Path) -> Result<(), BenchError> {
        let plot_err = |reason: String| BenchError::Plot {
            path: path.to_path_buf(),
            reason,
        };
        let svg = self.svg().map_err(plot_err)?;
        std::fs::write(path, svg).map_err(|e| plot_err(e.to_string()))
    }

    /// The chart's subtitle, two lines a reader can trust without the terminal: how it was
    /// measured, and each target's rate.
    fn subtitle(&self) -> [String; 2] {
        let window = match self.requests_per_run {
            Some(n) => format!("{n} requests"),
            None => format!("{} s", secs(self.duration_s)),
        };
        let rates = self
            .targets
            .iter()
            .map(|t| {
                format!(
                    "{} {:.0} {}",
                    t.name,
                    t.requests_per_sec.median,
                    self.unit()
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        [
            format!(
                "{} connection(s), {} round(s) of {window}, load on cores {} · pinlb {} · {} core(s) on the machine",
                self.connections,
                self.rounds,
                format_cpu_list(&self.cpus),
                self.pinlb_version,
                self.machine_cores,
            ),
            format!("median of rounds: {rates}"),
        ]
    }

    fn svg(&self) -> Result<String, String> {
        let lines: Vec<(&str, Vec<(f64, f64)>)> = self
            .targets
            .iter()
            .map(|t| {
                let pts = t
                    .percentiles
                    .iter()
                    .map(|c| (percentile_to_x(c.percentile), c.latency_us / 1000.0))
                    .collect();
                (t.name.as_str(), pts)
            })
            .collect();
        let max_x = lines
            .iter()
            .flat_map(|(_, pts)| pts.iter().map(|p| p.0))
            .fold(100.0f64, f64::max);
        // Whole decades, so the axis ends on a labelled "nine".
        let max_x = 10f64.powf(max_x.log10().ceil());
        let max_y = lines
            .iter()
            .flat_map(|(_, pts)| pts.iter().map(|p| p.1))
            .fold(0.0f64, f64::max);
        let max_y = if max_y > 0.0 { max_y * 1.05 } else { 1.0 };
        let decades: Vec<f64> = (0..=max_x.log10().round() as i32)
            .map(|e| 10f64.powi(e))
            .collect();

        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (900, 580)).into_drawing_area();
            root.fill(&WHITE).map_err(|e| e.to_string())?;
            let (top, body) = root.split_vertically(64);
            let style = ("sans-serif", 13).into_font().color(&BLACK.mix(0.75));
            for (i, line) in self.subtitle().iter().enumerate() {
                top.draw(&Text::new(
                    line.clone(),
                    (16, 36 + 15 * i as i32),
                    style.clone(),
                ))
                .map_err(|e| e.to_string())?;
            }
            let mut chart = ChartBuilder::on(&body)
                .caption("latency by percentile", ("sans-serif", 22))
                .margin(16)
                .margin_right(40)
                .x_label_area_size(44)
                .y_label_area_size(64)
                .build_cartesian_2d(
                    (1.0..max_x).log_scale().with_key_points(decades),
                    0.0..max_y,
                )
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_desc("percentile")
                .y_desc("latency (ms)")
                .x_label_formatter(&|x| x_label(*x))
                .max_light_lines(4)
                .draw()
                .map_err(|e| e.to_string())?;
            for (i, (name, pts)) in lines.into_iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                // Each line ends at the last percentile its own sample resolves (the maximum),
                // marked with a dot: a shorter line had fewer responses, not a cut axis.
                if let Some(&end) = pts.last() {
                    chart
                        .draw_series(std::iter::once(Circle::new(end, 4, color.filled())))
                        .map_err(|e| e.to_string())?;
                }
                chart
                    .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                    .map_err(|e| e.to_string())?
                    .label(name)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| e.to_string())?;
            root.present().map_err(|e| e.to_string())?;
        }
        Ok(svg)
    }
}

/// The default of [`Report::machines`] in a file written before merges.
fn one() -> usize {
    1
}

/// A latency in µs for the table: whole µs from 100 µs up, one decimal below.
fn us(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// An added latency: "≈0 (±12.0)" when it is within the rounds' noise or below zero (a
/// target cannot be faster than the one it stands in front of, so that is noise too), else
/// "+35.2".
fn added(v: f64, noise: f64) -> String {
    if v.abs() <= noise || v < 0.0 {
        format!("≈0 (±{})", us(noise.max(v.abs())))
    } else {
        signed_us(v)
    }
}

/// Half the range of per-round values; 0 for none or one.
fn half_range(values: impl Iterator<Item = f64>) -> f64 {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if hi >= lo { (hi - lo) / 2.0 } else { 0.0 }
}

/// The status codes seen, most frequent first: "200 ×9000, 503 ×3".
fn codes(st: &super::stats::Statuses) -> String {
    let mut parts: Vec<String> = st.top().iter().map(|(c, n)| format!("{c} ×{n}")).collect();
    if st.other_codes > 0 {
        parts.push(format!("others ×{}", st.other_codes));
    }
    if parts.is_empty() {
        "–".into()
    } else {
        parts.join(", ")
    }
}

/// Cores the machine has online (not only those this process may use), for the chart.
fn machine_cores() -> usize {
    use procfs::Current as _;
    procfs::CpuInfo::current()
        .map(|c| c.num_cores())
        .ok()
        .filter(|&n| n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
        .unwrap_or(1)
}

fn signed_us(v: f64) -> String {
    if v >= 0.0 {
        format!("+{}", us(v))
    } else {
        us(v)
    }
}

fn secs(s: f64) -> String {
    let t = format!("{s:.3}");
    t.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// "0", or the kinds that occurred: "connect 3, non-2xx 12".
pub(crate) fn errors(e: &Errors) -> String {
    if e.total() == 0 {
        return "0".into();
    }
    let kinds = [
        ("connect", e.connect),
        ("handshake", e.handshake),
        ("timeout", e.timeout),
        ("read", e.read),
        ("non-2xx", e.non_2xx),
    ];
    kinds
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// µs of CPU per request, "–" when unknown.
pub fn cpu_us(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.1}"))
}

/// Each backend's µs per request joined with " + " (they add up to the backends' CPU per
/// request); "–" when none is known.
pub fn cpu_list(v: &[Option<f64>]) -> String {
    if v.iter().all(Option::is_none) {
        return "–".into();
    }
    v.iter().map(|b| cpu_us(*b)).collect::<Vec<_>>().join(" + ")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::bench::Target;
    use std::time::Duration;

    pub(crate) fn run(rps: f64, latency_us: u64) -> RunResult {
        let mut histogram = new_histogram().unwrap();
        let n = rps as u64;
        for _ in 0..n {
            histogram.record(latency_us * 1000).unwrap();
        }
        RunResult {
            histogram,
            pinlb_time: new_histogram().unwrap(),
            recorded: Counts {
                sent: n,
                responses: n,
                ok: n,
                errors: Errors::default(),
                statuses: {
                    let mut s = super::super::stats::Statuses::default();
                    s.add(200, n);
                    s
                },
                bytes_read: n * 100,
            },
            warmup: Counts::default(),
            elapsed: Duration::from_secs(1),
            connect_failure: None,
        }
    }

    pub(crate) fn opts() -> BenchOptions {
        BenchOptions {
            targets: vec![
                "direct=http://127.0.0.1:1/".parse::<Target>().unwrap(),
                "proxied=http://127.0.0.1:2/".parse::<Target>().unwrap(),
            ],
            connections: 4,
            threads: 1,
            duration: Duration::from_secs(1),
            requests: None,
            request: crate::bench::RequestSpec::default(),
            warmup: Duration::ZERO,
            rounds: 2,
            rate: None,
            websocket: None,
            http2: None,
            cpus: vec![0],
            timeout: Duration::from_secs(2),
            trust: crate::bench::Trust::default(),
            start_at: None,
            progress: false,
        }
    }

    fn report() -> Report {
        let runs = vec![
            vec![run(1000.0, 100), run(2000.0, 100)],
            vec![run(500.0, 150), run(1000.0, 150)],
        ];
        Report::build(&opts(), &[1], runs).unwrap()
    }

    #[test]
    fn the_report_compares_every_target_with_the_first() {
        let r = report();
        let direct = &r.targets[0];
        assert!(direct.vs_first.is_none());
        assert_eq!(direct.requests_per_sec.median, 1500.0);
        assert_eq!(direct.requests.sent, 3000);
        let proxied = r.targets[1].vs_first.as_ref().unwrap();
        assert_eq!(proxied.against, "direct");
        assert_eq!(proxied.throughput_ratio, Some(0.5));
        assert!((proxied.added_latency.p50_us - 50.0).abs() < 0.2);
    }

    #[test]
    fn the_table_has_a_row_per_target_and_the_overhead_of_the_others() {
        let t = report().table();
        assert!(
            t.contains("| direct | 1500 | 1000 | 2000 | 100 | 100 |"),
            "{t}"
        );
        assert!(t.contains("| proxied | 0.50× | +50.0 |"), "{t}");
        assert!(
            t.contains("| direct | 0 | 3000 | 0 | 0 | 0 | 200 ×3000 | 300000 |"),
            "{t}"
        );
        assert!(
            t.contains("2 interleaved round(s) of 1 s; closed loop"),
            "{t}"
        );
    }

    #[test]
    fn json_has_the_figures_and_each_round_s_histogram_encoded() {
        let r = report();
        let v = serde_json::to_value(&r).unwrap();
        let t = &v["targets"][1];
        assert_eq!(t["name"], "proxied");
        assert_eq!(t["vs_first"]["throughput_ratio"], 0.5);
        assert_eq!(t["requests"]["errors"]["non_2xx"], 0);
        assert!(t["percentiles"].as_array().unwrap().len() > 10);
        let round = hdr::decode(t["rounds"][1]["histogram"].as_str().unwrap()).unwrap();
        assert_eq!(round.len(), 1000);
        let all = hdr::decode(t["histogram"].as_str().unwrap()).unwrap();
        assert_eq!(all, r.targets[1].histogram);
        let back: Report = serde_json::from_value(v).unwrap();
        assert_eq!(back.targets[1].requests, r.targets[1].requests);
        assert_eq!(back.machines, 1);
    }

    #[test]
    fn the_chart_has_a_line_and_a_legend_entry_per_target() {
        let svg = report().svg().unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
        assert!(svg.contains("direct") && svg.contains("proxied"));
        assert!(svg.contains("99.9%") && svg.contains("latency (ms)"));
        assert!(svg.matches("<polyline").count() >= 2);
        assert_eq!(
            svg.matches("<circle").count(),
            2,
            "each line's end is marked"
        );
    }

    #[test]
    fn a_websocket_report_counts_messages() {
        let opts = BenchOptions {
            websocket: Some(64),
            ..opts()
        };
        let runs = vec![vec![run(1000.0, 100)], vec![run(500.0, 150)]];
        let r = Report::build(&opts, &[1], runs).unwrap();
        let t = r.table();
        assert!(t.contains("| target | msg/s | min |"), "{t}");
        assert!(
            t.contains("closed loop, WebSocket echo of 64-byte messages"),
            "{t}"
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["message_size"], 64);
        assert_eq!(
            serde_json::to_value(report()).unwrap()["message_size"],
            serde_json::Value::Null
        );
    }

    #[test]
    fn added_latency_within_the_noise_or_below_zero_is_about_zero() {
        assert_eq!(added(50.0, 10.0), "+50.0");
        assert_eq!(added(8.0, 10.0), "≈0 (±10.0)");
        assert_eq!(added(-367.0, 10.0), "≈0 (±367)");
        assert_eq!(half_range([3.0, 9.0, 5.0].into_iter()), 3.0);
        assert_eq!(half_range(std::iter::empty()), 0.0);
    }

    #[test]
    fn a_target_that_answered_nothing_is_a_failure_with_its_reason() {
        let mut refused = run(0.0, 100);
        refused.recorded.errors.connect = 7;
        refused.connect_failure = Some(std::io::ErrorKind::ConnectionRefused);
        let runs = vec![vec![run(1000.0, 100)], vec![refused]];
        let opts = BenchOptions {
            rounds: 1,
            ..opts()
        };
        let r = Report::build(&opts, &[1], runs).unwrap();
        let f = r.failures();
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].contains("proxied") && f[0].contains("7 connect(s) failed: connection refused"),
            "{f:?}"
        );
        let t = r.table();
        assert!(t.contains("| proxied | n/a | n/a |"), "{t}");
        assert!(!t.contains("0.00×"), "{t}");
        assert!(report().failures().is_empty());
    }

    #[test]
    fn the_chart_says_how_it_was_measured() {
        let svg = report().svg().unwrap();
        assert!(
            svg.contains("4 connection(s), 2 round(s) of 1 s"),
            "subtitle missing"
        );
        assert!(svg.contains("direct 1500 req/s, proxied 750 req/s"));
        assert!(svg.contains(&format!("pinlb {}", env!("CARGO_PKG_VERSION"))));
    }

    #[test]
    fn errors_list_only_the_kinds_that_happened() {
        assert_eq!(errors(&Errors::default()), "0");
        let e = Errors {
            connect: 3,
            non_2xx: 12,
            ..Errors::default()
        };
        assert_eq!(errors(&e), "connect 3, non-2xx 12");
    }

    #[test]
    fn numbers_are_printed_compactly() {
        assert_eq!(us(1234.56), "1235");
        assert_eq!(us(42.25), "42.2");
        assert_eq!(signed_us(5.0), "+5.0");
        assert_eq!(signed_us(-150.0), "-150");
        assert_eq!(secs(10.0), "10");
        assert_eq!(secs(0.25), "0.25");
    }
}
