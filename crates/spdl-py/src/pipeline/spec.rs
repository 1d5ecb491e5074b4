//! The typed description of a pipeline that the Python layer hands to [`super::PipelineCore`]: one
//! class per kind of source and step (`spdl_rs._native.pipeline.PipeStep`, `MergeSource`, ...), each built with
//! keywords and checked when it is made, so that the engine side reads named, typed fields.

use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};
use spdl_exec::{FailureBudget, OutputOrder};

use super::ops::PyOpKind;

fn order(name: &str) -> PyResult<OutputOrder> {
    match name {
        "completion" => Ok(OutputOrder::Completion),
        "input" => Ok(OutputOrder::Input),
        other => Err(PyValueError::new_err(format!("output_order must be \"completion\" or \"input\", got {other:?}"))),
    }
}

/// A failure budget: `count` failures, or a `fraction` of the calls; neither: unlimited.
pub(crate) fn failure_budget(count: Option<u64>, fraction: Option<f64>) -> PyResult<FailureBudget> {
    match (count, fraction) {
        (None, None) => Ok(FailureBudget::Unlimited),
        (Some(n), None) => Ok(FailureBudget::Count(n)),
        (None, Some(f)) if f > 0.0 && f <= 1.0 => Ok(FailureBudget::Fraction(f)),
        (None, Some(f)) => Err(PyValueError::new_err(format!("a failure fraction must be in (0, 1], got {f}"))),
        (Some(_), Some(_)) => Err(PyValueError::new_err("a failure budget is a count or a fraction, not both")),
    }
}

/// A stage's own failure budget: `None` (neither given) leaves the stage to the pipeline's budget; a count of
/// -1 is "unlimited for this stage" (SPDL's per-pipe `max_failures=-1`), which the pipeline's does not judge.
pub(crate) fn stage_failure_budget(count: Option<i64>, fraction: Option<f64>) -> PyResult<Option<FailureBudget>> {
    match (count, fraction) {
        (None, None) => Ok(None),
        (Some(-1), None) => Ok(Some(FailureBudget::Unlimited)),
        (Some(n), None) => match u64::try_from(n) {
            Ok(n) => Ok(Some(FailureBudget::Count(n))),
            Err(_) => Err(PyValueError::new_err(format!("max_failures must be -1 (unlimited) or >= 0, got {n}"))),
        },
        (count, fraction) => failure_budget(count.map(|c| c.max(0).unsigned_abs()), fraction).map(Some),
    }
}

/// How the engine calls an op: `None` for a native op.
fn op_kind(name: &str) -> PyResult<Option<PyOpKind>> {
    Ok(Some(match name {
        "sync" => PyOpKind::Sync,
        "gen" => PyOpKind::Gen,
        "async" => PyOpKind::Async,
        "asyncgen" => PyOpKind::AsyncGen,
        "native" => return Ok(None),
        other => return Err(PyValueError::new_err(format!("unknown op kind {other:?}"))),
    }))
}

/// A one-pass (or, `continuous`, re-iterated every epoch) Python iterable.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct IterSource {
    pub(crate) iterable: Arc<Py<PyAny>>,
    pub(crate) continuous: bool,
}

#[pymethods]
impl IterSource {
    /// The Python objects this step holds, for the garbage collector (a pipeline whose op refers back to
    /// its owner is then a collectable cycle).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&*self.iterable)
    }

    #[new]
    #[pyo3(signature = (iterable, *, continuous=false))]
    fn new(iterable: Py<PyAny>, continuous: bool) -> Self {
        Self { iterable: Arc::new(iterable), continuous }
    }
}

/// A `range`, iterated in Rust.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct RangeSource {
    pub(crate) start: i64,
    pub(crate) stop: i64,
    pub(crate) step: i64,
}

#[pymethods]
impl RangeSource {
    #[new]
    fn new(start: i64, stop: i64, step: i64) -> PyResult<Self> {
        if step == 0 {
            return Err(PyValueError::new_err("range() step must not be zero"));
        }
        Ok(Self { start, stop, step })
    }
}

