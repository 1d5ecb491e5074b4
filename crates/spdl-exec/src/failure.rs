//! What a failure is: one failed item ([`ItemFailure`]), the failures a stage or the pipeline
//! tolerates ([`FailureBudget`]), and a call's result with some of its parts failed
//! ([`Partial`]). Plain data: the accounting is in `budget.rs`.

use std::fmt;

/// The error type of stage functions: anything that converts into it works
/// (`std::io::Error`, `String`, `&str`, any `std::error::Error + Send + Sync`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// One failed item, as recorded by the pipeline (plain data, cheap to pass on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemFailure {
    /// The stage the item failed in.
    pub stage: String,
    /// The item's position among the stage's inputs (0-based).
    pub index: u64,
    /// The item's `Debug` text, when the stage was asked to log it
    /// ([`crate::Stage::log_failed_items`]).
    pub item: Option<String>,
    /// The error and its `source()` chain, joined by `": "`, or the panic message.
    pub cause: String,
}

impl fmt::Display for ItemFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "item #{}", self.index)?;
        if let Some(item) = &self.item {
            write!(f, " ({item})")?;
        }
        write!(f, ": {}", self.cause)
    }
}

/// Calls after which a [`FailureBudget::Fraction`] starts being judged.
pub const FRACTION_PROBATION: u64 = 100;

/// How many failed items a stage (or the whole pipeline) tolerates before it stops.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum FailureBudget {
    /// Never stop because of failures (the default).
    #[default]
    Unlimited,
    /// Stop when more than this many items have failed.
    Count(u64),
    /// Stop when more than this fraction (0.0..=1.0) of the calls have failed, judged
    /// only after [`FRACTION_PROBATION`] calls.
    Fraction(f64),
}

impl FailureBudget {
    /// Whether `failed` failures out of `calls` calls exceed the budget.
    pub fn is_exceeded(&self, failed: u64, calls: u64) -> bool {
        match *self {
            Self::Unlimited => false,
            Self::Count(n) => failed > n,
            Self::Fraction(f) => calls >= FRACTION_PROBATION && (failed as f64) / (calls as f64) > f,
        }
    }
}

impl fmt::Display for FailureBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unlimited => f.write_str("unlimited"),
            Self::Count(n) => write!(f, "at most {n} failures"),
            Self::Fraction(x) => write!(f, "at most {:.2}% failures", x * 100.0),
        }
    }
}

/// What a call made when some parts of its input failed (3 bad images in a batch of 32): the
/// output of the parts that did not, how many parts the call had, and one [`ItemFailure`] per
/// part that failed. Returned by the functions of [`crate::Stage::map_partial`]; each failed
/// part counts against the stage's [`FailureBudget`] (and the pipeline's) and shows in the
/// stats' `failed` column, and each part counts as a call for a [`FailureBudget::Fraction`].
///
/// ```
/// use spdl_exec::{ItemFailure, Partial};
/// let p = Partial::new(vec![1, 3], 3).with_failure(ItemFailure::part("b.jpg", "truncated JPEG"));
/// assert_eq!(p.failures.len(), 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partial<U> {
    /// The output of the parts that did not fail.
    pub output: U,
    /// The parts of the call's input (at least the failed ones).
    pub parts: u64,
    /// One entry per failed part; the pipeline fills in `stage` and `index`.
    pub failures: Vec<ItemFailure>,
}

impl<U> Partial<U> {
    /// An output of `parts` parts, none failed yet.
    pub fn new(output: U, parts: u64) -> Self {
        Self { output, parts, failures: Vec::new() }
    }

    /// Adds a failed part.
    #[must_use]
    pub fn with_failure(mut self, failure: ItemFailure) -> Self {
        self.failures.push(failure);
        self
    }
}

impl ItemFailure {
    /// A failed part of a call's input, named `item`, for a [`Partial`] result (the pipeline
    /// fills in the stage and the call's index).
    pub fn part(item: impl Into<String>, cause: impl Into<String>) -> Self {
        Self { stage: String::new(), index: 0, item: Some(item.into()), cause: cause.into() }
    }
}

/// The failed parts of a call, taken from its [`Partial`] result for the accounting.
#[derive(Debug, Default)]
pub(crate) struct PartReport {
    pub(crate) parts: u64,
    pub(crate) failures: Vec<ItemFailure>,
}
