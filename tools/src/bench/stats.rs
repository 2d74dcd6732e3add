//! The statistics of a bench report, as plain functions over plain numbers: medians over rounds,
//! percentiles read from HDR histograms, ratios and added latency against the first target, and
//! the percentile curve the chart draws.
//!
//! Latencies are recorded in nanoseconds (see [`new_histogram`]) and reported in microseconds as
//! `f64`, so a 30 µs loopback latency keeps its digits.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Histograms track 3 significant digits: a value is off by at most 0.1%.
const SIGFIG: u8 = 3;
/// Largest latency a histogram holds, in ns (1 hour); longer ones are recorded as this.
const HIGHEST_NS: u64 = 3_600_000_000_000;
/// Curve points per decade of the chart's `1/(1-p)` axis.
const CURVE_POINTS_PER_DECADE: u32 = 20;
/// The curve stops at 99.9999%: beyond that nothing is plotted even for long runs.
const CURVE_MAX_X: f64 = 1e6;

/// An empty latency histogram in nanoseconds, 1 ns to 1 hour, 3 significant digits.
///
/// It cannot fail with these constant bounds, but hdrhistogram's constructors return a `Result`
/// and pinlb does not unwrap outside tests, so the error travels up as [`super::BenchError`].
pub fn new_histogram() -> Result<Histogram<u64>, hdrhistogram::CreationError> {
    Histogram::new_with_bounds(1, HIGHEST_NS, SIGFIG)
}

/// Median, min and max of per-round values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// The median of `values` (the mean of the middle two for an even count); `None` when empty.
/// NaNs sort last, so one bad value cannot reorder the rest.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Median, min and max of `values`; `None` when empty.
pub fn spread(values: &[f64]) -> Option<Spread> {
    let median = median(values)?;
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some(Spread { median, min, max })
}

/// `a / b`, or `None` when `b` is zero (or either is not finite): a target that completed
/// nothing has no meaningful ratio.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    let r = a / b;
    (b != 0.0 && r.is_finite()).then_some(r)
}

/// The throughput of each round's target divided by the first target's in the same round, then
/// the median of those ratios. Each pair ran back to back, so drift between rounds (a busier
/// machine, a warmer cache) cancels out better than in a ratio of two medians. Rounds where the
/// first target completed nothing are left out; `None` when none is left.
pub fn paired_ratio(target: &[f64], first: &[f64]) -> Option<f64> {
    let ratios: Vec<f64> = target
        .iter()
        .zip(first)
        .filter_map(|(&t, &f)| ratio(t, f))
        .collect();
    median(&ratios)
}

/// The latency percentiles of a report, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

impl Latency {
    /// Reads the percentiles of a nanosecond histogram. Each is the highest value equivalent to
    /// the one at that quantile (within 0.1%), as wrk and HdrHistogram report them. An empty
    /// histogram gives zeros.
    pub fn of(h: &Histogram<u64>) -> Latency {
        let at = |q: f64| ns_to_us(h.value_at_quantile(q));
        Latency {
            p50_us: at(0.50),
            p90_us: at(0.90),
            p99_us: at(0.99),
            p999_us: at(0.999),
            max_us: ns_to_us(h.max()),
            mean_us: h.mean() / 1000.0,
        }
    }

    /// `self − first` at each percentile: what a target adds on top of the first one (a proxy's
    /// overhead when the first target is the backend alone). Negative when it is faster.
    pub fn minus(&self, first: &Latency) -> AddedLatency {
        AddedLatency {
            p50_us: self.p50_us - first.p50_us,
            p90_us: self.p90_us - first.p90_us,
            p99_us: self.p99_us - first.p99_us,
            p999_us: self.p999_us - first.p999_us,
            max_us: self.max_us - first.max_us,
        }
    }
}

/// Latency one target adds over the first at each percentile, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AddedLatency {
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

fn ns_to_us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// One point of a latency-by-percentile curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    /// 0 to 100.
    pub percentile: f64,
    pub latency_us: f64,
}

/// The latency at percentiles spaced evenly on a log `1/(1-p)` axis (0%, then 20 points per
/// "nine": 90%, 99%, 99.9%, …), as HdrHistogram's percentile plots draw them. It stops at the
/// first point past what the sample can resolve (`1/(1-p)` > the number of values, where the
/// percentile is just the maximum) and at 99.9999%; that last point is the maximum. Empty for an
/// empty histogram.
pub fn percentile_curve(h: &Histogram<u64>) -> Vec<CurvePoint> {
    let n = h.len();
    if n == 0 {
        return Vec::new();
    }
    let last_x = (n as f64).clamp(10.0, CURVE_MAX_X);
    let mut out = Vec::new();
    for i in 0.. {
        let x = 10f64.powf(f64::from(i) / f64::from(CURVE_POINTS_PER_DECADE));
        let x = x.min(last_x);
        let q = 1.0 - 1.0 / x;
        out.push(CurvePoint {
            percentile: q * 100.0,
            latency_us: ns_to_us(h.value_at_quantile(q)),
        });
        if x >= last_x {
            break;
        }
    }
    out
}