/// A `list` or `tuple`, taken into Rust when the pipeline is built.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct ListSource {
    pub(crate) items: Py<PyAny>,
}

#[pymethods]
impl ListSource {
    /// The Python objects this step holds, for the garbage collector (a pipeline whose op refers back to
    /// its owner is then a collectable cycle).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.items)
    }

    #[new]
    fn new(items: Py<PyAny>) -> Self {
        Self { items }
    }
}

/// An async iterator, iterated on the pipeline's event loop.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct AsyncSource {
    pub(crate) aiter: Arc<Py<PyAny>>,
}

#[pymethods]
impl AsyncSource {
    /// The Python objects this step holds, for the garbage collector (a pipeline whose op refers back to
    /// its owner is then a collectable cycle).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&*self.aiter)
    }

    #[new]
    fn new(aiter: Py<PyAny>) -> Self {
        Self { aiter: Arc::new(aiter) }
    }
}

/// How a merge picks its next input.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Policy {
    AsAvailable,
    RoundRobin,
    Weighted(Vec<f64>, u64),
}

/// A merge of several inputs, each a source (any of these classes) with its own steps.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct MergeSource {
    pub(crate) name: String,
    pub(crate) inputs: Vec<(Py<PyAny>, Vec<Py<PyAny>>)>,
    pub(crate) policy: Policy,
    /// SPDL's `MergeIterator` rule: 0 until all inputs are exhausted, -1 until the first is, n > 0 after n.
    pub(crate) stop_after: i64,
}

#[pymethods]
impl MergeSource {
    /// The Python objects this step holds, for the garbage collector (a pipeline whose op refers back to
    /// its owner is then a collectable cycle).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for (source, steps) in &self.inputs {
            visit.call(source)?;
            for step in steps {
                visit.call(step)?;
            }
        }
        Ok(())
    }

    #[new]
    #[pyo3(signature = (name, inputs, *, policy="as_available", weights=None, stop_after=0, seed=0))]
    fn new(
        name: String,
        inputs: Vec<(Py<PyAny>, Vec<Py<PyAny>>)>,
        policy: &str,
        weights: Option<Vec<f64>>,
        stop_after: i64,
        seed: u64,
    ) -> PyResult<Self> {
        let policy = match (policy, weights) {
            ("as_available", None) => Policy::AsAvailable,
            ("round_robin", None) => Policy::RoundRobin,
            ("weighted", Some(w)) => Policy::Weighted(w, seed),
            ("weighted", None) => return Err(PyValueError::new_err("a weighted merge needs weights")),
            (p @ ("as_available" | "round_robin"), Some(_)) => {
                return Err(PyValueError::new_err(format!("a {p} merge takes no weights")));
            }
            (other, _) => return Err(PyValueError::new_err(format!("unknown merge policy {other:?}"))),
        };
        if stop_after < -1 {
            return Err(PyValueError::new_err(format!(
                "`stop_after` must be greater than or equal to -1. Found: {stop_after}"
            )));
        }
        Ok(Self { name, inputs, policy, stop_after })
    }
}

/// A `pipe` step.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct PipeStep {
    pub(crate) name: String,
    /// `None`: a native op.
    pub(crate) kind: Option<PyOpKind>,
    /// Shared with the engine's stage (one Python reference, visited by `__traverse__`).
    pub(crate) op: Arc<Py<PyAny>>,
    pub(crate) concurrency: usize,
    pub(crate) order: OutputOrder,
    /// The stage's own failure budget (`None`: the pipeline's judges it).
    pub(crate) failure_budget: Option<FailureBudget>,
}

#[pymethods]
impl PipeStep {
    /// The Python objects this step holds, for the garbage collector (a pipeline whose op refers back to
    /// its owner is then a collectable cycle).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&*self.op)
    }

    #[new]
    #[pyo3(signature = (name, kind, op, *, concurrency=1, output_order="completion", max_failures=None, max_failure_fraction=None))]
    fn new(
        name: String,
        kind: &str,
        op: Py<PyAny>,
        concurrency: usize,
        output_order: &str,
        max_failures: Option<i64>,
        max_failure_fraction: Option<f64>,
    ) -> PyResult<Self> {
        if concurrency == 0 {
            return Err(PyValueError::new_err("concurrency must be a positive integer, got 0"));
        }
        Ok(Self {
            name,
            kind: op_kind(kind)?,
            op: Arc::new(op),
            concurrency,
            order: order(output_order)?,
            failure_budget: stage_failure_budget(max_failures, max_failure_fraction)?,
        })
    }
}

