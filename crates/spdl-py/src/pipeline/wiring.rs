//! Turns a pipeline's description ([`super::spec`]: the `defs` configs, read) into an engine graph: sources
//! (and merges of sub-pipelines), `pipe`/`aggregate`/`disaggregate` steps, `path_variants` routes with their
//! branches, and `through` steps (regions run elsewhere).

use std::sync::{Arc, Mutex, PoisonError};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use spdl_exec::{
    Branch, FailureBudget, Inputs, ItemSize, MergeOptions, MergePolicy, MergeStop, PipelineBuilder, Stage,
};

use super::bridge::{JobContext, JobKind, Produced, Submitter};
use super::failure_log::FailureLog;
use super::ops::{PyAggregator, PyIter, PyIterable, RangeIter, collect_items, disaggregate_stage, make_stage};
use super::spec::{PathVariantsStep, Source, Step};
use crate::error::Error;
use crate::value::Value;

/// What every step needs while the graph is wired.
pub(crate) struct Ctx<'a> {
    pub(crate) failures: &'a Arc<FailureLog>,
    pub(crate) submitter: Option<&'a Submitter>,
    /// Items taken from a Python iterator per GIL acquisition (the stage buffer size).
    pub(crate) chunk: usize,
}

/// The builder state while steps are added: items are single values, or batches after `aggregate`.
pub(crate) enum Chain {
    One(PipelineBuilder<Value>),
    Batch(PipelineBuilder<Vec<Value>>),
}

/// The same for a branch of a route whose items come in as `X`.
enum BranchChain<X> {
    One(Branch<X, Value>),
    Batch(Branch<X, Vec<Value>>),
}

/// A batch becomes one `list` item.
fn collate() -> Stage<Vec<Value>, Value> {
    Stage::map("collate", |v: Vec<Value>| Ok::<_, Error>(Value::List(v)))
}

/// A `list` item (or any iterable, collected whole and bounded: [`collect_items`]) becomes a batch.
fn split(failures: &Arc<FailureLog>) -> Stage<Value, Vec<Value>> {
    let failures = Arc::clone(failures);
    Stage::map("split", move |v: Value| collect_items(v, "split", &failures))
}

/// Whether the step after step `i` is a `disaggregate`.
fn next_is_disaggregate(steps: &[Step], i: usize) -> bool {
    matches!(steps.get(i + 1), Some(Step::Disaggregate))
}

/// The source (see [`Source`]): a merge's inputs are sources with their own steps.
pub(crate) fn source(py: Python<'_>, source: &Source, ctx: &Ctx<'_>) -> PyResult<PipelineBuilder<Value>> {
    let start = PipelineBuilder::new();
    Ok(match source {
        Source::Iter { iterable, continuous } => {
            let iterable = Arc::clone(iterable);
            let size = ItemSize::new();
            if *continuous {
                let failures = Arc::clone(ctx.failures);
                start.continuous_source_measured(
                    PyIterable { iterable, failures, chunk: ctx.chunk, size: size.clone() },
                    size,
                )
            } else {
                start.source_measured(PyIter::new(iterable, Arc::clone(ctx.failures), ctx.chunk, size.clone()), size)
            }
        }
        &Source::Range { start: next, stop, step } => {
            let size = ItemSize::new();
            start.source_measured(RangeIter { next, stop, step, size: size.clone() }, size)
        }
        Source::List { items } => {
            // Snapshot: taken into Rust values now, so the source runs without the GIL.
            let values: Vec<Value> =
                items.bind(py).try_iter()?.map(|o| o.map(Value::from_py)).collect::<PyResult<_>>()?;
            // Measured up front (a sample), for the queue after the source.
            let size = ItemSize::new();
            for v in values.iter().take(8) {
                match super::ops::native_nbytes(v) {
                    Some(n) => size.record(n),
                    None => size.record_guess(64),
                }
            }
            start.source_measured(values, size)
        }
        Source::Async { aiter } => {
            let submitter = ctx
                .submitter
                .ok_or_else(|| PyValueError::new_err("an async source needs the pipeline's event loop"))?;
            start.source_stream(super::ops::async_source(
                Arc::clone(aiter),
                submitter.clone(),
                Arc::clone(ctx.failures),
            ))
        }
        Source::Merge { inputs } => {
            let mut chains = Vec::with_capacity(inputs.len());
            for (src, steps) in inputs {
                chains.push(one(steps_on(py, Chain::One(self::source(py, src, ctx)?), steps, ctx)?));
            }
            start.merge(
                chains,
                MergeOptions::new("merge").policy(MergePolicy::AsAvailable).stop(MergeStop::AllExhausted),
            )
        }
    })
}

