//! The one description of a pipeline: the `spdl_rs.pipeline.defs` configs (SPDL's `SourceConfig`,
//! `MergeConfig`, `PipeConfig`, `AggregateConfig`, `DisaggregateConfig`, `PathVariantsConfig`), read here,
//! once, into typed Rust values that [`super::wiring`] turns into an engine graph.
//!
//! This is the boundary where a config's values are checked: the op's kind (how the engine calls it), a
//! positive `concurrency`, the `output_order`, a stage's failure budget, an aggregation's size or aggregator,
//! a router's kind, and the source's kind. The Python builder checks a config by reading it here
//! ([`check`]), so every check and its message exist once. The Python layer never builds engine objects: it
//! rewrites configs (SPDL's hooks, custom queues and executors become plain `PipeConfig`s around the op) and
//! hands them to `PipelineCore`. The one engine step with no config is a `.to()` region, already placed in
//! its pool: a [`ThroughStep`].
//!
//! The values keep the Python objects they call (`Arc<Py<..>>`, shared with the engine's stages, one Python
//! reference each), and [`Source::traverse`] and [`Step::traverse`] report each of them once to the garbage
//! collector: a pipeline whose op refers back to its owner is a collectable cycle.

use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyRange, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit, intern};
use spdl_exec::{FailureBudget, OutputOrder};

use super::ops::{OpImpl, PipeSpec, PyOpKind};

/// The largest batch size: queues and batches are sized in items up to `2**48` (see
/// [`crate::args::pipeline_size`]).
const MAX_BATCH: i128 = 1 << 48;

/// A pipeline's source.
#[derive(Debug)]
pub(crate) enum Source {
    /// A one-pass (or, `continuous`, re-iterated every epoch) Python iterable.
    Iter { iterable: Arc<Py<PyAny>>, continuous: bool },
    /// A `range` within `i64`, iterated in Rust.
    Range { start: i64, stop: i64, step: i64 },
    /// An exact `list` or `tuple`, taken into Rust when the pipeline is built.
    List { items: Py<PyAny> },
    /// An async iterator (made from the async iterable when the config is read), iterated on the event loop.
    Async { aiter: Arc<Py<PyAny>> },
    /// Several pipelines feeding one, in the order their items become available.
    Merge { inputs: Vec<(Source, Vec<Step>)> },
}

/// One step of a pipeline (or of a path of `path_variants`).
#[derive(Debug)]
pub(crate) enum Step {
    Pipe(PipeSpec),
    /// Lists of `size` items.
    Aggregate {
        size: usize,
        drop_last: bool,
    },
    /// A custom aggregation: an object with `accumulate(item)` and `flush()`.
    Aggregator {
        name: String,
        aggregator: Arc<Py<PyAny>>,
        drop_last: bool,
    },
    Disaggregate,
    PathVariants(PathVariantsStep),
    /// A `.to()` region: a function that takes each epoch's inputs as an iterator.
    Through {
        name: String,
        func: Arc<Py<PyAny>>,
    },
}

/// A `path_variants` step: a router and the paths it chooses between.
#[derive(Debug)]
pub(crate) struct PathVariantsStep {
    pub(crate) name: String,
    pub(crate) router: Arc<Py<PyAny>>,
    pub(crate) is_async: bool,
    pub(crate) paths: Vec<Vec<Step>>,
    pub(crate) batched: bool,
    pub(crate) order: OutputOrder,
}

impl Source {
    /// Reports the Python objects this source holds to the garbage collector.
    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            Self::Iter { iterable, .. } => visit.call(&**iterable),
            Self::Range { .. } => Ok(()),
            Self::List { items } => visit.call(items),
            Self::Async { aiter } => visit.call(&**aiter),
            Self::Merge { inputs } => {
                for (source, steps) in inputs {
                    source.traverse(visit)?;
                    traverse_steps(steps, visit)?;
                }
                Ok(())
            }
        }
    }
}