/// The chart's x coordinate of a percentile (0 to 100): `1/(1-p)`, so each "nine" takes the
/// same width on a log axis. Capped at 10⁶ (99.9999%) for 100%.
pub fn percentile_to_x(percentile: f64) -> f64 {
    let rest = 1.0 - percentile / 100.0;
    if rest <= 1.0 / CURVE_MAX_X {
        CURVE_MAX_X
    } else {
        1.0 / rest
    }
}

/// The label of an x coordinate on the chart's axis: `1` → "0%", `10` → "90%", `100` → "99%",
/// `1000` → "99.9%", with as many decimals as the percentile needs.
pub fn x_label(x: f64) -> String {
    if x <= 1.0 {
        return "0%".into();
    }
    let p = 100.0 - 100.0 / x;
    let nines = x.log10().round().max(0.0) as usize;
    format!("{:.*}%", nines.saturating_sub(2), p)
}

/// Requests counted in one phase (warm-up or recorded). Every request sent ends as exactly one
/// of a response, a timeout or a read error: `sent == responses + errors.timeout + errors.read`,
/// and `responses == ok + errors.non_2xx`. Connect and handshake errors sent nothing.
///
/// With `--ws` a request is a message and a response its echo; every echo counts as ok.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Requests written (or begun to be written) on a connection: what the server may have seen.
    pub sent: u64,
    /// Complete responses, any status.
    pub responses: u64,
    /// Responses with a 2xx status.
    pub ok: u64,
    pub errors: Errors,
    /// Complete responses by status.
    pub statuses: Statuses,
    /// Bytes read from the target (heads and bodies, or echoes), in complete responses and
    /// broken ones alike.
    pub bytes_read: u64,
}

/// Responses by status class, and by code for the first [`CODES`] distinct codes seen (a
/// server answers with a handful; the rest are counted as `other_codes`). Fixed-size, so that
/// counting a response allocates nothing and `Counts` stays `Copy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Statuses {
    /// 1xx to 5xx; a code outside 100–599 counts in neither.
    pub classes: [u64; 5],
    /// `(code, count)`, unused slots with code 0.
    codes: [(u16, u64); CODES],
    /// Responses whose code found no free slot in `codes`.
    pub other_codes: u64,
}

/// Distinct status codes counted one by one.
const CODES: usize = 8;

impl Statuses {
    pub fn add(&mut self, status: u16, n: u64) {
        if let Some(c) = (status / 100)
            .checked_sub(1)
            .and_then(|i| self.classes.get_mut(usize::from(i)))
        {
            *c += n;
        }
        self.add_code(status, n);
    }

    fn add_code(&mut self, status: u16, n: u64) {
        match self
            .codes
            .iter_mut()
            .find(|(code, _)| *code == status || *code == 0)
        {
            Some(slot) => *slot = (status, slot.1 + n),
            None => self.other_codes += n,
        }
    }

    /// Codes by count, most frequent first (then by code).
    pub fn top(&self) -> Vec<(u16, u64)> {
        let mut v: Vec<(u16, u64)> = self.codes.iter().copied().filter(|c| c.0 != 0).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    fn merge(&mut self, other: &Statuses) {
        for (mine, theirs) in self.classes.iter_mut().zip(&other.classes) {
            *mine += theirs;
        }
        for (code, n) in other.codes.iter().copied().filter(|c| c.0 != 0) {
            self.add_code(code, n);
        }
        self.other_codes += other.other_codes;
    }
}

impl Serialize for Statuses {
    /// `{"2xx": 9, ..., "codes": {"200": 9}, "other_codes": 0}`: only the classes and codes seen.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let codes: std::collections::BTreeMap<String, u64> = self
            .top()
            .into_iter()
            .map(|(c, n)| (c.to_string(), n))
            .collect();
        let mut m = s.serialize_map(None)?;
        for (i, n) in self.classes.iter().enumerate() {
            m.serialize_entry(&format!("{}xx", i + 1), n)?;
        }
        m.serialize_entry("codes", &codes)?;
        m.serialize_entry("other_codes", &self.other_codes)?;
        m.end()
    }
}

