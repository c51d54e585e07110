//! What every kind's payload contract shares (docs/contract.md, ingress): a body that breaks
//! one is a list of problems naming each bad field, and the field readers that find them.
//! Each kind's own contract is in its module (`crate::domain::kind::<kind>::contract`). No I/O.

pub mod body;
pub(crate) mod fields;
pub mod glob;

use serde::Serialize;

/// One bad field of a body, as reported in a 400 answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FieldProblem {
    /// Path of the field, e.g. `sequence` or `data.added_items[0].qty`; `$` is the whole body.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

/// A body that does not follow its source's contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContractError {
    /// Every problem found, in field order.
    pub problems: Vec<FieldProblem>,
}

impl std::fmt::Display for ContractError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", p.field, p.problem)?;
        }
        Ok(())
    }
}
