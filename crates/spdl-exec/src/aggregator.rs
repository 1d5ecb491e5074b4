//! Custom aggregation: a stateful step that turns a stream of items into fewer, larger ones.

use crate::failure::BoxError;

/// A stateful aggregation step, for batching rules that `aggregate(n)` cannot express
/// (batches up to a byte budget, by bucket of sequence length, until a key changes, ...).
/// Add it with [`crate::PipelineBuilder::aggregate_with`].
///
/// The pipeline calls [`accumulate`](Aggregator::accumulate) once per item, in arrival order
/// and one call at a time, on its thread pool (so the methods may do blocking work), and
/// [`flush`](Aggregator::flush) at the end of each epoch and at the end of the input to emit
/// what is left. An `Err` (or a panic) fails that call: it is counted against the
/// pipeline's failure budget, logged, and the pipeline goes on with the aggregator as the
/// failed call left it. Returning `Ok(None)` emits nothing.
///
/// ```
/// use spdl_exec::{Aggregator, BoxError, BuildOptions, PipelineBuilder};
///
/// /// Joins strings until they hold at least `min_len` bytes.
/// struct Join { min_len: usize, buf: String }
///
/// impl Aggregator<&'static str> for Join {
///     type Output = String;
///     fn accumulate(&mut self, s: &'static str) -> Result<Option<String>, BoxError> {
///         self.buf.push_str(s);
///         Ok((self.buf.len() >= self.min_len).then(|| std::mem::take(&mut self.buf)))
///     }
///     fn flush(&mut self) -> Result<Option<String>, BoxError> {
///         Ok((!self.buf.is_empty()).then(|| std::mem::take(&mut self.buf)))
///     }
/// }
///
/// # fn main() -> Result<(), spdl_exec::PipelineError> {
/// let pipeline = PipelineBuilder::new()
///     .source(["a", "bb", "ccc", "dddd", "e", "ff"])
///     .aggregate_with("join", Join { min_len: 5, buf: String::new() }, false)
///     .sink(2)
///     .build(BuildOptions::default())?;
/// let out: Vec<String> = pipeline.iter().collect::<Result<_, _>>()?;
/// assert_eq!(out, ["abbccc", "dddde", "ff"]);
/// # Ok(())
/// # }
/// ```
pub trait Aggregator<T>: Send + 'static {
    /// What the aggregator emits.
    type Output: Send + 'static;

    /// Takes one item; returns an output when one is complete.
    fn accumulate(&mut self, item: T) -> Result<Option<Self::Output>, BoxError>;

    /// Emits what is buffered (called at each epoch end and at the end of the input; with
    /// `drop_last`, its result at an epoch end is discarded and it is not called at the end
    /// of the input), leaving the aggregator empty.
    fn flush(&mut self) -> Result<Option<Self::Output>, BoxError>;
}
