//! What this node counts per source as deliveries pass — the overview's duplicates,
//! conflicting duplicates and handshakes —, the backlog ingress compares against
//! `max_backlog`, and each source's rate-limit bucket. One entry per configured source, made
//! at start (a source new in a reloaded file is not served until a restart), so counting
//! takes no shared lock and allocates nothing per delivery.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Every configured source's tally, by name.
#[derive(Debug, Default)]
pub struct SourceTallies(HashMap<String, SourceTally>);

/// One source's counts since this node started, its backlog and its bucket.
#[derive(Debug, Default)]
pub struct SourceTally {
    duplicates: AtomicU64,
    conflicting_duplicates: AtomicU64,
    handshakes: AtomicU64,
    backlog: AtomicU64,
    bucket: Mutex<Option<TokenBucket>>,
}

impl SourceTallies {
    /// A zero tally for each of `sources`.
    pub fn new<'a>(sources: impl IntoIterator<Item = &'a str>) -> Self {
        Self(
            sources
                .into_iter()
                .map(|name| (name.to_owned(), SourceTally::default()))
                .collect(),
        )
    }

    /// The tally of `source`; a source this node does not serve has none.
    pub fn of(&self, source: &str) -> Option<&SourceTally> {
        self.0.get(source)
    }

    /// Sets every source's backlog from `undecided` (sources it omits have none).
    pub fn set_backlogs(&self, undecided: &HashMap<String, u64>) {
        for (name, tally) in &self.0 {
            let n = undecided.get(name).copied().unwrap_or(0);
            tally.backlog.store(n, Ordering::Relaxed);
        }
    }
}

impl SourceTally {
    /// Counts a duplicate answered.
    pub fn count_duplicate(&self) {
        self.duplicates.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a duplicate `event_id` whose body differs (a publisher's error).
    pub fn count_conflicting_duplicate(&self) {
        self.conflicting_duplicates.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a handshake answered.
    pub fn count_handshake(&self) {
        self.handshakes.fetch_add(1, Ordering::Relaxed);
    }

    /// Duplicates answered since this node started.
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::Relaxed)
    }

    /// Duplicates with a different body seen since this node started.
    pub fn conflicting_duplicates(&self) -> u64 {
        self.conflicting_duplicates.load(Ordering::Relaxed)
    }

    /// Handshakes answered since this node started.
    pub fn handshakes(&self) -> u64 {
        self.handshakes.load(Ordering::Relaxed)
    }

    /// Undecided events as last refreshed (every second).
    pub fn backlog(&self) -> u64 {
        self.backlog.load(Ordering::Relaxed)
    }

    /// Takes `n` tokens from the bucket of a source limited to `rate` a second (filling it
    /// on first use), or says how long until there are that many. A poisoned lock lets the
    /// delivery through uncounted rather than refuse every delivery.
    pub fn take_tokens(&self, n: u64, rate: u32, now: Instant) -> Result<u64, Duration> {
        let Ok(mut bucket) = self.bucket.lock() else {
            return Ok(0);
        };
        bucket
            .get_or_insert_with(|| TokenBucket::full(rate, now))
            .take_n(n, rate, now)
            .map(|()| n)
    }

    /// Gives back `n` tokens taken for events that stored nothing.
    pub fn refund_tokens(&self, n: u64, rate: u32) {
        if let Ok(mut bucket) = self.bucket.lock() {
            if let Some(bucket) = bucket.as_mut() {
                bucket.refund_n(n, rate);
            }
        }
    }
}

/// A token bucket: `rate` tokens a second, holding at most one second's worth.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// Takes a token if there is one at `now`; otherwise says how long until the next.
    pub fn take(&mut self, rate: u32, now: Instant) -> Result<(), Duration> {
        self.take_n(1, rate, now)
    }

    /// Takes `n` tokens (a batch's events) if there are that many at `now`; otherwise says
    /// how long until there are. A batch larger than the bucket (`rate`) needs it full and
    /// leaves it in debt by the difference, which later deliveries wait out: it is never
    /// refused for ever, and over time no more than `rate` events a second get in.
    pub fn take_n(&mut self, n: u64, rate: u32, now: Instant) -> Result<(), Duration> {
        let rate = f64::from(rate);
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(rate);
        self.last = now;
        let n = n as f64;
        let needed = n.min(rate);
        if self.tokens >= needed {
            self.tokens -= n;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((needed - self.tokens) / rate))
        }
    }

    /// Gives back `n` tokens taken for events that cost nothing (a batch's duplicates).
    pub fn refund_n(&mut self, n: u64, rate: u32) {
        self.tokens = (self.tokens + n as f64).min(f64::from(rate));
    }

    /// A full bucket.
    pub fn full(rate: u32, now: Instant) -> Self {
        Self {
            tokens: f64::from(rate),
            last: now,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TokenBucket;
    use std::time::{Duration, Instant};

    #[test]
    fn a_batch_spends_a_token_per_event_and_waits_for_as_many() {
        let start = Instant::now();
        let mut bucket = TokenBucket::full(10, start);
        assert_eq!(bucket.take_n(4, 10, start), Ok(()));
        assert_eq!(bucket.take_n(6, 10, start), Ok(()));
        // Empty: 3 events wait 0.3 s for 3 tokens; nothing is taken meanwhile.
        let wait = bucket.take_n(3, 10, start).unwrap_err();
        assert!((wait.as_secs_f64() - 0.3).abs() < 1e-9, "{wait:?}");
        assert!(bucket
            .take_n(3, 10, start + Duration::from_millis(200))
            .is_err());
        assert_eq!(
            bucket.take_n(3, 10, start + Duration::from_millis(300)),
            Ok(())
        );
        // The duplicates of a batch give their tokens back, never beyond a full bucket.
        bucket.refund_n(25, 10);
        assert_eq!(
            bucket.take_n(10, 10, start + Duration::from_millis(300)),
            Ok(())
        );
        assert!(bucket.take(10, start + Duration::from_millis(300)).is_err());
    }

    #[test]
    fn a_batch_larger_than_the_bucket_takes_it_full_and_leaves_a_debt() {
        let start = Instant::now();
        let mut bucket = TokenBucket::full(2, start);
        // Not full: wait until it is, not for ever.
        assert_eq!(bucket.take(2, start), Ok(()));
        let wait = bucket.take_n(5, 2, start).unwrap_err();
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-9, "{wait:?}");
        let full = start + Duration::from_millis(500);
        assert_eq!(bucket.take_n(5, 2, full), Ok(()));
        // 3 tokens owed: the next event waits 2 s (4 tokens at 2 a second), not 0.5 s.
        let wait = bucket.take(2, full).unwrap_err();
        assert!((wait.as_secs_f64() - 2.0).abs() < 1e-9, "{wait:?}");
        assert_eq!(bucket.take(2, full + Duration::from_secs(2)), Ok(()));
    }
}
