//! Event type patterns, as a json source's `types` and a destination's `event_types`
//! name them (docs/configuration.md).

/// An `event_types` pattern: `*` matches any run of characters, the rest is literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    /// The literal runs between the stars; one run means no star at all.
    runs: Vec<String>,
}

impl Glob {
    /// Compiles a pattern.
    pub fn new(pattern: &str) -> Self {
        Self {
            runs: pattern.split('*').map(str::to_owned).collect(),
        }
    }

    /// Whether `text` matches the pattern as a whole.
    pub fn matches(&self, text: &str) -> bool {
        let [first, middle @ .., last] = self.runs.as_slice() else {
            return self.runs.first().is_some_and(|only| only == text);
        };
        if text.len() < first.len() + last.len()
            || !text.starts_with(first.as_str())
            || !text.ends_with(last.as_str())
        {
            return false;
        }
        // Taking each middle run at its leftmost place leaves the most room for
        // the next, so a match exists exactly when this greedy walk finds one.
        let mut rest = &text[first.len()..text.len() - last.len()];
        for run in middle {
            match rest.find(run.as_str()) {
                Some(at) => rest = &rest[at + run.len()..],
                None => return false,
            }
        }
        true
    }
}