impl<'de> Deserialize<'de> for Statuses {
    /// Reads back what [`Serialize`] wrote, so `bench merge` can add the codes of several runs.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Statuses, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Written {
            #[serde(rename = "1xx")]
            c1: u64,
            #[serde(rename = "2xx")]
            c2: u64,
            #[serde(rename = "3xx")]
            c3: u64,
            #[serde(rename = "4xx")]
            c4: u64,
            #[serde(rename = "5xx")]
            c5: u64,
            codes: std::collections::BTreeMap<u16, u64>,
            other_codes: u64,
        }
        let w = Written::deserialize(d)?;
        let mut st = Statuses {
            classes: [w.c1, w.c2, w.c3, w.c4, w.c5],
            other_codes: w.other_codes,
            ..Statuses::default()
        };
        for (code, n) in w.codes {
            st.add_code(code, n);
        }
        Ok(st)
    }
}

/// Failures by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Errors {
    /// Connects that failed or took longer than the timeout.
    pub connect: u64,
    /// `--ws`: WebSocket handshakes answered with anything but a `101` carrying the right
    /// `Sec-WebSocket-Accept` (a proxy that does not tunnel); the connection is opened again.
    pub handshake: u64,
    /// Requests with no complete response within the timeout; the connection is closed.
    pub timeout: u64,
    /// The connection broke (a failed write, a reset, an early close) or the response was
    /// malformed (with `--ws`: a close frame, or an echo of another length).
    pub read: u64,
    /// Complete responses whose status was not 2xx.
    pub non_2xx: u64,
}

impl Errors {
    pub fn total(&self) -> u64 {
        self.connect + self.handshake + self.timeout + self.read + self.non_2xx
    }
}

