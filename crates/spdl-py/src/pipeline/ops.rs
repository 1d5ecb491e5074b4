//! Stage functions: Python ops (sync, generator, async, async generator) and native ops, each turned into
//! an [`spdl_exec::Stage`] over [`Value`]s.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use pyo3::exceptions::{PyException, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyIterator, PyList, PyString, PyTuple};
use spdl_exec::{Aggregator, BoxError, FailureBudget, ItemSize, OutputOrder, Stage};

use super::bridge::{JobContext, JobKind, Produced, Submitter};
use super::failure_log::FailureLog;
use crate::error::Error;
use crate::value::Value;

/// A function that runs entirely in Rust, without the GIL: the building block of `spdl_rs.io.ops`.
pub trait NativeOp: Send + Sync + fmt::Debug {
    /// A short name for stats and errors (`decode_image`).
    fn name(&self) -> &str;
    /// What the op takes, for error messages (`"bytes or str (a path)"`).
    fn expects(&self) -> &'static str;
    /// Processes one item into zero, one or many outputs.
    fn call(&self, stage: &str, input: Value) -> Result<Vec<Value>, Error>;
    /// `true` for an op that mostly waits (network, disk): the engine then awaits [`NativeOp::call_async`] on
    /// its scheduler, so `concurrency` requests are in flight without a pool thread blocked on each.
    fn is_async(&self) -> bool {
        false
    }
    /// The op as a future, used when [`NativeOp::is_async`]; by default, [`NativeOp::call`] run at once.
    fn call_async(&self, stage: &str, input: Value) -> BoxFuture<'static, Result<Vec<Value>, Error>> {
        let out = self.call(stage, input);
        Box::pin(async move { out })
    }
}

/// A native op as a Python object (`spdl_rs.io.ops.decode_image(...)` returns one), to be given to
/// `PipelineBuilder.pipe`. Calling it applies the op to one item directly (handy for testing).
#[pyclass(name = "NativeOp", module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct PyNativeOp {
    pub(crate) op: Arc<dyn NativeOp>,
}

#[pymethods]
impl PyNativeOp {
    /// The op's name.
    #[getter]
    fn name(&self) -> String {
        self.op.name().to_owned()
    }

    /// Applies the op to one item (with the GIL released while it runs); returns its output, or the list of
    /// its outputs if it made several, or `None` if it made none.
    fn __call__(&self, py: Python<'_>, item: Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        super::no_panic(self.op.name(), || {
            let input = Value::from_py(item);
            let op = Arc::clone(&self.op);
            let mut out = crate::lifecycle::detach(py, move || op.call(op.name(), input))?;
            match out.len() {
                0 => Ok(py.None()),
                1 => out.pop().map_or_else(|| Ok(py.None()), |v| v.into_py(py)),
                _ => Value::List(out).into_py(py),
            }
        })
    }

    fn __repr__(&self) -> String {
        format!("spdl_rs.NativeOp({})", self.op.name())
    }
}

/// How a Python op is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PyOpKind {
    /// A function: one output, or none for `None`.
    Sync,
    /// A generator function: each yielded value is an output (`None`s are dropped).
    Gen,
    /// A coroutine function, awaited on the pipeline's event loop.
    Async,
    /// An async generator function, iterated on the pipeline's event loop.
    AsyncGen,
}

/// One `pipe` step, as read from its `PipeConfig` ([`super::spec`]).
#[derive(Debug, Clone)]
pub(crate) struct PipeSpec {
    pub(crate) name: String,
    pub(crate) op: OpImpl,
    pub(crate) concurrency: usize,
    pub(crate) order: OutputOrder,
    /// The stage's own failure budget (`None`: the pipeline's judges it).
    pub(crate) failure_budget: Option<FailureBudget>,
}

/// The function of a `pipe` step.
#[derive(Debug, Clone)]
pub(crate) enum OpImpl {
    Python { kind: PyOpKind, op: Arc<Py<PyAny>> },
    Native(Arc<dyn NativeOp>),
}

/// Items of a container that [`py_nbytes`] looks at (the rest are counted at their mean).
const SIZE_SAMPLE: usize = 16;

