//! A small mergeable histogram of lags in milliseconds (docs/api.md, stats): bucket `i` counts
//! the lags in `(2^((i-1)/2), 2^(i/2)]` ms, so that a quantile read from it is at most a factor
//! √2 above the true one. Buckets add up across minutes and nodes, which quantiles do not:
//! the store keeps buckets, and a step's quantiles are read from their sum.

use std::collections::BTreeMap;

/// The last bucket: 2^31 ms, some 25 days; longer lags fall in it.
const LAST_BUCKET: u32 = 62;

/// Lag counts per bucket; only buckets that counted something are kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LagHistogram {
    buckets: BTreeMap<u32, u64>,
}

/// The bucket a lag of `ms` falls in.
pub fn bucket_of(ms: i64) -> u32 {
    if ms <= 1 {
        return 0;
    }
    // Smallest i with 2^(i/2) >= ms, i.e. i = ceil(2·log2(ms)); corrected for rounding.
    let mut i = (2.0 * (ms as f64).log2()).ceil() as u32;
    while i > 0 && upper_bound_ms(i - 1) >= ms as f64 {
        i -= 1;
    }
    while upper_bound_ms(i) < ms as f64 && i < LAST_BUCKET {
        i += 1;
    }
    i.min(LAST_BUCKET)
}

/// The largest lag bucket `i` holds, in milliseconds.
pub fn upper_bound_ms(i: u32) -> f64 {
    2f64.powf(f64::from(i) / 2.0)
}

impl LagHistogram {
    /// Counts one lag (a negative one, from a clock step, as 0).
    pub fn record(&mut self, ms: i64) {
        *self.buckets.entry(bucket_of(ms.max(0))).or_insert(0) += 1;
    }

    /// Adds `n` lags to bucket `i` (a stored bucket, read back).
    pub fn add_bucket(&mut self, i: u32, n: u64) {
        if n > 0 {
            *self.buckets.entry(i.min(LAST_BUCKET)).or_insert(0) += n;
        }
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &LagHistogram) {
        for (&i, &n) in &other.buckets {
            self.add_bucket(i, n);
        }
    }

    /// The non-empty buckets, `(index, count)`, in order.
    pub fn buckets(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.buckets.iter().map(|(&i, &n)| (i, n))
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// The `q` quantile (0 < q ≤ 1) as the upper bound of the bucket holding it, rounded
    /// to whole milliseconds; `None` when nothing was counted.
    pub fn quantile_ms(&self, q: f64) -> Option<u64> {
        let total: u64 = self.buckets.values().sum();
        if total == 0 {
            return None;
        }
        // The rank of the q quantile, from 1: the smallest lag with at least q of them at or below.
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (&i, &n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return Some(upper_bound_ms(i).round() as u64);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_grow_by_a_factor_of_the_square_root_of_two() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1), 0);
        assert_eq!(bucket_of(2), 2);
        assert_eq!(bucket_of(3), 4);
        assert_eq!(bucket_of(4), 4);
        assert_eq!(bucket_of(1000), 20);
        assert_eq!(bucket_of(i64::MAX), LAST_BUCKET);
    }

    #[test]
    fn an_empty_histogram_has_no_quantile() {
        assert_eq!(LagHistogram::default().quantile_ms(0.5), None);
    }

    #[test]
    fn the_median_and_the_99th_percentile_come_from_their_buckets() {
        let mut h = LagHistogram::default();
        for _ in 0..98 {
            h.record(10);
        }
        h.record(5_000);
        h.record(5_000);
        assert_eq!(h.quantile_ms(0.5), Some(11)); // 10 ms lies in (8, 11.3]
        assert_eq!(h.quantile_ms(0.99), Some(5793)); // 5 s lies in (4096, 5793]
    }

    proptest! {
        /// A lag lies within its bucket: above the previous bound, at or below its own.
        #[test]
        fn a_lag_lies_within_its_bucket(ms in 2i64..1_000_000_000) {
            let i = bucket_of(ms);
            prop_assert!(upper_bound_ms(i) >= ms as f64);
            prop_assert!(i == 0 || upper_bound_ms(i - 1) < ms as f64);
        }

        /// The quantile read from the buckets is the true quantile or above it, by at most √2
        /// (and 1 ms of rounding).
        #[test]
        fn quantiles_are_within_a_factor_of_the_square_root_of_two(
            mut lags in proptest::collection::vec(1i64..10_000_000, 1..200),
            q in 0.01f64..=1.0,
        ) {
            let mut h = LagHistogram::default();
            for &lag in &lags {
                h.record(lag);
            }
            lags.sort_unstable();
            let rank = ((q * lags.len() as f64).ceil() as usize).clamp(1, lags.len());
            let truth = lags[rank - 1] as f64;
            let read = h.quantile_ms(q).unwrap() as f64;
            prop_assert!(read + 0.5 >= truth, "{read} below {truth}");
            prop_assert!(read <= truth * 2f64.sqrt() + 1.0, "{read} too far above {truth}");
        }

        /// Merging the histograms of two nodes gives the histogram of all their lags: the
        /// quantiles of a minute served by several nodes are right.
        #[test]
        fn merged_histograms_count_every_lag(
            a in proptest::collection::vec(0i64..10_000_000, 0..50),
            b in proptest::collection::vec(0i64..10_000_000, 0..50),
        ) {
            let (mut ha, mut hb, mut all) =
                (LagHistogram::default(), LagHistogram::default(), LagHistogram::default());
            for &lag in &a { ha.record(lag); all.record(lag); }
            for &lag in &b { hb.record(lag); all.record(lag); }
            ha.merge(&hb);
            prop_assert_eq!(ha, all);
        }
    }
}