impl Step {
    /// Reports the Python objects this step holds to the garbage collector.
    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            Self::Pipe(PipeSpec { op: OpImpl::Python { op, .. }, .. }) => visit.call(&**op),
            Self::Pipe(_) => Ok(()),
            Self::Aggregator { aggregator, .. } => visit.call(&**aggregator),
            Self::Through { func, .. } => visit.call(&**func),
            Self::PathVariants(pv) => {
                visit.call(&*pv.router)?;
                pv.paths.iter().try_for_each(|p| traverse_steps(p, visit))
            }
            Self::Aggregate { .. } | Self::Disaggregate => Ok(()),
        }
    }
}

pub(crate) fn traverse_steps(steps: &[Step], visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
    steps.iter().try_for_each(|s| s.traverse(visit))
}

/// A `.to()` region's step (`spdl_rs._native.pipeline.ThroughStep`): `func(inputs)` is called at each epoch
/// with that epoch's inputs (an iterator) and returns an iterator of the outputs.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct ThroughStep {
    name: String,
    func: Arc<Py<PyAny>>,
}

#[pymethods]
impl ThroughStep {
    /// The Python objects this step holds, for the garbage collector.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&*self.func)
    }

    #[new]
    fn new(name: String, func: Py<PyAny>) -> Self {
        Self { name, func: Arc::new(func) }
    }
}

/// The config classes of `spdl_rs.pipeline.defs`.
struct Defs<'py>(Bound<'py, PyModule>);

impl<'py> Defs<'py> {
    fn new(py: Python<'py>) -> PyResult<Self> {
        Ok(Self(py.import(intern!(py, "spdl_rs.pipeline.defs"))?))
    }

    fn is(&self, obj: &Bound<'py, PyAny>, class: &str) -> PyResult<bool> {
        obj.is_instance(&self.0.getattr(class)?)
    }
}

fn attr<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    obj.getattr(name)
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

/// How the engine calls `op`: `("native" | "asyncgen" | "async" | "gen" | "sync", fn)`, where `fn` is the
/// op, or a container's `__getitem__` (a dict or list op looks the item up). A function whose `__call__` is
/// async (or a generator) is called as such.
#[pyfunction]
pub fn op_kind<'py>(op: &Bound<'py, PyAny>) -> PyResult<(&'static str, Bound<'py, PyAny>)> {
    let (kind, op) = classify(op)?;
    let name = match kind {
        None => "native",
        Some(PyOpKind::Sync) => "sync",
        Some(PyOpKind::Gen) => "gen",
        Some(PyOpKind::Async) => "async",
        Some(PyOpKind::AsyncGen) => "asyncgen",
    };
    Ok((name, op))
}

/// [`op_kind`]'s kind (`None`: a native op) and the object to call.
fn classify<'py>(op: &Bound<'py, PyAny>) -> PyResult<(Option<PyOpKind>, Bound<'py, PyAny>)> {
    let py = op.py();
    if op.is_instance_of::<super::PyNativeOp>() {
        return Ok((None, op.clone()));
    }
    if !op.is_callable() {
        if op.hasattr(intern!(py, "__getitem__"))? {
            return Ok((Some(PyOpKind::Sync), op.getattr(intern!(py, "__getitem__"))?));
        }
        return Err(PyTypeError::new_err(format!(
            "op must be callable (or a container with __getitem__), got {}",
            type_name(op)
        )));
    }
    let inspect = py.import(intern!(py, "inspect"))?;
    let is = |what: &Bound<'py, PyString>, target: &Bound<'py, PyAny>| -> PyResult<bool> {
        inspect.call_method1(what, (target,))?.is_truthy()
    };
    let plain = is(intern!(py, "isfunction"), op)? || is(intern!(py, "ismethod"), op)?;
    let call = if plain { op.clone() } else { op.getattr(intern!(py, "__call__")).unwrap_or_else(|_| op.clone()) };
    for target in [op, &call] {
        if is(intern!(py, "isasyncgenfunction"), target)? {
            return Ok((Some(PyOpKind::AsyncGen), op.clone()));
        }
        if is(intern!(py, "iscoroutinefunction"), target)? {
            return Ok((Some(PyOpKind::Async), op.clone()));
        }
        if is(intern!(py, "isgeneratorfunction"), target)? {
            return Ok((Some(PyOpKind::Gen), op.clone()));
        }
    }
    Ok((Some(PyOpKind::Sync), op.clone()))
}

