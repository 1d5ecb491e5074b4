//! Turns the Python layer's source and step descriptions into an engine graph: sources (and
//! merges of sub-pipelines), `pipe`/`aggregate`/`disaggregate` steps, `path_variants` routes
//! with their branches, and `through` steps (regions run elsewhere).

use std::sync::{Arc, Mutex, PoisonError};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use spdl_exec::{Branch, Inputs, MergeOptions, MergePolicy, MergeStop, OutputOrder, PipelineBuilder, Stage};

use super::bridge::{JobContext, JobKind, Produced, Submitter};
use super::ops::{Failures, OpImpl, PipeSpec, PyAggregator, PyIter, PyIterable, RangeIter, make_stage};
use super::{budget, op_kind, order};
use crate::error::Error;
use crate::value::Value;

/// What every step needs while the graph is wired.
pub(crate) struct Ctx<'a> {
    pub(crate) failures: &'a Arc<Failures>,
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

/// A `list` item (or any iterable) becomes a batch.
fn split() -> Stage<Value, Vec<Value>> {
    Stage::map("split", |v: Value| Ok::<_, Error>(v.into_items()))
}

fn step_kind(step: &Bound<'_, PyTuple>) -> Option<String> {
    step.get_item(0).ok().and_then(|s| s.extract::<String>().ok())
}

/// Whether the step after step `i` is a `what` step.
fn next_is(steps: &[Bound<'_, PyTuple>], i: usize, what: &str) -> bool {
    steps.get(i + 1).and_then(step_kind).is_some_and(|s| s == what)
}

fn as_tuples<'py>(obj: Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
    obj.try_iter()?.map(|s| Ok(s?.cast_into::<PyTuple>()?)).collect()
}

