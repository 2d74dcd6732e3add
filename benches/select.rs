//! Backend selection cost: one pick with 2, 16 and 256 backends, for both rules.
//!
//! Run with `cargo bench --bench select`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use pinlb::upstream::balance::{SmoothWrr, least_conn};

fn weights(n: usize) -> Vec<u64> {
    (0..n).map(|i| 1 + (i % 5) as u64).collect()
}

fn select(c: &mut Criterion) {
    let mut group = c.benchmark_group("select");
    for n in [2usize, 16, 256] {
        let w = weights(n);
        group.bench_with_input(BenchmarkId::new("round_robin", n), &n, |b, _| {
            let mut wrr = SmoothWrr::new(n);
            b.iter(|| wrr.pick(black_box(&w), |_| true))
        });
        // Distinct loads: one clear winner, the common case.
        let in_flight: Vec<usize> = (0..n).map(|i| (i * 7919) % 97 + 1).collect();
        group.bench_with_input(BenchmarkId::new("least_conn", n), &n, |b, _| {
            let mut wrr = SmoothWrr::new(n);
            let ok = vec![true; n];
            b.iter(|| least_conn(&mut wrr, black_box(&w), black_box(&in_flight), &ok))
        });
        // All idle: every backend ties, so the round-robin tie-break runs too.
        group.bench_with_input(BenchmarkId::new("least_conn_all_tied", n), &n, |b, _| {
            let mut wrr = SmoothWrr::new(n);
            let (idle, ok) = (vec![0; n], vec![true; n]);
            b.iter(|| least_conn(&mut wrr, black_box(&w), black_box(&idle), &ok))
        });
    }
    group.finish();
}

criterion_group!(benches, select);
criterion_main!(benches);