fn order(value: &Bound<'_, PyAny>) -> PyResult<OutputOrder> {
    match value.extract::<String>().ok().as_deref() {
        Some("completion") => Ok(OutputOrder::Completion),
        Some("input") => Ok(OutputOrder::Input),
        _ => Err(PyValueError::new_err(format!(
            "output_order must be \"completion\" or \"input\", got {}",
            value.repr()?
        ))),
    }
}

/// A failure budget: `count` failures, or a `fraction` of the calls; neither: unlimited.
fn budget(count: Option<u64>, fraction: Option<f64>) -> PyResult<FailureBudget> {
    match (count, fraction) {
        (None, None) => Ok(FailureBudget::Unlimited),
        (Some(n), None) => Ok(FailureBudget::Count(n)),
        (None, Some(f)) if f > 0.0 && f <= 1.0 => Ok(FailureBudget::Fraction(f)),
        (None, Some(f)) => Err(PyValueError::new_err(format!("a failure fraction must be in (0, 1], got {f}"))),
        (Some(_), Some(_)) => Err(PyValueError::new_err("a failure budget is a count or a fraction, not both")),
    }
}

/// SPDL's `max_failures`, read: `None` (not given), an int (a count; -1: unlimited) or a `fractions.Fraction`
/// in (0, 1] (a share of the calls, judged after 100). `Ok(None)`: not given. A stage keeps -1 (unlimited for
/// the stage, whatever the pipeline's); for the pipeline -1 is the same as not given.
pub(crate) fn max_failures(value: &Bound<'_, PyAny>, what: &str, stage: bool) -> PyResult<Option<FailureBudget>> {
    let py = value.py();
    if value.is_none() {
        return Ok(None);
    }
    if value.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(format!("{what} must be an int or a fractions.Fraction, got a bool")));
    }
    let fraction = py.import(intern!(py, "fractions"))?.getattr(intern!(py, "Fraction"))?;
    if value.is_instance(&fraction)? {
        let f: f64 = value.call_method0(intern!(py, "__float__"))?.extract()?;
        if !(f > 0.0 && f <= 1.0) {
            // SPDL's words.
            return Err(PyValueError::new_err(format!("`{what}` Fraction must be in range (0, 1]. Got: {value}")));
        }
        return budget(None, Some(f)).map(Some);
    }
    if crate::args::is_plain_int(value) {
        let n: i128 = value.extract()?;
        return match n {
            -1 if stage => Ok(Some(FailureBudget::Unlimited)),
            -1 => Ok(None),
            n if n < 0 => Err(PyValueError::new_err(format!("{what} must be -1 (unlimited) or >= 0, got {n}"))),
            n => Ok(Some(FailureBudget::Count(u64::try_from(n).unwrap_or(u64::MAX)))),
        };
    }
    Err(PyTypeError::new_err(format!("{what} must be an int or a fractions.Fraction, got {}", type_name(value))))
}

/// The pipeline's failure budget from `build`'s `max_failures` (unlimited when not given).
pub(crate) fn pipeline_budget(value: &Bound<'_, PyAny>) -> PyResult<FailureBudget> {
    Ok(max_failures(value, "max_failures", false)?.unwrap_or(FailureBudget::Unlimited))
}

