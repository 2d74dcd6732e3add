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

/// Power of two choices: draws two distinct eligible backends at random, each with probability
/// proportional to its weight, and returns the one `better` prefers (the first drawn on a tie).
/// One eligible backend is returned as is. `random(n)` gives a uniform number in `0..n`.
///
/// Two draws cost two passes over the weights and no allocation; unlike least_conn it needs no
/// consistent view of every load, only of the two drawn, which is why it suits loads that other
/// workers keep changing (Mitzenmacher's "power of two choices").
pub fn two_choices(
    weights: &[u64],
    eligible: &[bool],
    mut random: impl FnMut(u64) -> u64,
    better: impl Fn(usize, usize) -> bool,
) -> Option<usize> {
    let total: u64 = (0..weights.len())
        .filter(|&i| eligible[i])
        .map(|i| weights[i])
        .sum();
    let draw = |r: u64, skip: Option<usize>| {
        let mut left = r;
        (0..weights.len())
            .filter(|&i| eligible[i] && Some(i) != skip)
            .find(|&i| {
                if left < weights[i] {
                    return true;
                }
                left -= weights[i];
                false
            })
    };
    if total == 0 {
        return None;
    }
    let a = draw(random(total), None)?;
    let rest = total - weights[a];
    if rest == 0 {
        return Some(a);
    }
    let b = draw(random(rest), Some(a))?;
    Some(if better(b, a) { b } else { a })
}

/// A uniform number in `0..n` from the thread's own generator (no lock): [`two_choices`]' draws.
pub fn random(n: u64) -> u64 {
    fastrand::u64(..n)
}

/// Whether backend `a`, with `load_a` requests in flight, carries less per unit of weight than
/// `b` with `load_b`, by cross-multiplying.
pub fn less_loaded(
    weights: &[u64],
    (a, load_a): (usize, usize),
    (b, load_b): (usize, usize),
) -> bool {
    (load_a as u128) * u128::from(weights[b]) < (load_b as u128) * u128::from(weights[a])
}

/// Consistent hashing by rendezvous (highest random weight): every backend scores the key, and
/// the best-scoring eligible backend takes it. A backend's score depends only on the key and the
/// backend's own name, so removing a backend moves exactly the keys it had, and each backend's
/// share of keys follows its weight with no ring to tune.
///
/// Chosen over ketama: with nginx's 160 points per unit of weight, removing 1 of 5 backends
/// moved 22.0% of 100k keys here, over the 1/N + 2% bound, because a ring's arcs leave each
/// backend's share off by a few per cent; rendezvous's share is off only by sampling noise.
/// It costs one 64-bit mix per backend per request (a ring costs a binary search), which for
/// the tens of backends an upstream has is less than a cache miss.
#[derive(Debug, Clone)]
pub struct Rendezvous {
    /// Each backend's seed: the hash of its name.
    seeds: Vec<u64>,
    /// Each backend's weight, or empty when all weights are equal (scores compare as raw
    /// hashes then, with no logarithm).
    weights: Vec<f64>,
}

impl Rendezvous {
    /// The table for backends named by `names` (their addresses: a score depends on the name,
    /// not the index, so a reloaded list agrees on every backend that stayed) with `weights`.
    pub fn new<N: AsRef<[u8]>>(names: &[N], weights: &[u32]) -> Self {
        let equal = weights.windows(2).all(|w| w[0] == w[1]);
        Rendezvous {
            seeds: names.iter().map(|n| hash(n.as_ref())).collect(),
            weights: if equal {
                Vec::new()
            } else {
                weights.iter().map(|&w| f64::from(w)).collect()
            },
        }
    }