impl Counts {
    pub fn add(&mut self, other: &Counts) {
        self.sent += other.sent;
        self.responses += other.responses;
        self.ok += other.ok;
        self.errors.connect += other.errors.connect;
        self.errors.handshake += other.errors.handshake;
        self.errors.timeout += other.errors.timeout;
        self.errors.read += other.errors.read;
        self.errors.non_2xx += other.errors.non_2xx;
        self.statuses.merge(&other.statuses);
        self.bytes_read += other.bytes_read;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uniform_1_to_10000_us() -> Histogram<u64> {
        let mut h = new_histogram().unwrap();
        for us in 1..=10_000u64 {
            h.record(us * 1000).unwrap();
        }
        h
    }

    fn close(actual: f64, expected: f64, rel: f64) -> bool {
        (actual - expected).abs() <= expected.abs() * rel
    }

    #[test]
    fn percentiles_of_a_uniform_distribution_are_where_they_should_be() {
        let l = Latency::of(&uniform_1_to_10000_us());
        // HDR precision is 3 significant digits: 0.1%, and values are the highest equivalent.
        for (got, want) in [
            (l.p50_us, 5000.0),
            (l.p90_us, 9000.0),
            (l.p99_us, 9900.0),
            (l.p999_us, 9990.0),
            (l.max_us, 10000.0),
            (l.mean_us, 5000.5),
        ] {
            assert!(close(got, want, 0.002), "got {got}, want {want}: {l:?}");
        }
    }

    #[test]
    fn a_single_repeated_latency_is_every_percentile() {
        let mut h = new_histogram().unwrap();
        for _ in 0..1000 {
            h.record(250_000).unwrap();
        }
        let l = Latency::of(&h);
        for v in [l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us] {
            assert!(close(v, 250.0, 0.001), "{l:?}");
        }
    }

    #[test]
    fn a_rare_slow_outlier_shows_only_in_the_top_percentiles() {
        let mut h = new_histogram().unwrap();
        for _ in 0..999 {
            h.record(100_000).unwrap();
        }
        h.record(50_000_000).unwrap();
        let l = Latency::of(&h);
        assert!(close(l.p99_us, 100.0, 0.001), "{l:?}");
        assert!(close(l.p999_us, 100.0, 0.001), "{l:?}");
        assert!(close(l.max_us, 50_000.0, 0.001), "{l:?}");
    }

    #[test]
    fn merged_thread_histograms_give_the_percentiles_of_all_values() {
        let mut even = new_histogram().unwrap();
        let mut odd = new_histogram().unwrap();
        for us in 1..=10_000u64 {
            let h = if us % 2 == 0 { &mut even } else { &mut odd };
            h.record(us * 1000).unwrap();
        }
        let mut merged = new_histogram().unwrap();
        merged.add(&even).unwrap();
        merged.add(&odd).unwrap();
        assert_eq!(Latency::of(&merged), Latency::of(&uniform_1_to_10000_us()));
    }

    #[test]
    fn latencies_beyond_an_hour_saturate_instead_of_failing() {
        let mut h = new_histogram().unwrap();
        h.saturating_record(u64::MAX);
        assert!(h.max() >= HIGHEST_NS);
    }

    #[test]
    fn an_empty_histogram_gives_zeros_and_no_curve() {
        let h = new_histogram().unwrap();
        assert_eq!(Latency::of(&h).p99_us, 0.0);
        assert!(percentile_curve(&h).is_empty());
    }

    #[test]
    fn statuses_count_classes_exactly_and_the_first_codes_one_by_one() {
        let mut a = Statuses::default();
        for code in [200, 200, 404, 503, 200] {
            a.add(code, 1);
        }
        assert_eq!(a.classes, [0, 3, 0, 1, 1]);
        assert_eq!(a.top(), vec![(200, 3), (404, 1), (503, 1)]);
        let mut b = Statuses::default();
        for code in 500..510 {
            b.add(code, 2);
        }
        assert_eq!(b.other_codes, 4, "two codes found no slot");
        a.merge(&b);
        assert_eq!(a.classes, [0, 3, 0, 1, 21]);
        let coded: u64 = a.top().iter().map(|c| c.1).sum();
        assert_eq!(coded + a.other_codes, 25);
    }

    #[test]
    fn median_handles_odd_even_and_empty_inputs() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn spread_is_median_min_and_max() {
        assert_eq!(
            spread(&[5.0, 9.0, 1.0, 4.0, 6.0]),
            Some(Spread {
                median: 5.0,
                min: 1.0,
                max: 9.0
            })
        );
        assert_eq!(spread(&[]), None);
    }

    #[test]
    fn ratios_against_nothing_are_none() {
        assert_eq!(ratio(50.0, 100.0), Some(0.5));
        assert_eq!(ratio(50.0, 0.0), None);
        assert_eq!(ratio(0.0, 0.0), None);
    }

    #[test]
    fn the_paired_ratio_is_the_median_of_per_round_ratios() {
        // Round 2 ran on a machine twice as fast for both targets: the paired ratio ignores it.
        let first = [100.0, 200.0, 100.0];
        let proxied = [50.0, 100.0, 60.0];
        assert_eq!(paired_ratio(&proxied, &first), Some(0.5));
        assert_eq!(paired_ratio(&[1.0], &[0.0]), None);
    }

    #[test]
    fn added_latency_is_the_difference_at_each_percentile() {
        let first = Latency {
            p50_us: 100.0,
            p90_us: 200.0,
            p99_us: 300.0,
            p999_us: 400.0,
            max_us: 1000.0,
            mean_us: 120.0,
        };
        let proxied = Latency {
            p50_us: 150.0,
            p90_us: 260.0,
            p99_us: 290.0,
            p999_us: 800.0,
            max_us: 900.0,
            mean_us: 170.0,
        };
        assert_eq!(
            proxied.minus(&first),
            AddedLatency {
                p50_us: 50.0,
                p90_us: 60.0,
                p99_us: -10.0,
                p999_us: 400.0,
                max_us: -100.0,
            }
        );
    }

    #[test]
    fn the_curve_climbs_through_the_nines_and_ends_at_the_maximum() {
        let curve = percentile_curve(&uniform_1_to_10000_us());
        assert_eq!(curve[0].percentile, 0.0);
        let at = |p: f64| {
            curve
                .iter()
                .find(|c| (c.percentile - p).abs() < 1e-6)
                .map(|c| c.latency_us)
        };
        assert!(close(at(90.0).unwrap(), 9000.0, 0.002));
        assert!(close(at(99.0).unwrap(), 9900.0, 0.002));
        assert!(close(at(99.9).unwrap(), 9990.0, 0.002));
        // 10000 values resolve up to 99.99%, which is the maximum here.
        let last = curve.last().unwrap();
        assert!((last.percentile - 99.99).abs() < 1e-9, "{last:?}");
        assert!(close(last.latency_us, 10_000.0, 0.001));
        assert!(
            curve
                .windows(2)
                .all(|w| w[0].percentile < w[1].percentile && w[0].latency_us <= w[1].latency_us)
        );
        assert_eq!(curve.len(), 4 * CURVE_POINTS_PER_DECADE as usize + 1);
    }

    #[test]
    fn a_small_sample_still_draws_the_first_nine() {
        let mut h = new_histogram().unwrap();
        h.record(1000).unwrap();
        let curve = percentile_curve(&h);
        assert!((curve.last().unwrap().percentile - 90.0).abs() < 1e-9);
    }

    #[test]
    fn the_x_axis_maps_nines_to_decades_and_back_to_labels() {
        assert_eq!(percentile_to_x(0.0), 1.0);
        assert!((percentile_to_x(99.0) - 100.0).abs() < 1e-9);
        assert_eq!(percentile_to_x(100.0), CURVE_MAX_X);
        let labels: Vec<String> = [1.0, 10.0, 100.0, 1e3, 1e4, 1e5]
            .into_iter()
            .map(x_label)
            .collect();
        assert_eq!(labels, ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"]);
    }
}