/// Checks that `source` can be a pipeline's source (an iterable, or an async iterable that is not
/// `continuous`).
pub(crate) fn check_iterable(source: &Bound<'_, PyAny>, continuous: bool) -> PyResult<()> {
    let py = source.py();
    if source.hasattr(intern!(py, "__aiter__"))? {
        if continuous {
            return Err(PyValueError::new_err(
                "continuous=True needs a sync iterable (an async iterator cannot be restarted)",
            ));
        }
    } else if !source.hasattr(intern!(py, "__iter__"))? {
        return Err(PyTypeError::new_err(format!(
            "source must be an iterable or an async iterable, got {}",
            type_name(source)
        )));
    }
    Ok(())
}

/// Reads a `SourceConfig` or a `MergeConfig` (without a custom `op`: the Python layer runs those and hands
/// over a `SourceConfig` of their output).
pub(crate) fn source(cfg: &Bound<'_, PyAny>) -> PyResult<Source> {
    source_with(&Defs::new(cfg.py())?, cfg)
}

fn source_with<'py>(defs: &Defs<'py>, cfg: &Bound<'py, PyAny>) -> PyResult<Source> {
    let py = cfg.py();
    if defs.is(cfg, "SourceConfig")? {
        let src = attr(cfg, "source")?;
        let continuous = attr(cfg, "continuous")?.is_truthy()?;
        check_iterable(&src, continuous)?;
        if src.hasattr(intern!(py, "__aiter__"))? {
            return Ok(Source::Async { aiter: Arc::new(src.call_method0(intern!(py, "__aiter__"))?.unbind()) });
        }
        if !continuous {
            if let Ok(range) = src.cast_exact::<PyRange>() {
                let field = |name: &str| range.getattr(name).and_then(|v| v.extract::<i64>());
                if let (Ok(start), Ok(stop), Ok(step)) = (field("start"), field("stop"), field("step")) {
                    return Ok(Source::Range { start, stop, step });
                }
            }
            // Snapshotted at build: only an exact list or tuple (finite by construction; a subclass's own
            // `__iter__` may be endless or raise, so it is iterated lazily like any iterable).
            if src.is_exact_instance_of::<PyList>() || src.is_exact_instance_of::<PyTuple>() {
                return Ok(Source::List { items: src.unbind() });
            }
        }
        return Ok(Source::Iter { iterable: Arc::new(src.unbind()), continuous });
    }
    if defs.is(cfg, "MergeConfig")? {
        if !attr(cfg, "op")?.is_none() {
            return Err(PyTypeError::new_err("a Merge with a custom op is run by the Python layer"));
        }
        let mut inputs = Vec::new();
        for c in attr(cfg, "pipeline_configs")?.try_iter()? {
            let c = c?;
            inputs.push((source_with(defs, &attr(&c, "src")?)?, steps_with(defs, &attr(&c, "pipes")?)?));
        }
        return Ok(Source::Merge { inputs });
    }
    Err(PyTypeError::new_err(format!("the source must be a SourceConfig or a MergeConfig, got {}", type_name(cfg))))
}

/// Reads a sequence of step configs.
pub(crate) fn steps(cfgs: &Bound<'_, PyAny>) -> PyResult<Vec<Step>> {
    steps_with(&Defs::new(cfgs.py())?, cfgs)
}

fn steps_with<'py>(defs: &Defs<'py>, cfgs: &Bound<'py, PyAny>) -> PyResult<Vec<Step>> {
    cfgs.try_iter()?.map(|c| step_with(defs, &c?)).collect()
}