    /// The eligible backend with the best score for `key`; `None` when none is eligible. The
    /// same key always falls back to the same next backend.
    pub fn pick(&self, key: u64, eligible: impl Fn(usize) -> bool) -> Option<usize> {
        let scores = self.seeds.iter().map(|&seed| mix(key ^ seed));
        if self.weights.is_empty() {
            return scores
                .enumerate()
                .filter(|&(i, _)| eligible(i))
                .max_by_key(|&(_, s)| s)
                .map(|(i, _)| i);
        }
        // Weighted: the smallest of Exp(weight) variables, -ln(u) / weight, wins with probability
        // weight / total (Schindelhauer and Schomaker's weighted rendezvous).
        scores
            .zip(&self.weights)
            .enumerate()
            .filter(|&(i, _)| eligible(i))
            .map(|(i, (s, &w))| {
                let u = ((s >> 11) + 1) as f64 / (1u64 << 53) as f64;
                (i, -u.ln() / w)
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i)
    }
}

/// A 64-bit finaliser (splitmix64's): every input bit moves every output bit, so `key ^ seed`
/// scores look independent across backends.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The hash of keys and backend names: xxh3, stable across processes, machines and versions, so
/// every worker and every pinlb in front of the same backends sends a key to the same place.
pub fn hash(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
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

#[cfg(test)]
mod two_choices_tests {
    use super::*;

    #[test]
    fn of_two_drawn_the_less_loaded_wins() {
        let weights = [1, 1];
        let in_flight = [5, 1];
        let mut n = 0u64;
        // Whatever the draws, with two backends both are drawn: backend 1 always wins.
        for _ in 0..10 {
            let pick = two_choices(
                &weights,
                &[true; 2],
                |m| {
                    n += 1;
                    n % m
                },
                |a, b| less_loaded(&weights, (a, in_flight[a]), (b, in_flight[b])),
            );
            assert_eq!(pick, Some(1));
        }
    }

    #[test]
    fn draws_follow_the_weights_and_skip_the_ineligible() {
        let weights = [3000, 1000, 5000];
        let eligible = [true, true, false];
        let mut counts = [0usize; 3];
        // No preference: the first drawn is returned, so counts follow the weights.
        for _ in 0..40_000 {
            let b = two_choices(&weights, &eligible, random, |_, _| false).unwrap();
            counts[b] += 1;
        }
        assert_eq!(counts[2], 0);
        let share = counts[0] as f64 / 40_000.0;
        assert!((share - 0.75).abs() < 0.02, "{counts:?}");
    }

    #[test]
    fn one_or_no_eligible_backend() {
        assert_eq!(
            two_choices(&[1, 1], &[false, true], random, |_, _| true),
            Some(1)
        );
        assert_eq!(
            two_choices(&[1, 1], &[false, false], random, |_, _| true),
            None
        );
    }

    fn owners(ring: &Rendezvous, keys: u64) -> Vec<usize> {
        (0..keys)
            .map(|k| ring.pick(hash(&k.to_le_bytes()), |_| true).unwrap())
            .collect()
    }

    #[test]
    fn removing_one_of_n_backends_moves_at_most_1_over_n_plus_2_percent_of_100k_keys() {
        const KEYS: u64 = 100_000;
        for n in [3usize, 5, 10, 20] {
            let names: Vec<String> = (0..n).map(|i| format!("10.0.0.{i}:8080")).collect();
            let before = owners(&Rendezvous::new(&names, &vec![1; n]), KEYS);
            for removed in [0, n / 2, n - 1] {
                let mut left = names.clone();
                left.remove(removed);
                let after = owners(&Rendezvous::new(&left, &vec![1; n - 1]), KEYS);
                // Index i of the smaller list is names[i] or names[i + 1].
                let name_after = |i: usize| &left[i];
                let moved = (0..KEYS as usize)
                    .filter(|&k| &names[before[k]] != name_after(after[k]))
                    .count();
                let bound = KEYS as f64 * (1.0 / n as f64 + 0.02);
                assert!(
                    (moved as f64) <= bound,
                    "n={n}, removed {removed}: {moved} keys moved, bound {bound}"
                );
                // And only the removed backend's keys moved.
                assert!(
                    (0..KEYS as usize)
                        .all(|k| before[k] == removed || &names[before[k]] == name_after(after[k]))
                );
            }
        }
    }

    #[test]
    fn an_ineligible_owner_hands_its_keys_to_the_same_next_backend() {
        let names = ["a:1", "b:1", "c:1"];
        let ring = Rendezvous::new(&names, &[1, 1, 1]);
        let key = hash(b"user-42");
        let owner = ring.pick(key, |_| true).unwrap();
        let next = ring.pick(key, |b| b != owner).unwrap();
        assert_ne!(next, owner);
        // The same key always goes to the same fallback.
        assert_eq!(ring.pick(key, |b| b != owner), Some(next));
        assert_eq!(ring.pick(key, |_| false), None);
    }

    #[test]
    fn weight_sets_the_share_of_keys() {
        let ring = Rendezvous::new(&["a:1", "b:1"], &[3, 1]);
        let counts = owners(&ring, 100_000)
            .iter()
            .fold([0usize; 2], |mut c, &b| {
                c[b] += 1;
                c
            });
        let share = counts[0] as f64 / 100_000.0;
        assert!((share - 0.75).abs() < 0.04, "{counts:?}");
    }
}
