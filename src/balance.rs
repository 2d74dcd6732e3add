//! Backend selection: pure functions over plain data.
//!
//! Both rules take an `eligible` predicate so the caller can leave out backends already tried for
//! this request (and, later, backends that are down or full) without building a new list.

/// nginx's smooth weighted round robin state, one per worker and upstream.
///
/// Each pick adds every eligible backend's weight to its running score, takes the highest score
/// (the first one on ties) and subtracts the total weight from the winner. Weights 5,1,1 give
/// `a a b a c a a` in every 7 picks: the heavy backend is spread out instead of bunched.
#[derive(Debug, Clone)]
pub struct SmoothWrr {
    current: Vec<i64>,
}

impl SmoothWrr {
    pub fn new(backends: usize) -> Self {
        SmoothWrr {
            current: vec![0; backends],
        }
    }

    /// Picks one of the eligible backends, or `None` when none is eligible.
    pub fn pick(&mut self, weights: &[u64], eligible: impl Fn(usize) -> bool) -> Option<usize> {
        debug_assert_eq!(weights.len(), self.current.len());
        let mut total: i64 = 0;
        let mut best: Option<usize> = None;
        for (i, &w) in weights.iter().enumerate() {
            if !eligible(i) {
                continue;
            }
            let w = i64::try_from(w).unwrap_or(i64::MAX);
            self.current[i] += w;
            total += w;
            if best.is_none_or(|b| self.current[i] > self.current[b]) {
                best = Some(i);
            }
        }
        let b = best?;
        self.current[b] -= total;
        Some(b)
    }
}

/// Least connections: the eligible backend with the lowest `in_flight / weight`, compared by
/// cross-multiplying so no division or float is involved. Ties go to smooth weighted round robin
/// among the tied backends, as nginx does.
///
/// `in_flight` and `eligible` are snapshots taken once per pick: the live counts change under
/// other workers, and reading them twice could match nothing on the second pass.
pub fn least_conn(
    wrr: &mut SmoothWrr,
    weights: &[u64],
    in_flight: &[usize],
    eligible: &[bool],
) -> Option<usize> {
    // Lower load means in_flight[a] * weight[b] < in_flight[b] * weight[a]. u128 cannot overflow:
    // both factors fit in 64 bits.
    let load = |i: usize| (in_flight[i] as u128, u128::from(weights[i]));
    let mut best: Option<(usize, u128, u128)> = None;
    let mut ties = 0usize;
    for i in (0..weights.len()).filter(|&i| eligible[i]) {
        let (f, w) = load(i);
        match best {
            Some((_, bf, bw)) if f * bw > bf * w => {}
            Some((_, bf, bw)) if f * bw == bf * w => ties += 1,
            _ => {
                best = Some((i, f, w));
                ties = 1;
            }
        }
    }
    let (first, bf, bw) = best?;
    if ties == 1 {
        // The common case: one clear winner, no second pass needed.
        return Some(first);
    }
    wrr.pick(weights, |i| {
        eligible[i] && {
            let (f, w) = load(i);
            f * bw == bf * w
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sequence(weights: &[u64], n: usize) -> String {
        let mut wrr = SmoothWrr::new(weights.len());
        (0..n)
            .map(|_| (b'a' + wrr.pick(weights, |_| true).unwrap() as u8) as char)
            .collect()
    }

    #[test]
    fn weights_5_1_1_give_nginx_smooth_sequence() {
        assert_eq!(sequence(&[5, 1, 1], 7), "aabacaa");
        assert_eq!(sequence(&[5, 1, 1], 21), "aabacaa".repeat(3));
    }

    #[test]
    fn equal_weights_rotate_in_order() {
        assert_eq!(sequence(&[1, 1, 1], 6), "abcabc");
    }

    #[test]
    fn every_cycle_matches_the_weights_exactly() {
        let weights = [3, 7, 2, 1];
        let mut wrr = SmoothWrr::new(weights.len());
        let total: u64 = weights.iter().sum();
        for _ in 0..5 {
            let mut counts = [0u64; 4];
            for _ in 0..total {
                counts[wrr.pick(&weights, |_| true).unwrap()] += 1;
            }
            assert_eq!(counts, weights);
        }
    }

    #[test]
    fn ineligible_backends_are_skipped() {
        let mut wrr = SmoothWrr::new(3);
        let picks: Vec<_> = (0..4)
            .map(|_| wrr.pick(&[1, 1, 1], |i| i != 1).unwrap())
            .collect();
        assert_eq!(picks, vec![0, 2, 0, 2]);
    }

    #[test]
    fn nothing_eligible_gives_none() {
        let mut wrr = SmoothWrr::new(2);
        assert_eq!(wrr.pick(&[1, 1], |_| false), None);
        assert_eq!(
            least_conn(&mut wrr, &[1, 1], &[0, 0], &[false, false]),
            None
        );
    }

    #[test]
    fn least_conn_prefers_the_backend_with_fewer_requests_in_flight() {
        let mut wrr = SmoothWrr::new(3);
        let in_flight = [4, 1, 3];
        assert_eq!(
            least_conn(&mut wrr, &[1, 1, 1], &in_flight, &[true; 3]),
            Some(1)
        );
    }

    #[test]
    fn least_conn_divides_by_weight() {
        let mut wrr = SmoothWrr::new(2);
        // 5/4 = 1.25 against 2/1 = 2: the heavier backend carries more and still wins.
        assert_eq!(least_conn(&mut wrr, &[4, 1], &[5, 2], &[true; 2]), Some(0));
        // 9/4 = 2.25 against 2/1 = 2.
        assert_eq!(least_conn(&mut wrr, &[4, 1], &[9, 2], &[true; 2]), Some(1));
    }

    #[test]
    fn least_conn_ties_follow_weighted_round_robin() {
        let mut wrr = SmoothWrr::new(3);
        let picks: String = (0..7)
            .map(|_| {
                (b'a' + least_conn(&mut wrr, &[5, 1, 1], &[0; 3], &[true; 3]).unwrap() as u8)
                    as char
            })
            .collect();
        assert_eq!(picks, "aabacaa");
    }

    #[test]
    fn least_conn_ties_only_among_the_least_loaded() {
        let mut wrr = SmoothWrr::new(3);
        let in_flight = [2, 0, 0];
        let picks: Vec<_> = (0..4)
            .map(|_| least_conn(&mut wrr, &[1, 1, 1], &in_flight, &[true; 3]).unwrap())
            .collect();
        assert_eq!(picks, vec![1, 2, 1, 2]);
    }

    #[test]
    fn least_conn_skips_ineligible() {
        let mut wrr = SmoothWrr::new(2);
        assert_eq!(
            least_conn(&mut wrr, &[1, 1], &[0, 9], &[false, true]),
            Some(1)
        );
    }
}