fn step_with<'py>(defs: &Defs<'py>, cfg: &Bound<'py, PyAny>) -> PyResult<Step> {
    if defs.is(cfg, "PipeConfig")? {
        let name: String = attr(cfg, "name")?.extract()?;
        let concurrency = attr(cfg, "concurrency")?;
        let positive = crate::args::is_plain_int(&concurrency) && concurrency.extract::<i128>()? >= 1;
        if !positive {
            return Err(PyValueError::new_err(format!(
                "concurrency must be a positive integer, got {}",
                concurrency.repr()?
            )));
        }
        let op = match classify(&attr(cfg, "op")?)? {
            (Some(kind), op) => OpImpl::Python { kind, op: Arc::new(op.unbind()) },
            (None, op) => OpImpl::Native(Arc::clone(&op.cast::<super::PyNativeOp>()?.get().op)),
        };
        return Ok(Step::Pipe(PipeSpec {
            name,
            op,
            concurrency: concurrency.extract()?,
            order: order(&attr(cfg, "output_order")?)?,
            failure_budget: max_failures(&attr(cfg, "max_failures")?, "max_failures", true)?,
        }));
    }
    if defs.is(cfg, "AggregateConfig")? {
        return aggregate(defs, &attr(cfg, "op")?, attr(cfg, "drop_last")?.is_truthy()?);
    }
    if defs.is(cfg, "DisaggregateConfig")? {
        return Ok(Step::Disaggregate);
    }
    if defs.is(cfg, "PathVariantsConfig")? {
        let (kind, router) = classify(&attr(cfg, "router")?)?;
        let is_async = match kind {
            Some(PyOpKind::Sync) => false,
            Some(PyOpKind::Async) => true,
            other => {
                let what = match other {
                    None => "native",
                    Some(PyOpKind::Gen) => "gen",
                    _ => "asyncgen",
                };
                return Err(PyTypeError::new_err(format!(
                    "a path_variants router must be a function or an async function, got a {what} op"
                )));
            }
        };
        let paths = attr(cfg, "paths")?.try_iter()?.map(|p| steps_with(defs, &p?)).collect::<PyResult<Vec<_>>>()?;
        if paths.is_empty() {
            return Err(PyValueError::new_err("PathVariantsConfig must have at least 1 path."));
        }
        return Ok(Step::PathVariants(PathVariantsStep {
            name: attr(cfg, "name")?.extract()?,
            router: Arc::new(router.unbind()),
            is_async,
            paths,
            batched: attr(cfg, "batched")?.is_truthy()?,
            order: order(&attr(cfg, "output_order")?)?,
        }));
    }
    if let Ok(t) = cfg.cast::<ThroughStep>() {
        let t = t.get();
        return Ok(Step::Through { name: t.name.clone(), func: Arc::clone(&t.func) });
    }
    Err(PyTypeError::new_err(format!(
        "a {} step is not supported (Pipe, Aggregate, Disaggregate, PathVariants and PlacementConfig markers are)",
        type_name(cfg)
    )))
}

/// An aggregation: a batch size, a plain `Collate` (run natively), or any object with `accumulate` and
/// `flush` (named by its `name`, else `aggregate(TypeName)`).
fn aggregate<'py>(defs: &Defs<'py>, op: &Bound<'py, PyAny>, drop_last: bool) -> PyResult<Step> {
    let py = op.py();
    if op.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err("aggregate needs a positive integer or an Aggregator, got a bool"));
    }
    let size = if crate::args::is_plain_int(op) {
        Some(op.clone())
    } else if op.get_type().is(&defs.0.getattr("Collate")?) {
        Some(op.getattr("n")?)
    } else {
        None
    };
    if let Some(size) = size {
        let n: i128 = size.extract().unwrap_or(0);
        if !(1..=MAX_BATCH).contains(&n) {
            return Err(PyValueError::new_err(format!(
                "aggregate needs a positive integer (at most 2**48), got {}",
                size.repr()?
            )));
        }
        return Ok(Step::Aggregate { size: n as usize, drop_last });
    }
    let has = |m: &Bound<'py, PyString>| op.getattr(m).is_ok_and(|f| f.is_callable());
    if has(intern!(py, "accumulate")) && has(intern!(py, "flush")) {
        let name = match op.getattr(intern!(py, "name")).and_then(|n| n.extract::<String>()) {
            Ok(n) => n,
            Err(_) => format!("aggregate({})", type_name(op)),
        };
        return Ok(Step::Aggregator { name, aggregator: Arc::new(op.clone().unbind()), drop_last });
    }
    Err(PyTypeError::new_err(format!(
        "aggregate needs a positive integer or an Aggregator (accumulate/flush), got {}",
        type_name(op)
    )))
}