/// Single items: a batch becomes one `list` item.
fn one(chain: Chain) -> PipelineBuilder<Value> {
    match chain {
        Chain::One(b) => b,
        Chain::Batch(b) => b.pipe(collate()),
    }
}

fn branch_one<X: Send + 'static>(chain: BranchChain<X>) -> Branch<X, Value> {
    match chain {
        BranchChain::One(b) => b,
        BranchChain::Batch(b) => b.pipe(collate()),
    }
}

/// Applies the steps to a [`Chain`] or a [`BranchChain`]: the same methods exist on both.
macro_rules! apply_steps {
    ($py:expr, $chain:expr, $Ch:ident, $steps:expr, $ctx:expr) => {{
        let steps: &[Step] = $steps;
        let ctx: &Ctx<'_> = $ctx;
        let mut chain = $chain;
        for (i, step) in steps.iter().enumerate() {
            chain = match step {
                Step::Pipe(p) => {
                    let split = next_is_disaggregate(steps, i);
                    match chain {
                        $Ch::One(b) => $Ch::One(b.pipe(make_stage(p, split, ctx.failures, ctx.submitter)?)),
                        $Ch::Batch(b) => $Ch::One(b.pipe(make_stage(p, split, ctx.failures, ctx.submitter)?)),
                    }
                }
                &Step::Aggregate { size, drop_last } => {
                    let b = match chain {
                        $Ch::One(b) => b,
                        // A batch of batches: each inner batch becomes one `list` item first.
                        $Ch::Batch(b) => b.pipe(collate()),
                    };
                    $Ch::Batch(if drop_last { b.aggregate_drop_last(size) } else { b.aggregate(size) })
                }
                Step::Aggregator { name, aggregator, drop_last } => {
                    let agg = PyAggregator {
                        stage: name.clone(),
                        agg: Arc::clone(aggregator),
                        failures: Arc::clone(ctx.failures),
                        split_output: next_is_disaggregate(steps, i),
                    };
                    match chain {
                        $Ch::One(b) => $Ch::One(b.aggregate_with(name.clone(), agg, *drop_last)),
                        $Ch::Batch(b) => $Ch::One(b.aggregate_with(name.clone(), agg, *drop_last)),
                    }
                }
                Step::Disaggregate => match chain {
                    // Single items may be Python iterables: split lazily, on the pool.
                    $Ch::One(b) => $Ch::One(b.pipe(disaggregate_stage(ctx.failures))),
                    // An `aggregate`'s batches are Rust vectors: split natively on the scheduler.
                    $Ch::Batch(b) => $Ch::One(b.disaggregate()),
                },
                Step::PathVariants(pv) => {
                    let route = RouteSpec { pv, py: $py };
                    // Routed as single values (a batch as one `list`); an async router is awaited first.
                    let b = match chain {
                        $Ch::One(b) => b,
                        $Ch::Batch(b) => b.pipe(collate()),
                    };
                    let b = match route.awaited(ctx)? {
                        Some(stage) => b.pipe(stage),
                        None => b,
                    };
                    if pv.batched {
                        let b = b.pipe(Stage::map("batch", |v: Value| Ok::<_, Error>(vec![v])));
                        $Ch::Batch(b.route_batched_with(route.batch_classifier(ctx), route.batch_branches(ctx)?))
                    } else {
                        $Ch::One(b.route_with(route.item_classifier(ctx), route.item_branches(ctx)?, pv.order))
                    }
                }
                Step::Through { name, func } => {
                    let b = match chain {
                        $Ch::One(b) => b,
                        $Ch::Batch(b) => b.pipe(collate()),
                    };
                    $Ch::One(through(b, name.clone(), Arc::clone(func), Arc::clone(ctx.failures))?)
                }
            };
        }
        chain
    }};
}

