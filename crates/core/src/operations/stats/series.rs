//! A window of figures over time, as `GET /v1/stats` asks for it (docs/api.md, stats): whole
//! steps of whole minutes, a bounded number of them.

use super::{minute_of, Figures, Minutes};
use crate::store::stats::StatCell;

/// Most steps one answer holds.
pub const MAX_POINTS: i64 = 1440;
/// The window when `from` is not given: the last hour.
const DEFAULT_SPAN_MS: i64 = 3_600_000;

/// Steps of `step_ms` from `from_ms` (a multiple of the step) up to `to_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The first step's start, unix ms.
    pub from_ms: i64,
    /// The end of the last step, unix ms.
    pub to_ms: i64,
    /// A step, in ms (a whole number of minutes).
    pub step_ms: i64,
}

/// A time as the API takes it: unix milliseconds, or RFC 3339.
pub fn parse_time(field: &str, raw: &str) -> Result<i64, String> {
    use time::format_description::well_known::Rfc3339;
    if !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit()) {
        return raw
            .parse()
            .map_err(|_| format!("{field} is too large for unix milliseconds"));
    }
    time::OffsetDateTime::parse(raw, &Rfc3339)
        .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
        .map_err(|_| format!("{field} must be unix milliseconds or an RFC 3339 date-time"))
}

impl Window {
    /// The window of `from`..`to` (default: the hour before now) in steps of `step_s`
    /// seconds (default 60): `from` rounded down and `to` up to whole steps.
    pub fn of(
        from_ms: Option<i64>,
        to_ms: Option<i64>,
        step_s: Option<i64>,
        now_ms: i64,
    ) -> Result<Self, String> {
        let step_s = step_s.unwrap_or(60);
        if step_s <= 0 || step_s % 60 != 0 {
            return Err(
                "step must be a whole number of minutes, in seconds (60, 300, 3600…)".into(),
            );
        }
        let step_ms = step_s.saturating_mul(1000);
        let to_ms = to_ms.unwrap_or(now_ms);
        let from_ms = from_ms.unwrap_or(to_ms.saturating_sub(DEFAULT_SPAN_MS));
        if from_ms >= to_ms {
            return Err("from must be before to".into());
        }
        let from = from_ms.div_euclid(step_ms) * step_ms;
        let steps = (to_ms - from + step_ms - 1) / step_ms;
        if steps > MAX_POINTS {
            return Err(format!(
                "from..to holds {steps} steps of {step_s} s; at most {MAX_POINTS}: take a larger step"
            ));
        }
        Ok(Self {
            from_ms: from,
            to_ms: from + steps * step_ms,
            step_ms,
        })
    }

    /// How many steps the window holds.
    pub fn len(&self) -> usize {
        ((self.to_ms - self.from_ms) / self.step_ms) as usize
    }

    /// Whether the window holds no step.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Each step's figures: the stored `cells` and the figures not yet flushed, by minute.
    pub fn points(&self, cells: &[StatCell], unflushed: &Minutes) -> Vec<Figures> {
        let mut points = vec![Figures::default(); self.len()];
        for cell in cells {
            if let Some(point) = usize::try_from(cell.slot)
                .ok()
                .and_then(|i| points.get_mut(i))
            {
                point.add_stored(&cell.figure, cell.sum, cell.max);
            }
        }
        for (minute, figures) in unflushed.range(self.from_ms..self.to_ms) {
            let slot = ((minute_of(*minute) - self.from_ms) / self.step_ms) as usize;
            if let Some(point) = points.get_mut(slot) {
                point.merge(figures);
            }
        }
        points
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operations::stats::MINUTE_MS;

    const NOW: i64 = 1_796_649_298_100;

    fn minute(received: u64) -> Figures {
        Figures {
            received,
            ..Figures::default()
        }
    }

    #[test]
    fn the_default_window_is_the_last_hour_by_the_minute() {
        let w = Window::of(None, None, None, NOW).unwrap();
        assert_eq!(w.step_ms, MINUTE_MS);
        assert_eq!(w.from_ms % MINUTE_MS, 0);
        assert!(w.from_ms <= NOW - DEFAULT_SPAN_MS && w.to_ms >= NOW);
        assert_eq!(w.len(), 61);
    }

    #[test]
    fn steps_are_whole_minutes_and_bounded_in_number() {
        assert!(Window::of(None, None, Some(90), NOW).is_err());
        assert!(Window::of(None, None, Some(0), NOW).is_err());
        assert!(Window::of(Some(NOW), Some(NOW - 1), None, NOW).is_err());
        let day = 86_400_000;
        assert!(Window::of(Some(NOW - 2 * day), Some(NOW), Some(60), NOW).is_err());
        let w = Window::of(Some(NOW - 14 * day), Some(NOW), Some(3600), NOW).unwrap();
        assert_eq!(w.len(), 14 * 24 + 1);
    }

    #[test]
    fn times_are_unix_milliseconds_or_rfc_3339() {
        assert_eq!(parse_time("from", "1796649298100"), Ok(NOW));
        assert_eq!(parse_time("from", "2026-12-07T13:14:58.100Z"), Ok(NOW));
        assert!(parse_time("from", "yesterday").is_err());
        assert!(parse_time("from", "").is_err());
    }

    #[test]
    fn stored_and_unflushed_minutes_land_in_their_steps() {
        let w = Window::of(Some(0), Some(10 * MINUTE_MS), Some(300), NOW).unwrap();
        assert_eq!(w.len(), 2);
        let cells = [StatCell {
            slot: 1,
            figure: "received".into(),
            sum: 5,
            max: 3,
        }];
        let unflushed: Minutes = [(MINUTE_MS, minute(2)), (6 * MINUTE_MS, minute(1))].into();
        let points = w.points(&cells, &unflushed);
        assert_eq!(points[0].received, 2);
        assert_eq!(points[1].received, 6);
    }
}