/// The memory a Python object holds, as the auto-tuner's memory budget counts a stage's items: `nbytes` where
/// the object has it (NumPy arrays, tensors, `memoryview`, `spdl_rs.Buffer`), the length of bytes-like
/// objects and strings, and for lists, tuples and dicts the sum over their items (the first
/// [`SIZE_SAMPLE`], scaled to the container's length; `depth` levels deep); anything else counts 64
/// bytes. An `nbytes` that raises an `Exception` or is not an integer counts 64 bytes too; any other
/// exception (`KeyboardInterrupt` raised by an `nbytes` property) is returned, so that the stage records it
/// as the pipeline's fatal exception.
pub(crate) fn py_nbytes(obj: &Bound<'_, PyAny>, depth: u32) -> PyResult<u64> {
    const OTHER: u64 = 64;
    let py = obj.py();
    // An `Exception` counts [`OTHER`] bytes; anything else stops the pipeline.
    let other = |e: PyErr| if e.is_instance_of::<PyException>(py) { Ok(OTHER) } else { Err(e) };
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().len() as u64);
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(b.len() as u64);
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(s.len().map_or(OTHER, |n| n as u64));
    }
    let scaled = |len: usize, seen: &[Bound<'_, PyAny>]| -> PyResult<u64> {
        let mut sampled = 0u64;
        for o in seen {
            sampled = sampled.saturating_add(py_nbytes(o, depth - 1)?);
        }
        Ok(if seen.is_empty() { OTHER } else { sampled.saturating_mul(len as u64) / seen.len() as u64 })
    };
    if depth > 0 {
        if let Ok(l) = obj.cast::<PyList>() {
            let seen: Vec<_> = l.iter().take(SIZE_SAMPLE).collect();
            return scaled(l.len(), &seen);
        }
        if let Ok(t) = obj.cast::<PyTuple>() {
            let seen: Vec<_> = t.iter().take(SIZE_SAMPLE).collect();
            return scaled(t.len(), &seen);
        }
        if let Ok(d) = obj.cast::<PyDict>() {
            let seen: Vec<_> = d.values().iter().take(SIZE_SAMPLE).collect();
            return scaled(d.len(), &seen);
        }
    }
    // Only an `nbytes` the type defines (a property or descriptor): an instance `__getattr__` may do anything.
    let name = pyo3::intern!(py, "nbytes");
    match obj.get_type().hasattr(name) {
        Ok(true) => {}
        Ok(false) => return Ok(OTHER),
        Err(e) => return other(e),
    }
    match obj.getattr(name) {
        Ok(n) => n.extract::<u64>().or_else(other),
        Err(e) => other(e),
    }
}

/// The memory of a value a native op made (no GIL needed); `None` for Python objects.
pub(crate) fn native_nbytes(value: &Value) -> Option<u64> {
    match value {
        Value::Py(_) => None,
        Value::Str(s) => Some(s.len() as u64),
        Value::Bytes(b) => Some(b.len() as u64),
        Value::Int(_) | Value::Float(_) => Some(8),
        Value::Buffer(b) => Some(b.nbytes() as u64),
        Value::List(items) => items.iter().map(native_nbytes).try_fold(0u64, |a, b| Some(a.saturating_add(b?))),
    }
}

/// Records the size of a native op's outputs in `size`, when a measure is due.
fn measure_native(size: &ItemSize, outputs: &[Value]) {
    if !outputs.is_empty() && size.due() {
        let total: Option<u64> = outputs.iter().map(native_nbytes).try_fold(0u64, |a, b| Some(a.saturating_add(b?)));
        if let Some(total) = total {
            size.record(total / outputs.len() as u64);
        }
    }
}

/// A Python op's result as a [`Value`] ([`Value::from_op_output`]), its size recorded in `size` when a measure is due:
/// exactly for plain data and buffers, as [`py_nbytes`]' estimate (a guess) for other Python objects.
fn measured(size: &ItemSize, obj: Bound<'_, PyAny>, split: bool) -> PyResult<Value> {
    if !size.due() {
        return Ok(Value::from_op_output(obj, split));
    }
    let kept = obj.clone();
    let value = Value::from_op_output(obj, split);
    match native_nbytes(&value) {
        Some(n) => size.record(n),
        None => size.record_guess(py_nbytes(&kept, 2)?),
    }
    Ok(value)
}