pub(crate) fn steps_on(py: Python<'_>, chain: Chain, steps: &[Step], ctx: &Ctx<'_>) -> PyResult<Chain> {
    Ok(apply_steps!(py, chain, Chain, steps, ctx))
}

fn branch_steps<X: Send + 'static>(
    py: Python<'_>,
    chain: BranchChain<X>,
    steps: &[Step],
    ctx: &Ctx<'_>,
) -> PyResult<BranchChain<X>> {
    Ok(apply_steps!(py, chain, BranchChain, steps, ctx))
}

/// A `through` step inside a branch is a region in a branch: not wired (the Python layer refuses
/// placement markers inside paths).
trait Through: Sized {
    fn through_py(self, name: String, func: Arc<Py<PyAny>>, failures: Arc<FailureLog>) -> PyResult<Self>;
}

fn through<B: Through>(b: B, name: String, func: Arc<Py<PyAny>>, failures: Arc<FailureLog>) -> PyResult<B> {
    b.through_py(name, func, failures)
}

impl Through for PipelineBuilder<Value> {
    fn through_py(self, name: String, func: Arc<Py<PyAny>>, failures: Arc<FailureLog>) -> PyResult<Self> {
        let stage = name.clone();
        Ok(self.through(name, move |inputs: Inputs<Value>| start_through(&stage, &func, inputs, &failures)))
    }
}

impl<X> Through for Branch<X, Value> {
    fn through_py(self, name: String, _func: Arc<Py<PyAny>>, _failures: Arc<FailureLog>) -> PyResult<Self> {
        Err(PyValueError::new_err(format!("stage `{name}`: a region (to()) cannot be inside a path of path_variants")))
    }
}

/// Calls the Python function of a `through` step with this epoch's inputs; returns its outputs.
fn start_through(
    stage: &str,
    func: &Py<PyAny>,
    inputs: Inputs<Value>,
    failures: &Arc<FailureLog>,
) -> Result<PyOutputs, Error> {
    super::tstate::attach(|py| {
        let run = || -> PyResult<Py<PyAny>> {
            let feed = Py::new(py, RegionInputs { inputs: Mutex::new(Some(inputs)) })?;
            Ok(func.bind(py).call1((feed,))?.try_iter()?.into_any().unbind())
        };
        match run() {
            Ok(it) => Ok(PyOutputs { it: Some(it), stage: stage.to_owned(), failures: Arc::clone(failures) }),
            Err(e) => Err(failures.record(py, stage, e)),
        }
    })
}

/// The outputs of a `through` step's Python function, advanced with the GIL.
struct PyOutputs {
    it: Option<Py<PyAny>>,
    stage: String,
    failures: Arc<FailureLog>,
}

impl Iterator for PyOutputs {
    type Item = Result<Value, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        let it = self.it.as_ref()?;
        let next = super::tstate::attach(|py| {
            let it = it.bind(py);
            // A `None` output is no output, as for a `pipe` op.
            loop {
                match it.call_method0("__next__") {
                    Ok(obj) if obj.is_none() => {}
                    Ok(obj) => return Some(Ok(Value::from_py(obj))),
                    Err(e) if e.is_instance_of::<pyo3::exceptions::PyStopIteration>(py) => return None,
                    Err(e) => return Some(Err(self.failures.record(py, &self.stage, e))),
                }
            }
        });
        if !matches!(next, Some(Ok(_))) {
            self.it = None;
        }
        next
    }
}