/// Checks a step config as the build reads it, raising what the build would. The Python builder calls this
/// when a stage is added, so that a bad value fails there, with the build's message.
#[pyfunction]
pub fn check(config: &Bound<'_, PyAny>) -> PyResult<()> {
    step_with(&Defs::new(config.py())?, config).map(drop)
}

/// Checks an aggregation's `op` (a batch size or an aggregator) as the build reads it (see [`check`]).
#[pyfunction]
pub fn check_aggregate(op: &Bound<'_, PyAny>) -> PyResult<()> {
    aggregate(&Defs::new(op.py())?, op, false).map(drop)
}

/// Whether `cfg` is (or holds, in a `path_variants` path) a stage with `output_order="input"`.
fn has_ordered_pipe<'py>(defs: &Defs<'py>, cfg: &Bound<'py, PyAny>) -> PyResult<bool> {
    if defs.is(cfg, "PipeConfig")? {
        return Ok(attr(cfg, "output_order")?.extract::<String>().is_ok_and(|o| o == "input"));
    }
    if defs.is(cfg, "PathVariantsConfig")? {
        for path in attr(cfg, "paths")?.try_iter()? {
            for step in path?.try_iter()? {
                if has_ordered_pipe(defs, &step?)? {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}

/// SPDL's checks of the `.to()` markers in a pipeline's steps: no empty region, no `output_order="input"`
/// stage inside one, every region closed before the sink, a positive `buffer_size`, and (at the marker)
/// subinterpreters available for an `InterpreterPoolExecutorConfig` target.
#[pyfunction]
pub fn check_regions(pipes: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = pipes.py();
    let defs = Defs::new(py)?;
    let empty = |closing: &str| {
        PyValueError::new_err(format!(
            "An empty `to(...)` region has no stages. Add stages {closing}, or remove the redundant marker."
        ))
    };
    let (mut in_region, mut has_stage) = (false, false);
    for p in pipes.try_iter()? {
        let p = p?;
        if defs.is(&p, "PlacementConfig")? {
            if in_region && !has_stage {
                return Err(empty("before the next `.to(...)`"));
            }
            let target = attr(&p, "target")?;
            in_region = !defs.is(&target, "_MainProcess")?;
            has_stage = false;
            let size = attr(&p, "buffer_size")?;
            if size.is_instance_of::<pyo3::types::PyBool>()
                || !size.is_instance_of::<pyo3::types::PyInt>()
                || size.lt(1)?
            {
                return Err(PyValueError::new_err(format!("`buffer_size` must be a positive integer. Got: {size}.")));
            }
            if defs.is(&target, "InterpreterPoolExecutorConfig")? {
                py.import(intern!(py, "spdl_rs.pipeline._region"))?.call_method0("check_interpreters_available")?;
            }
        } else if in_region {
            has_stage = true;
            if has_ordered_pipe(&defs, &p)? {
                return Err(PyValueError::new_err(
                    "A stage with `output_order='input'` cannot run inside a `to()` region: input order cannot be \
                     preserved across the region's independent workers.",
                ));
            }
        }
    }
    if in_region && !has_stage {
        return Err(empty("before closing it"));
    }
    if in_region {
        return Err(PyValueError::new_err(
            "A `to()` execution region must be closed with `to(MAIN_PROCESS)` before `add_sink()`. The sink always \
             runs in the main process.",
        ));
    }
    Ok(())
}

/// `source` checked as a pipeline's source (see [`check_iterable`]).
#[pyfunction]
#[pyo3(signature = (source, continuous=false))]
pub fn check_source(source: &Bound<'_, PyAny>, continuous: bool) -> PyResult<()> {
    check_iterable(source, continuous)
}