/// Builds the engine stage for one `pipe` step whose input items are `T` (a [`Value`], or the `Vec<Value>`
/// batch of an `aggregate`). `split_output`: a `disaggregate` follows, so a Python op's `list`/`tuple` result
/// is split into Rust values now, while the GIL is held, and the `disaggregate` does not need it.
pub(crate) fn make_stage<T>(
    spec: &PipeSpec,
    split_output: bool,
    failures: &Arc<FailureLog>,
    submitter: Option<&Submitter>,
) -> Result<Stage<T, Value>, Error>
where
    T: Into<Value> + Send + 'static,
{
    let PipeSpec { name, op, concurrency, order, failure_budget } = spec.clone();
    let stage_name = name.clone();
    // What the stage's items hold, measured on a sample of its outputs (for the auto-tuner's memory budget).
    let size = ItemSize::new();
    let probe = size.clone();
    let stage = match op {
        OpImpl::Native(op) if op.is_async() => Stage::flat_map_async(name, move |input: T| {
            let (call, probe) = (op.call_async(&stage_name, input.into()), probe.clone());
            async move {
                let outputs = call.await?;
                measure_native(&probe, &outputs);
                Ok::<_, Error>(outputs)
            }
        }),
        OpImpl::Native(op) => Stage::flat_map(name, move |input: T| {
            let outputs = op.call(&stage_name, input.into())?;
            measure_native(&probe, &outputs);
            Ok::<_, Error>(outputs)
        }),
        OpImpl::Python { kind: PyOpKind::Sync, op } => {
            let failures = Arc::clone(failures);
            Stage::filter_map(name, move |input: T| {
                let input: Value = input.into();
                super::tstate::attach_held(|py| {
                    let arg = input.into_py(py).map_err(|e| failures.record(py, &stage_name, e))?;
                    match op.bind(py).call1((arg,)) {
                        Ok(r) if r.is_none() => Ok(None),
                        Ok(r) => {
                            measured(&probe, r, split_output).map(Some).map_err(|e| failures.record(py, &stage_name, e))
                        }
                        Err(e) => Err(failures.record(py, &stage_name, e)),
                    }
                })
            })
        }
        OpImpl::Python { kind: PyOpKind::Gen, op } => {
            let failures = Arc::clone(failures);
            // Lazy: each yielded value goes downstream as it is yielded, and the generator is advanced
            // (on the pool, with the GIL) only while the output queue has room.
            Stage::flat_map_lazy(name, move |input: T| {
                let input: Value = input.into();
                super::tstate::attach(|py| {
                    let start = || -> PyResult<Py<PyIterator>> {
                        let arg = input.into_py(py)?;
                        Ok(op.bind(py).call1((arg,))?.try_iter()?.unbind())
                    };
                    match start() {
                        Ok(it) => Ok(PyGen {
                            it: Some(it),
                            stage: stage_name.clone(),
                            split: split_output,
                            failures: Arc::clone(&failures),
                            size: probe.clone(),
                        }),
                        Err(e) => Err(failures.record(py, &stage_name, e)),
                    }
                })
            })
        }
        OpImpl::Python { kind: PyOpKind::AsyncGen, op } => {
            let submitter = submitter
                .ok_or_else(|| Error::Invalid(format!("stage `{name}` is async but the pipeline has no event loop")))?
                .clone();
            let context =
                Arc::new(JobContext { stage: stage_name, split: split_output, failures: Arc::clone(failures) });
            // `op(item)` is made on the loop thread; then each `__anext__` is one job, submitted only when the
            // previous output is queued (the engine polls the stream under the output queue's back-pressure).
            Stage::flat_map_stream(name, move |input: T| {
                let rx = submitter.submit(JobKind::Start, &op, input.into(), &context);
                let (submitter, context) = (submitter.clone(), Arc::clone(&context));
                async move {
                    let gone = || Error::LoopGone { stage: context.stage.clone() };
                    match rx.ok_or_else(gone)?.await.map_err(|_| gone())?? {
                        Produced::Object(agen) => Ok::<_, Error>(agen_stream(Arc::new(agen), submitter, context)),
                        Produced::Items(_) | Produced::End => Err(gone()),
                    }
                }
            })
        }
        OpImpl::Python { kind, op } => {
            let submitter = submitter
                .ok_or_else(|| Error::Invalid(format!("stage `{name}` is async but the pipeline has no event loop")))?
                .clone();
            let job = if kind == PyOpKind::AsyncGen { JobKind::CollectGen } else { JobKind::Call };
            let context =
                Arc::new(JobContext { stage: stage_name, split: split_output, failures: Arc::clone(failures) });
            // The scheduler only queues the job and awaits its reply: the GIL is taken on the loop thread.
            Stage::flat_map_async(name, move |input: T| {
                let rx = submitter.submit(job, &op, input.into(), &context);
                let stage = context.stage.clone();
                let probe = probe.clone();
                async move {
                    let gone = || Error::LoopGone { stage: stage.clone() };
                    match rx.ok_or_else(gone)?.await.map_err(|_| gone())?? {
                        Produced::Items(v) => {
                            // Values already in Rust form are measured here; Python objects are not (no GIL).
                            measure_native(&probe, &v);
                            Ok::<_, Error>(v)
                        }
                        Produced::End | Produced::Object(_) => Ok(Vec::new()),
                    }
                }
            })
        }
    };
    // A concurrency left at SPDL's default (1) may be tuned (`build(autotune=True)`); any other is fixed.
    let stage = stage.item_size(size);
    let stage = if concurrency == 1 { stage } else { stage.concurrency(concurrency) };
    Ok(match failure_budget {
        Some(budget) => stage.order(order).failure_budget(budget),
        None => stage.order(order),
    })
}