impl Drop for PyOutputs {
    fn drop(&mut self) {
        if let Some(it) = self.it.take() {
            super::tstate::attach(|_py| drop(it));
        }
    }
}

/// The inputs of one epoch of a region (`spdl_rs._native.pipeline.RegionInputs`): an iterator whose `__next__`
/// waits without the GIL and raises `StopIteration` at the epoch's end, at the end of the input or when the
/// pipeline stops.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct RegionInputs {
    inputs: Mutex<Option<Inputs<Value>>>,
}

#[pymethods]
impl RegionInputs {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let next = crate::lifecycle::detach(py, || {
            let mut guard = self.inputs.lock().unwrap_or_else(PoisonError::into_inner);
            let next = guard.as_mut().and_then(Iterator::next);
            if next.is_none() {
                *guard = None;
            }
            next
        });
        match next {
            Some(v) => Ok(Some(v.into_py(py)?)),
            None => Ok(None),
        }
    }
}

/// A `path_variants` step being wired.
struct RouteSpec<'a, 'py> {
    pv: &'a PathVariantsStep,
    py: Python<'py>,
}

/// `async def pair(router, item): return (await router(item), item)`.
const PAIR: &std::ffi::CStr = c"async def pair(router, item):\n    return (await router(item), item)\n";

impl RouteSpec<'_, '_> {
    /// For an async router: a stage (`name/router`) that awaits it on the pipeline's loop and gives
    /// `(index, item)` (batched: `(indices, batch)`).
    fn awaited(&self, ctx: &Ctx<'_>) -> PyResult<Option<Stage<Value, Value>>> {
        if !self.pv.is_async {
            return Ok(None);
        }
        let submitter = ctx
            .submitter
            .ok_or_else(|| PyValueError::new_err("an async router needs the pipeline's event loop"))?
            .clone();
        let op = Python::attach(|py| -> PyResult<_> {
            let module = PyModule::from_code(py, PAIR, c"spdl_rs_route.py", c"spdl_rs_route")?;
            let partial = py
                .import("functools")?
                .getattr("partial")?
                .call1((module.getattr("pair")?, self.pv.router.bind(py)))?;
            Ok(Arc::new(partial.unbind()))
        })?;
        let context =
            Arc::new(JobContext { stage: self.pv.name.clone(), split: false, failures: Arc::clone(ctx.failures) });
        Ok(Some(
            Stage::map_async(format!("{}/router", self.pv.name), move |item: Value| {
                let rx = submitter.submit(JobKind::Call, &op, item, &context);
                let stage = context.stage.clone();
                async move {
                    let gone = || Error::LoopGone { stage: stage.clone() };
                    match rx.ok_or_else(gone)?.await.map_err(|_| gone())?? {
                        Produced::Items(mut v) if v.len() == 1 => Ok::<_, Error>(v.remove(0)),
                        _ => Err(gone()),
                    }
                }
            })
            .failure_budget(ROUTER_FAILURE_BUDGET),
        ))
    }

    fn item_classifier(&self, ctx: &Ctx<'_>) -> Stage<Value, (usize, Value)> {
        let n = self.pv.paths.len();
        let is_async = self.pv.is_async;
        let (name, failures, router) = (self.pv.name.clone(), Arc::clone(ctx.failures), Arc::clone(&self.pv.router));
        Stage::map(name.clone(), move |item: Value| {
            super::tstate::attach(|py| {
                let run = || -> PyResult<(usize, Value)> {
                    let obj = item.into_py(py)?;
                    let (i, item) = if is_async {
                        obj.bind(py).extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>()?
                    } else {
                        (router.bind(py).call1((obj.clone_ref(py),))?, obj.into_bound(py))
                    };
                    Ok((index(&i, n)?, Value::from_py(item)))
                };
                run().map_err(|e| failures.record(py, &name, e))
            })
        })
        .failure_budget(ROUTER_FAILURE_BUDGET)
    }

