//! Rejections per source since the node started, for the `rejections` rule: counted where
//! the metrics count them, read by the alert watcher, which turns them into a rate.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Per source: (deliveries answered 4xx, deliveries whose signature failed).
static REJECTED: OnceLock<Mutex<HashMap<String, (u64, u64)>>> = OnceLock::new();

fn counts() -> std::sync::MutexGuard<'static, HashMap<String, (u64, u64)>> {
    // A poisoned map only lost one increment: the counts stay usable.
    REJECTED
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `source`'s counts, to add to: its name is copied only the first time, not on every
/// rejection of a flood of forged deliveries.
fn count(source: &str, add: impl FnOnce(&mut (u64, u64))) {
    let mut counts = counts();
    match counts.get_mut(source) {
        Some(counted) => add(counted),
        None => add(counts.entry(source.to_owned()).or_default()),
    }
}

/// A delivery to `source` was answered `code`: a 4xx counts as a rejection.
pub fn answered(source: &str, code: u16) {
    if (400..500).contains(&code) {
        count(source, |c| c.0 += 1);
    }
}

/// A delivery to `source` failed its signature check.
pub fn bad_signature(source: &str) {
    count(source, |c| c.1 += 1);
}

/// `source`'s counts: (rejected, bad signatures).
pub fn of(source: &str) -> (u64, u64) {
    counts().get(source).copied().unwrap_or_default()
}