/// A Python generator being iterated by a lazy stage: each `next` takes the GIL for one `__next__`
/// (skipping `None`s). An exception is logged and kept like a failed call's, and ends the generator.
struct PyGen {
    it: Option<Py<PyIterator>>,
    stage: String,
    split: bool,
    failures: Arc<FailureLog>,
    size: ItemSize,
}

impl Iterator for PyGen {
    type Item = Result<Value, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        let it = self.it.as_ref()?;
        let next = super::tstate::attach(|py| {
            let mut it = it.bind(py).clone();
            loop {
                match it.next() {
                    None => return None,
                    Some(Ok(obj)) if obj.is_none() => {}
                    Some(Ok(obj)) => {
                        return Some(
                            measured(&self.size, obj, self.split).map_err(|e| self.failures.record(py, &self.stage, e)),
                        );
                    }
                    Some(Err(e)) => return Some(Err(self.failures.record(py, &self.stage, e))),
                }
            }
        });
        if !matches!(next, Some(Ok(_))) {
            self.it = None;
        }
        next
    }
}

/// The name of the engine stage of a `disaggregate` of single items (and its failures' stage).
const DISAGGREGATE: &str = "disaggregate";

/// The `disaggregate` of single items (the outputs of a Python op or aggregator): a lazy stage (one call at
/// a time, so the order is kept, and never tuned). A batch split on the way ([`Value::List`], what a
/// `list`/`tuple` result becomes) is handed out natively by the scheduler ([`Stage::fast_path`]), without
/// the GIL or a pool job; any
/// other Python iterable is iterated one `__next__` per GIL acquisition, and only while the output queue
/// has room, so an endless iterator is fine; an exception of its `__iter__`/`__next__` fails the item
/// (logged, kept for `PipelineFailure`) and ends that iterable. A value that is not iterable is a
/// one-element batch.
pub(crate) fn disaggregate_stage(failures: &Arc<FailureLog>) -> Stage<Value, Value> {
    let failures = Arc::clone(failures);
    Stage::flat_map_lazy(DISAGGREGATE, move |v: Value| -> Result<Elements, Error> {
        match v {
            Value::List(items) => Ok(Elements::Native(items.into_iter())),
            Value::Py(obj) => super::tstate::attach(|py| {
                let bound = obj.bind(py);
                match bound.try_iter() {
                    Ok(it) => Ok(Elements::Py(PyElements { it: Some(it.unbind()), failures: Arc::clone(&failures) })),
                    Err(e) if not_iterable(bound, &e) => {
                        Ok(Elements::Native(vec![Value::Py(obj.clone_ref(py))].into_iter()))
                    }
                    Err(e) => Err(failures.record(py, DISAGGREGATE, e)),
                }
            }),
            other => Ok(Elements::Native(vec![other].into_iter())),
        }
    })
    .concurrency(1)
    // A batch split on the way, or a native value, is handed out by the scheduler itself: no pool job, no
    // pool thread held (the same cost as `disaggregate` after `aggregate`). Only Python objects need the pool.
    .fast_path(|v: Value| match v {
        Value::List(items) => Ok(items),
        Value::Py(_) => Err(v),
        other => Ok(vec![other]),
    })
}