/// `aggregate(size)`: lists of `size` items.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct AggregateStep {
    pub(crate) size: usize,
    pub(crate) drop_last: bool,
}

#[pymethods]
impl AggregateStep {
    #[new]
    #[pyo3(signature = (size, *, drop_last=false))]
    fn new(size: usize, drop_last: bool) -> PyResult<Self> {
        if size == 0 {
            return Err(PyValueError::new_err("aggregate needs a positive integer, got 0"));
        }
        Ok(Self { size, drop_last })
    }
}

/// A custom aggregation: an object with `accumulate(item)` and `flush()`.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct AggregatorStep {
    pub(crate) name: String,
    /// Shared with the engine's stage (one Python reference, visited by `__traverse__`).
    pub(crate) aggregator: Arc<Py<PyAny>>,
    pub(crate) drop_last: bool,
}

#[pymethods]
impl AggregatorStep {
    /// The Python objects this step holds, for the garbage collector (a pipeline whose op refers back to
    /// its owner is then a collectable cycle).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&*self.aggregator)
    }

    #[new]
    #[pyo3(signature = (name, aggregator, *, drop_last=false))]
    fn new(name: String, aggregator: Py<PyAny>, drop_last: bool) -> Self {
        Self { name, aggregator: Arc::new(aggregator), drop_last }
    }
}

/// `disaggregate()`.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct DisaggregateStep {}

#[pymethods]
impl DisaggregateStep {
    #[new]
    fn new() -> Self {
        Self {}
    }
}

/// `path_variants`: a router and the paths it chooses between (each a list of steps).
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct PathVariantsStep {
    pub(crate) name: String,
    pub(crate) router: Arc<Py<PyAny>>,
    pub(crate) is_async: bool,
    pub(crate) paths: Vec<Vec<Py<PyAny>>>,
    pub(crate) batched: bool,
    pub(crate) order: OutputOrder,
}

#[pymethods]
impl PathVariantsStep {
    /// The Python objects this step holds, for the garbage collector (a pipeline whose op refers back to
    /// its owner is then a collectable cycle).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&*self.router)?;
        for path in &self.paths {
            for step in path {
                visit.call(step)?;
            }
        }
        Ok(())
    }

    #[new]
    #[pyo3(signature = (name, router, paths, *, is_async=false, batched=false, output_order="completion"))]
    fn new(
        name: String,
        router: Py<PyAny>,
        paths: Vec<Vec<Py<PyAny>>>,
        is_async: bool,
        batched: bool,
        output_order: &str,
    ) -> PyResult<Self> {
        if paths.is_empty() {
            return Err(PyValueError::new_err("PathVariantsConfig must have at least 1 path."));
        }
        Ok(Self { name, router: Arc::new(router), is_async, paths, batched, order: order(output_order)? })
    }
}

/// A stage run by a function that takes each epoch's inputs as an iterator (a `.to()` region).
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct ThroughStep {
    pub(crate) name: String,
    pub(crate) func: Arc<Py<PyAny>>,
}

#[pymethods]
impl ThroughStep {
    /// The Python objects this step holds, for the garbage collector (a pipeline whose op refers back to
    /// its owner is then a collectable cycle).
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&*self.func)
    }

    #[new]
    fn new(name: String, func: Py<PyAny>) -> Self {
        Self { name, func: Arc::new(func) }
    }
}

/// What a step object is, for an error that names it.
pub(crate) fn not_a(what: &str, obj: &Bound<'_, PyAny>) -> PyErr {
    let ty = obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
    PyTypeError::new_err(format!("expected a pipeline {what} (spdl_rs._native), got {ty}"))
}