    fn item_branches(&self, ctx: &Ctx<'_>) -> PyResult<Vec<Branch<Value, Value>>> {
        self.pv
            .paths
            .iter()
            .map(|steps| Ok(branch_one(branch_steps(self.py, BranchChain::One(Branch::new()), steps, ctx)?)))
            .collect()
    }

    /// Takes a one-element batch: the batch as a `list` (or, for an async router, `(indices, list)`).
    fn batch_classifier(&self, ctx: &Ctx<'_>) -> Stage<Vec<Value>, (Vec<usize>, Vec<Value>)> {
        let n = self.pv.paths.len();
        let is_async = self.pv.is_async;
        let (name, failures, router) = (self.pv.name.clone(), Arc::clone(ctx.failures), Arc::clone(&self.pv.router));
        Stage::map(name.clone(), move |one: Vec<Value>| {
            super::tstate::attach(|py| {
                let run = || -> PyResult<(Vec<usize>, Vec<Value>)> {
                    let obj = one.into_iter().next().map_or_else(|| Ok(py.None()), |v| v.into_py(py))?;
                    let (got, list) = if is_async {
                        obj.bind(py).extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>()?
                    } else {
                        (router.bind(py).call1((obj.clone_ref(py),))?, obj.into_bound(py))
                    };
                    unpack_batch(&got, &list, n)
                };
                run().map_err(|e| failures.record(py, &name, e))
            })
        })
        .failure_budget(ROUTER_FAILURE_BUDGET)
    }

    fn batch_branches(&self, ctx: &Ctx<'_>) -> PyResult<Vec<Branch<Vec<Value>, Vec<Value>>>> {
        self.pv
            .paths
            .iter()
            .map(|steps| {
                let start = BranchChain::One(Branch::<Vec<Value>, Vec<Value>>::new().pipe(collate()));
                Ok(branch_one(branch_steps(self.py, start, steps, ctx)?).pipe(split(ctx.failures)))
            })
            .collect()
    }
}

/// A router that raises or returns an index out of range fails the pipeline, as in SPDL: routing is the
/// pipeline's own logic, not a property of one item, so it has no failure budget (whatever `max_failures`).
const ROUTER_FAILURE_BUDGET: FailureBudget = FailureBudget::Count(0);

/// A router's index, checked against the number of paths.
fn index(obj: &Bound<'_, PyAny>, n: usize) -> PyResult<usize> {
    let i: i64 = obj.extract()?;
    usize::try_from(i).ok().filter(|&i| i < n).ok_or_else(|| {
        pyo3::exceptions::PyIndexError::new_err(format!(
            "Router returned index {i}, but there are only {n} paths (valid range: [0, {n}))."
        ))
    })
}

/// The indices a batched router returned for `list`, checked, with the list's items. The router's result
/// is read up to one index more than the batch has items (an endless iterable is an error, not a hang).
fn unpack_batch(got: &Bound<'_, PyAny>, list: &Bound<'_, PyAny>, n: usize) -> PyResult<(Vec<usize>, Vec<Value>)> {
    let limit = super::ops::MAX_COLLECTED;
    let items: Vec<Value> = list.try_iter()?.take(limit + 1).map(|o| o.map(Value::from_py)).collect::<PyResult<_>>()?;
    if items.len() > limit {
        return Err(PyValueError::new_err(format!("a batch of more than {limit} items cannot be routed")));
    }
    let raw: Vec<Bound<'_, PyAny>> = got.try_iter()?.take(items.len() + 1).collect::<PyResult<_>>()?;
    if raw.len() > items.len() {
        return Err(PyValueError::new_err(format!(
            "Batched router returned more indices than the batch has items ({}); it must return exactly one \
             index per item.",
            items.len()
        )));
    }
    if raw.len() != items.len() {
        return Err(PyValueError::new_err(format!(
            "Batched router returned {} indices for a batch of {} items; it must return exactly one index per item.",
            raw.len(),
            items.len()
        )));
    }
    let idx = raw.iter().map(|o| index(o, n)).collect::<PyResult<Vec<_>>>()?;
    Ok((idx, items))
}