/// Whether `iter(obj)` failed with `err` because `obj` is not iterable at all (its type has neither
/// `__iter__` nor `__getitem__`), rather than because its `__iter__` raised.
fn not_iterable(obj: &Bound<'_, PyAny>, err: &PyErr) -> bool {
    let py = obj.py();
    if !err.is_instance_of::<PyTypeError>(py) {
        return false;
    }
    let ty = obj.get_type();
    let has = |name: &str| ty.hasattr(name).unwrap_or(true);
    !has("__iter__") && !has("__getitem__")
}

/// The elements of one item of a `disaggregate` ([`disaggregate_stage`]).
pub(crate) enum Elements {
    /// A batch already in Rust form.
    Native(std::vec::IntoIter<Value>),
    /// A Python iterable.
    Py(PyElements),
}

impl Iterator for Elements {
    type Item = Result<Value, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Elements::Native(it) => it.next().map(Ok),
            Elements::Py(it) => it.next(),
        }
    }
}

/// A Python iterator handed out element by element, one `__next__` per GIL acquisition. An exception is
/// recorded as the item's failure and ends it; elements that are `None` are elements too.
pub(crate) struct PyElements {
    it: Option<Py<PyIterator>>,
    failures: Arc<FailureLog>,
}

impl Iterator for PyElements {
    type Item = Result<Value, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        let it = self.it.as_ref()?;
        let next = super::tstate::attach(|py| match it.bind(py).clone().next()? {
            Ok(obj) => Some(Ok(Value::from_py(obj))),
            Err(e) => Some(Err(self.failures.record(py, DISAGGREGATE, e))),
        });
        if !matches!(next, Some(Ok(_))) {
            self.it = None;
        }
        next
    }
}

/// The most elements [`collect_items`] takes from one Python iterable.
pub(crate) const MAX_COLLECTED: usize = 1 << 20;

/// The elements of a batch that must exist at once (a batched route's sub-batch, for its join): a
/// [`Value::List`] as it is, a Python iterable iterated with the GIL (at most [`MAX_COLLECTED`]
/// elements: more is a failure, as is an exception of the iterable, recorded for `stage`), anything else
/// a one-element batch.
pub(crate) fn collect_items(v: Value, stage: &str, failures: &FailureLog) -> Result<Vec<Value>, Error> {
    let obj = match v {
        Value::List(items) => return Ok(items),
        Value::Py(obj) => obj,
        other => return Ok(vec![other]),
    };
    super::tstate::attach(|py| {
        let bound = obj.bind(py);
        let it = match bound.try_iter() {
            Ok(it) => it,
            Err(e) if not_iterable(bound, &e) => return Ok(vec![Value::Py(obj.clone_ref(py))]),
            Err(e) => return Err(failures.record(py, stage, e)),
        };
        let mut out = Vec::new();
        for item in it {
            match item {
                Ok(o) if out.len() < MAX_COLLECTED => out.push(Value::from_py(o)),
                Ok(_) => {
                    let e = pyo3::exceptions::PyValueError::new_err(format!(
                        "an iterable of more than {MAX_COLLECTED} items cannot be a batch here (it is collected \
                         whole)"
                    ));
                    return Err(failures.record(py, stage, e));
                }
                Err(e) => return Err(failures.record(py, stage, e)),
            }
        }
        Ok(out)
    })
}

/// The outputs of an async generator, one `__anext__` job on the pipeline's event loop each (`None`s are
/// skipped). An exception fails the item (logged and kept) and ends the stream.
fn agen_stream(
    agen: Arc<Py<PyAny>>,
    submitter: Submitter,
    context: Arc<JobContext>,
) -> impl futures::Stream<Item = Result<Value, Error>> + Send + 'static {
    let guard = AgenGuard { agen: Some(agen), submitter, context };
    futures::stream::unfold(Some(guard), move |state| async move {
        let guard = state?;
        let gone = || Error::LoopGone { stage: guard.context.stage.clone() };
        loop {
            let agen = guard.agen.as_ref()?;
            let Some(rx) = guard.submitter.submit(JobKind::GenNext, agen, Value::Int(0), &guard.context) else {
                return Some((Err(gone()), None));
            };
            match rx.await {
                Err(_) => return Some((Err(gone()), None)),
                Ok(Err(e)) => return Some((Err(e), None)),
                Ok(Ok(Produced::End)) => return None,
                Ok(Ok(Produced::Items(mut v))) => {
                    if let Some(value) = v.pop() {
                        return Some((Ok(value), Some(guard)));
                    }
                    // The generator yielded `None`: nothing to emit, ask for the next one.
                }
                Ok(Ok(Produced::Object(_))) => return Some((Err(gone()), None)),
            }
        }
    })
}