/// The source: `("iter", iterable, continuous)`, `("range", start, stop, step)`, `("list", seq)`,
/// `("aiter", async_iterator)` or `("merge", name, inputs, policy, weights, stop_after, seed)`, where each
/// input is `(source, steps)`.
pub(crate) fn source(source: &Bound<'_, PyTuple>, ctx: &Ctx<'_>) -> PyResult<PipelineBuilder<Value>> {
    let kind: String = source.get_item(0)?.extract()?;
    let start = PipelineBuilder::new();
    Ok(match kind.as_str() {
        "iter" => {
            let iterable = Arc::new(source.get_item(1)?.unbind());
            let continuous: bool = source.get_item(2)?.extract()?;
            if continuous {
                start.continuous_source(PyIterable { iterable, failures: Arc::clone(ctx.failures), chunk: ctx.chunk })
            } else {
                start.source(PyIter::new(iterable, Arc::clone(ctx.failures), ctx.chunk))
            }
        }
        "range" => {
            let (next, stop, step): (i64, i64, i64) =
                (source.get_item(1)?.extract()?, source.get_item(2)?.extract()?, source.get_item(3)?.extract()?);
            if step == 0 {
                return Err(PyValueError::new_err("range() step must not be zero"));
            }
            start.source(RangeIter { next, stop, step })
        }
        "list" => {
            // Snapshot: taken into Rust values now, so the source runs without the GIL.
            let seq = source.get_item(1)?;
            let values: Vec<Value> = seq.try_iter()?.map(|o| o.map(Value::from_py)).collect::<PyResult<_>>()?;
            start.source(values)
        }
        "aiter" => {
            let submitter =
                ctx.submitter.ok_or_else(|| PyValueError::new_err("an async source needs the pipeline's event loop"))?;
            let aiter = Arc::new(source.get_item(1)?.unbind());
            start.source_stream(super::ops::async_source(aiter, submitter.clone(), Arc::clone(ctx.failures)))
        }
        "merge" => {
            let name: String = source.get_item(1)?.extract()?;
            let mut inputs = Vec::new();
            for input in source.get_item(2)?.try_iter()? {
                let (src, steps): (Bound<'_, PyTuple>, Bound<'_, PyAny>) = input?.extract()?;
                let chain = steps_on(Chain::One(self::source(&src, ctx)?), &as_tuples(steps)?, ctx)?;
                inputs.push(one(chain));
            }
            let policy: String = source.get_item(3)?.extract()?;
            let weights: Option<Vec<f64>> = source.get_item(4)?.extract()?;
            let stop_after: i64 = source.get_item(5)?.extract()?;
            let seed: u64 = source.get_item(6)?.extract()?;
            let policy = match policy.as_str() {
                "as_available" => MergePolicy::AsAvailable,
                "round_robin" => MergePolicy::RoundRobin,
                "weighted" => MergePolicy::Weighted {
                    weights: weights.ok_or_else(|| PyValueError::new_err("a weighted merge needs weights"))?,
                    seed,
                },
                other => return Err(PyValueError::new_err(format!("unknown merge policy {other:?}"))),
            };
            let stop = match stop_after {
                0 => MergeStop::AllExhausted,
                -1 => MergeStop::FirstExhausted,
                n if n > 0 => MergeStop::AfterItems(n.unsigned_abs()),
                n => return Err(PyValueError::new_err(format!("`stop_after` must be greater than or equal to -1. Found: {n}"))),
            };
            start.merge(inputs, MergeOptions::new(name).policy(policy).stop(stop))
        }
        other => return Err(PyValueError::new_err(format!("unknown source kind {other:?}"))),
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
    ($chain:expr, $Ch:ident, $steps:expr, $ctx:expr) => {{
        let steps: &[Bound<'_, PyTuple>] = $steps;
        let ctx: &Ctx<'_> = $ctx;
        let mut chain = $chain;
        for (i, step) in steps.iter().enumerate() {
            let what: String = step.get_item(0)?.extract()?;
            chain = match what.as_str() {
                "pipe" => {
                    let spec = pipe_spec(step, next_is(steps, i, "disaggregate"))?;
                    match chain {
                        $Ch::One(b) => $Ch::One(b.pipe(make_stage(spec, ctx.failures, ctx.submitter)?)),
                        $Ch::Batch(b) => $Ch::One(b.pipe(make_stage(spec, ctx.failures, ctx.submitter)?)),
                    }
                }
                "aggregate" => {
                    let n: usize = step.get_item(1)?.extract()?;
                    let drop_last: bool = step.get_item(2)?.extract()?;
                    let b = match chain {
                        $Ch::One(b) => b,
                        // A batch of batches: each inner batch becomes one `list` item first.
                        $Ch::Batch(b) => b.pipe(collate()),
                    };
                    $Ch::Batch(if drop_last { b.aggregate_drop_last(n) } else { b.aggregate(n) })
                }
                "aggregator" => {
                    let stage: String = step.get_item(1)?.extract()?;
                    let drop_last: bool = step.get_item(3)?.extract()?;
                    let agg = PyAggregator {
                        stage: stage.clone(),
                        agg: step.get_item(2)?.unbind(),
                        failures: Arc::clone(ctx.failures),
                        split_output: next_is(steps, i, "disaggregate"),
                    };
                    match chain {
                        $Ch::One(b) => $Ch::One(b.aggregate_with(stage, agg, drop_last)),
                        $Ch::Batch(b) => $Ch::One(b.aggregate_with(stage, agg, drop_last)),
                    }
                }
                "disaggregate" => match chain {
                    $Ch::One(b) => $Ch::One(b.disaggregate()),
                    $Ch::Batch(b) => $Ch::One(b.disaggregate()),
                },
                "path_variants" => {
                    let route = RouteSpec::parse(step)?;
                    // Routed as single values (a batch as one `list`); an async router is awaited first.
                    let b = match chain {
                        $Ch::One(b) => b,
                        $Ch::Batch(b) => b.pipe(collate()),
                    };
                    let b = match route.awaited(ctx)? {
                        Some(stage) => b.pipe(stage),
                        None => b,
                    };
                    if route.batched {
                        let b = b.pipe(Stage::map("batch", |v: Value| Ok::<_, Error>(vec![v])));
                        $Ch::Batch(b.route_batched_with(route.batch_classifier(ctx), route.batch_branches(ctx)?))
                    } else {
                        $Ch::One(b.route_with(route.item_classifier(ctx), route.item_branches(ctx)?, route.order))
                    }
                }
                "through" => {
                    let name: String = step.get_item(1)?.extract()?;
                    let func = Arc::new(step.get_item(2)?.unbind());
                    let b = match chain {
                        $Ch::One(b) => b,
                        $Ch::Batch(b) => b.pipe(collate()),
                    };
                    $Ch::One(through(b, name, func, Arc::clone(ctx.failures))?)
                }
                other => return Err(PyValueError::new_err(format!("unknown pipeline step {other:?}"))),
            };
        }
        chain
    }};
}

pub(crate) fn steps_on(chain: Chain, steps: &[Bound<'_, PyTuple>], ctx: &Ctx<'_>) -> PyResult<Chain> {
    Ok(apply_steps!(chain, Chain, steps, ctx))
}

fn branch_steps<X: Send + 'static>(
    chain: BranchChain<X>,
    steps: &[Bound<'_, PyTuple>],
    ctx: &Ctx<'_>,
) -> PyResult<BranchChain<X>> {
    Ok(apply_steps!(chain, BranchChain, steps, ctx))
}

/// A `through` step inside a branch is a region in a branch: not wired (the Python layer refuses
/// placement markers inside paths).
trait Through: Sized {
    fn through_py(self, name: String, func: Arc<Py<PyAny>>, failures: Arc<Failures>) -> PyResult<Self>;
}

fn through<B: Through>(b: B, name: String, func: Arc<Py<PyAny>>, failures: Arc<Failures>) -> PyResult<B> {
    b.through_py(name, func, failures)
}

impl Through for PipelineBuilder<Value> {
    fn through_py(self, name: String, func: Arc<Py<PyAny>>, failures: Arc<Failures>) -> PyResult<Self> {
        let stage = name.clone();
        Ok(self.through(name, move |inputs: Inputs<Value>| start_through(&stage, &func, inputs, &failures)))
    }
}

impl<X> Through for Branch<X, Value> {
    fn through_py(self, name: String, _func: Arc<Py<PyAny>>, _failures: Arc<Failures>) -> PyResult<Self> {
        Err(PyValueError::new_err(format!("stage `{name}`: a region (to()) cannot be inside a path of path_variants")))
    }
}

/// Calls the Python function of a `through` step with this epoch's inputs; returns its outputs.
fn start_through(stage: &str, func: &Py<PyAny>, inputs: Inputs<Value>, failures: &Arc<Failures>) -> Result<PyOutputs, Error> {
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
    failures: Arc<Failures>,
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

/// The inputs of one epoch of a region (`spdl_rs._native.RegionInputs`): an iterator whose `__next__`
/// waits without the GIL and raises `StopIteration` at the epoch's end, at the end of the input or when the
/// pipeline stops.
#[pyclass(module = "spdl_rs._native", frozen)]
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
        let next = py.detach(|| {
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

/// A `pipe` step: `("pipe", name, kind, op, concurrency, output_order, max_failures)`.
fn pipe_spec(step: &Bound<'_, PyTuple>, split_output: bool) -> PyResult<PipeSpec> {
    let kind: String = step.get_item(2)?.extract()?;
    let op = step.get_item(3)?;
    let op = match op_kind(&kind)? {
        Some(kind) => OpImpl::Python { kind, op: Arc::new(op.unbind()) },
        None => OpImpl::Native(Arc::clone(&op.cast::<super::PyNativeOp>()?.get().op)),
    };
    Ok(PipeSpec {
        name: step.get_item(1)?.extract()?,
        op,
        concurrency: step.get_item(4)?.extract()?,
        order: order(&step.get_item(5)?.extract::<String>()?)?,
        budget: budget(Some(step.get_item(6)?))?,
        split_output,
    })
}

/// A `path_variants` step: `("path_variants", name, router_kind, router, paths, batched, output_order)`.
struct RouteSpec<'py> {
    name: String,
    is_async: bool,
    router: Arc<Py<PyAny>>,
    paths: Vec<Vec<Bound<'py, PyTuple>>>,
    batched: bool,
    order: OutputOrder,
}

/// `async def pair(router, item): return (await router(item), item)`.
const PAIR: &std::ffi::CStr = c"async def pair(router, item):\n    return (await router(item), item)\n";

impl<'py> RouteSpec<'py> {
    fn parse(step: &Bound<'py, PyTuple>) -> PyResult<Self> {
        let kind: String = step.get_item(2)?.extract()?;
        let paths = step.get_item(4)?.try_iter()?.map(|p| as_tuples(p?)).collect::<PyResult<Vec<_>>>()?;
        if paths.is_empty() {
            return Err(PyValueError::new_err("PathVariantsConfig must have at least 1 path."));
        }
        Ok(Self {
            name: step.get_item(1)?.extract()?,
            is_async: match kind.as_str() {
                "sync" => false,
                "async" => true,
                other => return Err(PyValueError::new_err(format!("a router must be sync or async, got {other:?}"))),
            },
            router: Arc::new(step.get_item(3)?.unbind()),
            paths,
            batched: step.get_item(5)?.extract()?,
            order: order(&step.get_item(6)?.extract::<String>()?)?,
        })
    }

    /// For an async router: a stage (`name/router`) that awaits it on the pipeline's loop and gives
    /// `(index, item)` (batched: `(indices, batch)`).
    fn awaited(&self, ctx: &Ctx<'_>) -> PyResult<Option<Stage<Value, Value>>> {
        if !self.is_async {
            return Ok(None);
        }
        let submitter =
            ctx.submitter.ok_or_else(|| PyValueError::new_err("an async router needs the pipeline's event loop"))?.clone();
        let op = Python::attach(|py| -> PyResult<_> {
            let module = PyModule::from_code(py, PAIR, c"spdl_rs_route.py", c"spdl_rs_route")?;
            let partial = py.import("functools")?.getattr("partial")?.call1((module.getattr("pair")?, self.router.bind(py)))?;
            Ok(Arc::new(partial.unbind()))
        })?;
        let context = Arc::new(JobContext { stage: self.name.clone(), split: false, failures: Arc::clone(ctx.failures) });
        Ok(Some(Stage::map_async(format!("{}/router", self.name), move |item: Value| {
            let rx = submitter.submit(JobKind::Call, &op, item, &context);
            let stage = context.stage.clone();
            async move {
                let gone = || Error::LoopGone { stage: stage.clone() };
                match rx.ok_or_else(gone)?.await.map_err(|_| gone())?? {
                    Produced::Items(mut v) if v.len() == 1 => Ok::<_, Error>(v.remove(0)),
                    _ => Err(gone()),
                }
            }
        })))
    }

    fn item_classifier(&self, ctx: &Ctx<'_>) -> Stage<Value, (usize, Value)> {
        let n = self.paths.len();
        let is_async = self.is_async;
        let (name, failures, router) = (self.name.clone(), Arc::clone(ctx.failures), Arc::clone(&self.router));
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
    }

    fn item_branches(&self, ctx: &Ctx<'_>) -> PyResult<Vec<Branch<Value, Value>>> {
        self.paths
            .iter()
            .map(|steps| Ok(branch_one(branch_steps(BranchChain::One(Branch::new()), steps, ctx)?)))
            .collect()
    }

    /// Takes a one-element batch: the batch as a `list` (or, for an async router, `(indices, list)`).
    fn batch_classifier(&self, ctx: &Ctx<'_>) -> Stage<Vec<Value>, (Vec<usize>, Vec<Value>)> {
        let n = self.paths.len();
        let is_async = self.is_async;
        let (name, failures, router) = (self.name.clone(), Arc::clone(ctx.failures), Arc::clone(&self.router));
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
    }

    fn batch_branches(&self, ctx: &Ctx<'_>) -> PyResult<Vec<Branch<Vec<Value>, Vec<Value>>>> {
        self.paths
            .iter()
            .map(|steps| {
                let start = BranchChain::One(Branch::<Vec<Value>, Vec<Value>>::new().pipe(collate()));
                Ok(branch_one(branch_steps(start, steps, ctx)?).pipe(split()))
            })
            .collect()
    }
}

/// A router's index, checked against the number of paths.
fn index(obj: &Bound<'_, PyAny>, n: usize) -> PyResult<usize> {
    let i: i64 = obj.extract()?;
    usize::try_from(i).ok().filter(|&i| i < n).ok_or_else(|| {
        pyo3::exceptions::PyIndexError::new_err(format!(
            "Router returned index {i}, but there are only {n} paths (valid range: [0, {n}))."
        ))
    })
}

/// The indices a batched router returned for `list`, checked, with the list's items.
fn unpack_batch(got: &Bound<'_, PyAny>, list: &Bound<'_, PyAny>, n: usize) -> PyResult<(Vec<usize>, Vec<Value>)> {
    let items: Vec<Value> = list.try_iter()?.map(|o| o.map(Value::from_py)).collect::<PyResult<_>>()?;
    let raw: Vec<Bound<'_, PyAny>> = got.try_iter()?.collect::<PyResult<_>>()?;
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