/// A stage's async generator while its stream lives. When the stream is dropped (the generator ended, the
/// pipeline stopped, the item failed), the generator is closed and released on the loop thread
/// (`JobKind::Close`): released on another thread, its finalizer hook and asyncio's bookkeeping run there,
/// on whichever thread takes the GIL next (often the consumer's), where a Ctrl-C arriving at that moment
/// would be lost as an "ignored" exception.
struct AgenGuard {
    /// Always `Some` until dropped.
    agen: Option<Arc<Py<PyAny>>>,
    submitter: Submitter,
    context: Arc<JobContext>,
}

impl Drop for AgenGuard {
    fn drop(&mut self) {
        // Finished or not, the last reference goes with a job to the loop thread: asyncio keeps every async
        // generator it started in a weak set whose removal callback runs wherever the generator is freed, and
        // a reference dropped here, without the GIL, is released later by whichever thread takes the GIL next.
        // The loop may be gone already: then the generator is dropped with the job, as before.
        if let Some(agen) = self.agen.take() {
            let _ = self.submitter.submit_owned(JobKind::Close, agen, Value::Int(0), &self.context);
        }
    }
}

/// A Python aggregator (SPDL's `spdl.pipeline.defs.Aggregator`: an object with `accumulate(item)` and
/// `flush()`, each returning an output or `None`), run by the engine's `aggregate_with`: one call at a time,
/// on the pool, holding the GIL only for the call.
pub(crate) struct PyAggregator {
    pub(crate) stage: String,
    pub(crate) agg: Arc<Py<PyAny>>,
    pub(crate) failures: Arc<FailureLog>,
    /// A `disaggregate` follows: split `list`/`tuple` outputs now, while the GIL is held.
    pub(crate) split_output: bool,
}

impl PyAggregator {
    fn call(&self, method: &str, input: Option<Value>) -> Result<Option<Value>, BoxError> {
        super::tstate::attach(|py| {
            let agg = self.agg.bind(py);
            let result = match input {
                Some(input) => input.into_py(py).and_then(|arg| agg.call_method1(method, (arg,))),
                None => agg.call_method0(method),
            };
            match result {
                Ok(r) if r.is_none() => Ok(None),
                Ok(r) => Ok(Some(Value::from_op_output(r, self.split_output))),
                Err(e) => Err(self.failures.record(py, &self.stage, e).into()),
            }
        })
    }
}

impl<T: Into<Value> + Send + 'static> Aggregator<T> for PyAggregator {
    type Output = Value;

    fn accumulate(&mut self, item: T) -> Result<Option<Value>, BoxError> {
        self.call("accumulate", Some(item.into()))
    }

    fn flush(&mut self) -> Result<Option<Value>, BoxError> {
        self.call("flush", None)
    }
}

/// A Python iterator pulled by the engine's source run, a few items per GIL acquisition.
pub(crate) struct PyIter {
    /// The iterable (for a continuous source, iterated anew each epoch) or the iterator.
    iterable: Arc<Py<PyAny>>,
    iter: Option<Py<PyAny>>,
    buf: std::collections::VecDeque<Value>,
    done: bool,
    chunk: usize,
    /// The most items taken per GIL acquisition (they wait here, alive, before the first queue).
    max_chunk: usize,
    failures: Arc<FailureLog>,
    /// The items' measured size (the queue after the source deepens while they are small).
    size: ItemSize,
}

/// Items taken from a Python iterator per GIL acquisition, at most: first 1 (the first item comes out at
/// once), then doubling up to this.
const SOURCE_CHUNK: usize = 32;

impl PyIter {
    /// `max_chunk`: items taken per GIL acquisition at most (clamped to 1..=32); the pipeline passes its
    /// stage queue capacity, so that the source holds no more items than a queue does.
    pub(crate) fn new(iterable: Arc<Py<PyAny>>, failures: Arc<FailureLog>, max_chunk: usize, size: ItemSize) -> Self {
        let max_chunk = max_chunk.clamp(1, SOURCE_CHUNK);
        Self { iterable, iter: None, buf: Default::default(), done: false, chunk: 1, max_chunk, failures, size }
    }

    fn refill(&mut self) {
        // A source that raised ends the pipeline, as in SPDL: a continuous source is not iterated again (its
        // next epoch is empty, which ends the engine's pipeline) and the consumer gets the failure.
        if self.failures.source_error().is_some() || self.failures.fatal().is_some() {
            self.done = true;
            return;
        }
        let chunk = self.chunk;
        self.chunk = (self.chunk * 2).min(self.max_chunk);
        super::tstate::attach(|py| {
            let it = match &self.iter {
                Some(it) => it.bind(py).clone(),
                None => match self.iterable.bind(py).try_iter() {
                    Ok(it) => {
                        self.iter = Some(it.clone().into_any().unbind());
                        it.into_any()
                    }
                    Err(e) => {
                        self.failures.record_source(py, e);
                        self.done = true;
                        return;
                    }
                },
            };
            let Ok(mut it) = it.cast_into::<PyIterator>() else {
                self.done = true;
                return;
            };
            for _ in 0..chunk {
                match it.next() {
                    Some(Ok(obj)) => match measured(&self.size, obj, false) {
                        Ok(v) => self.buf.push_back(v),
                        Err(e) => {
                            self.failures.record_source(py, e);
                            self.done = true;
                            return;
                        }
                    },
                    Some(Err(e)) => {
                        self.failures.record_source(py, e);
                        self.done = true;
                        return;
                    }
                    None => {
                        self.done = true;
                        return;
                    }
                }
            }
        });
    }
}

impl Iterator for PyIter {
    type Item = Value;

    fn next(&mut self) -> Option<Value> {
        if self.buf.is_empty() && !self.done {
            self.refill();
        }
        self.buf.pop_front()
    }
}

/// A Python iterable re-iterated each epoch (a `continuous=True` source). An exception of the iterable
/// ends the pipeline (the epoch it cut short is the last), as a one-pass source's does.
#[derive(Clone)]
pub(crate) struct PyIterable {
    pub(crate) iterable: Arc<Py<PyAny>>,
    pub(crate) failures: Arc<FailureLog>,
    /// See [`PyIter::new`].
    pub(crate) chunk: usize,
    /// Shared by the epochs' iterators.
    pub(crate) size: ItemSize,
}

impl IntoIterator for PyIterable {
    type Item = Value;
    type IntoIter = PyIter;

    fn into_iter(self) -> PyIter {
        PyIter::new(self.iterable, self.failures, self.chunk, self.size)
    }
}

/// A Python `range`, iterated in Rust (no GIL at all).
#[derive(Debug, Clone)]
pub(crate) struct RangeIter {
    pub(crate) next: i64,
    pub(crate) stop: i64,
    pub(crate) step: i64,
    /// Every item is an 8-byte integer (recorded on the calls [`ItemSize::due`] asks for).
    pub(crate) size: ItemSize,
}

impl Iterator for RangeIter {
    type Item = Value;

    fn next(&mut self) -> Option<Value> {
        let more = if self.step > 0 { self.next < self.stop } else { self.next > self.stop };
        if !more {
            return None;
        }
        let v = self.next;
        if self.size.due() {
            self.size.record(8);
        }
        match self.next.checked_add(self.step) {
            Some(n) => self.next = n,
            None => self.next = self.stop,
        }
        Some(Value::Int(v))
    }
}

/// An async iterator pulled through the event loop, one `__anext__` at a time.
pub(crate) fn async_source(
    aiter: Arc<Py<PyAny>>,
    submitter: Submitter,
    failures: Arc<FailureLog>,
) -> impl futures::Stream<Item = Value> + Send + 'static {
    let context = Arc::new(JobContext { stage: "source".to_owned(), split: false, failures });
    futures::stream::unfold(Some((aiter, submitter, context)), |state| async move {
        let (aiter, submitter, context) = state?;
        let rx = submitter.submit(JobKind::Next, &aiter, Value::Int(0), &context)?;
        match rx.await.ok()? {
            Ok(Produced::Items(mut v)) => {
                let value = v.pop()?;
                Some((value, Some((aiter, submitter, context))))
            }
            Ok(Produced::End | Produced::Object(_)) | Err(_) => None,
        }
    })
}
