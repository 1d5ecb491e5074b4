//! `spdl_rs._native.pipeline.CheckpointTracker`: spdl-checkpoint's whole-pipeline checkpoint
//! ([`spdl_checkpoint::Checkpoint`]) over Python sources that implement the torchdata `Stateful`
//! protocol (`state_dict()`/`load_state_dict()`). The engine keeps the log (epochs, watermarks, delivered
//! spans, failures), enumerates each epoch and skips what a loaded state says was delivered. Here too:
//! the keyed item ([`Keyed`]) and what carries the keys through the sync steps ([`KeyedOp`],
//! [`KeyedAggregator`], `collate`, `split`), the sources' states as pickled text, and the state's `dict`
//! form of the protocol. The Python layer (`spdl_rs.pipeline._checkpoint`) only decides which pipelines
//! are checkpointable and wraps the async and generator ops.

use std::sync::{Mutex, PoisonError};

use pyo3::exceptions::{PyAttributeError, PyRuntimeError, PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use pyo3::{PyTraverseError, PyVisit, intern};
use spdl_checkpoint::{Checkpoint, CheckpointError, CheckpointSource, ItemKey, KeyedEpoch, KeyedSource};
use spdl_exec::BoxError;

use crate::lifecycle::detach;

/// The version of the state's format (the engine's).
const VERSION: u32 = 1;

/// A source's state as the text the engine keeps: pickled, in base64 (a snapshot: later changes to
/// `state` do not show).
fn encode(state: &Bound<'_, PyAny>) -> PyResult<String> {
    let py = state.py();
    let pickle = py.import(intern!(py, "pickle"))?;
    let data = pickle.call_method1(intern!(py, "dumps"), (state, pickle.getattr(intern!(py, "HIGHEST_PROTOCOL"))?))?;
    let text = py.import(intern!(py, "base64"))?.call_method1(intern!(py, "b64encode"), (data,))?;
    text.call_method1(intern!(py, "decode"), ("ascii",))?.extract()
}

/// A state from [`encode`]'s text (only text made by `encode` reaches it).
fn decode<'py>(py: Python<'py>, text: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let data = py.import(intern!(py, "base64"))?.call_method1(intern!(py, "b64decode"), (text,))?;
    py.import(intern!(py, "pickle"))?.call_method1(intern!(py, "loads"), (data,))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

/// A Python `Stateful` source as a [`CheckpointSource`]: its state is `encode(source.state_dict())`, a
/// JSON string; an epoch is `iter(source)`.
#[derive(Debug)]
struct PySource {
    source: Py<PyAny>,
    ordered: bool,
    name: String,
}

impl CheckpointSource for PySource {
    type Item = PyResult<Py<PyAny>>;
    type Epoch = PyEpoch;

    fn state(&self) -> Result<serde_json::Value, BoxError> {
        Python::attach(|py| -> PyResult<String> { encode(&self.source.bind(py).call_method0("state_dict")?) })
            .map(serde_json::Value::String)
            .map_err(Into::into)
    }

    fn load_state(&mut self, state: &serde_json::Value) -> Result<(), BoxError> {
        let text = state.as_str().ok_or("a source's state is the text its encoder made")?;
        Python::attach(|py| -> PyResult<()> {
            let state = decode(py, text.into_pyobject(py)?.as_any())?;
            self.source.bind(py).call_method1("load_state_dict", (state,))?;
            Ok(())
        })
        .map_err(Into::into)
    }

    fn next_epoch(&mut self) -> Result<PyEpoch, BoxError> {
        Python::attach(|py| -> PyResult<PyEpoch> {
            Ok(PyEpoch { iter: Some(self.source.bind(py).try_iter()?.into_any().unbind()) })
        })
        .map_err(Into::into)
    }

    fn deterministic_epoch_order(&self) -> bool {
        self.ordered
    }

    fn describe(&self) -> String {
        self.name.clone()
    }
}

/// One `iter(source)`: its items, then (once) the exception it raised, if it raised.
#[derive(Debug)]
struct PyEpoch {
    iter: Option<Py<PyAny>>,
}

impl Iterator for PyEpoch {
    type Item = PyResult<Py<PyAny>>;

    fn next(&mut self) -> Option<PyResult<Py<PyAny>>> {
        let iter = self.iter.as_ref()?;
        let out = Python::attach(|py| match iter.bind(py).call_method0("__next__") {
            Ok(v) => Some(Ok(v.unbind())),
            Err(e) if e.is_instance_of::<PyStopIteration>(py) => None,
            Err(e) => Some(Err(e)),
        });
        if !matches!(out, Some(Ok(_))) {
            self.iter = None;
        }
        out
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The text of a checkpoint error without its `checkpoint: ` prefix.
fn text(e: &CheckpointError) -> String {
    let s = spdl_report::error_chain(e);
    s.strip_prefix("checkpoint: ").map(str::to_owned).unwrap_or(s)
}

/// Keys as `(input, epoch, index)` tuples.
type Key = (u32, u64, u64);

fn keys(keys: &[Key]) -> Vec<ItemKey> {
    keys.iter().map(|&(input, epoch, index)| ItemKey { input, epoch, index }).collect()
}

/// Internal: the checkpoint of one pipeline (spdl-exec's): its inputs, what was delivered, what failed.
/// Every call that takes the checkpoint's lock runs without the GIL (a source's state is read under the
/// lock, with the GIL).
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct CheckpointTracker {
    checkpoint: Checkpoint,
    sources: Mutex<Vec<KeyedSource<PySource>>>,
}

impl CheckpointTracker {
    fn record_delivered(&self, py: Python<'_>, keys: &[Key]) {
        let keys = self::keys(keys);
        detach(py, || self.checkpoint.deliver(&keys));
    }

    /// Records `keys` as failed in `stage` with `exc` (as `"TypeName: message"`).
    fn record_failed(&self, py: Python<'_>, keys: &[Key], stage: &str, exc: &Bound<'_, PyAny>) {
        let cause = format!("{}: {}", type_name(exc), exc.str().map(|s| s.to_string()).unwrap_or_default());
        let keys = self::keys(keys);
        detach(py, || self.checkpoint.fail(&keys, stage, &cause));
    }

    fn load_json(&self, py: Python<'_>, state: &str) -> PyResult<()> {
        detach(py, || self.checkpoint.load_json(state)).map_err(|e| match e {
            CheckpointError::InputCount { saved, now } => {
                PyValueError::new_err(format!("the state has {saved} inputs, this pipeline has {now}"))
            }
            CheckpointError::Started => {
                PyRuntimeError::new_err("load_state_dict must be called before the pipeline starts")
            }
            other => PyValueError::new_err(text(&other)),
        })
    }
}

/// `obj`'s copy if it is a dict (`None` if not).
fn dict_copy<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyDict>>> {
    obj.cast::<PyDict>().ok().map(|d| d.copy()).transpose()
}

/// `obj[key] = f(obj[key])` for each item of the list `obj[key]` (nothing if it is not a list).
fn map_list<'py>(
    obj: &Bound<'py, PyDict>,
    key: &str,
    f: impl Fn(Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<()> {
    if let Some(list) = obj.get_item(key)?
        && let Ok(list) = list.cast::<PyList>()
    {
        let out = list.iter().map(f).collect::<PyResult<Vec<_>>>()?;
        obj.set_item(key, out)?;
    }
    Ok(())
}

/// `obj[key] = encode(obj[key])` if `obj` has `key`.
fn encode_item(obj: &Bound<'_, PyDict>, key: &str) -> PyResult<()> {
    if let Some(v) = obj.get_item(key)? {
        obj.set_item(key, encode(&v)?)?;
    }
    Ok(())
}

/// A state of the protocol's `dict` form as the engine's JSON text: the sources' states encoded, the
/// failures `[index, stage, cause]` as objects. What is not of the form is left for the engine to refuse.
fn state_to_json(state: &Bound<'_, PyDict>) -> PyResult<String> {
    let py = state.py();
    let out = state.copy()?;
    map_list(&out, "inputs", |inp| {
        let Some(inp) = dict_copy(&inp)? else { return Ok(inp) };
        encode_item(&inp, "next_source")?;
        map_list(&inp, "epochs", |e| {
            let Some(e) = dict_copy(&e)? else { return Ok(e) };
            encode_item(&e, "source")?;
            map_list(&e, "failures", |f| {
                let is_seq = f.is_instance_of::<PyList>() || f.is_instance_of::<PyTuple>();
                if !is_seq || f.len()? != 3 {
                    return Ok(f);
                }
                let d = PyDict::new(py);
                for (i, k) in ["index", "stage", "cause"].into_iter().enumerate() {
                    d.set_item(k, f.get_item(i)?)?;
                }
                Ok(d.into_any())
            })?;
            Ok(e.into_any())
        })?;
        Ok(inp.into_any())
    })?;
    py.import(intern!(py, "json"))?.call_method1(intern!(py, "dumps"), (out,))?.extract()
}

#[pymethods]
impl CheckpointTracker {
    #[new]
    fn new() -> Self {
        Self { checkpoint: Checkpoint::new(), sources: Mutex::new(Vec::new()) }
    }

    /// Registers `source` as the next input and returns its number; reads its state. A source whose
    /// epochs do not come again in the same order says so with a false `deterministic_epoch_order`.
    ///
    /// Raises:
    ///     RuntimeError: The source failed to report its state (or it cannot be pickled).
    fn add_input(&self, py: Python<'_>, source: Bound<'_, PyAny>) -> PyResult<u32> {
        let ordered = match source.getattr(intern!(py, "deterministic_epoch_order")) {
            Ok(v) => v.is_truthy()?,
            Err(e) if e.is_instance_of::<PyAttributeError>(py) => true,
            Err(e) => return Err(e),
        };
        let source = PySource { name: type_name(&source), source: source.unbind(), ordered };
        let keyed = detach(py, || self.checkpoint.input(source)).map_err(|e| PyRuntimeError::new_err(text(&e)))?;
        let mut sources = lock(&self.sources);
        sources.push(keyed);
        u32::try_from(sources.len() - 1).map_err(|_| PyValueError::new_err("too many inputs"))
    }

    /// Input `input` as a source: each `iter()` is one epoch of it, keyed.
    fn keyed_source(slf: Bound<'_, Self>, input: u32) -> CheckpointInput {
        CheckpointInput { tracker: slf.unbind(), input }
    }

    /// One epoch of input `input`, keyed, without what a loaded state says was delivered.
    fn epoch_items(&self, py: Python<'_>, input: u32) -> PyResult<CheckpointEpoch> {
        let source = lock(&self.sources)
            .get(input as usize)
            .cloned()
            .ok_or_else(|| PyValueError::new_err(format!("no input {input}")))?;
        let epoch = detach(py, move || source.into_iter());
        Ok(CheckpointEpoch { input, checkpoint: self.checkpoint.clone(), epoch: Mutex::new(epoch) })
    }

    /// Records `keys` (``(input, epoch, index)`` tuples) as delivered.
    fn deliver(&self, py: Python<'_>, keys: Vec<Key>) {
        self.record_delivered(py, &keys);
    }

    /// Records `keys` as failed in `stage` with the exception `exc` (they count as delivered).
    fn fail(&self, py: Python<'_>, keys: Vec<Key>, stage: &str, exc: Bound<'_, PyAny>) {
        self.record_failed(py, &keys, stage, &exc);
    }

    /// What the consumer gets: a keyed item's value (its keys recorded as delivered), or `value`.
    fn unwrap(&self, py: Python<'_>, value: Bound<'_, PyAny>) -> Py<PyAny> {
        match value.cast::<Keyed>() {
            Ok(k) => {
                let k = k.get();
                self.record_delivered(py, &k.keys);
                k.value.clone_ref(py)
            }
            Err(_) => value.unbind(),
        }
    }

    /// A batch of keyed items as one keyed item: a list of the values with every key.
    fn collate(&self, batch: &Bound<'_, PyAny>) -> PyResult<Keyed> {
        let py = batch.py();
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for item in batch.try_iter()? {
            let item = item?;
            let k = item.cast::<Keyed>()?.get();
            keys.extend_from_slice(&k.keys);
            values.push(k.value.clone_ref(py));
        }
        Ok(Keyed { keys, value: PyList::new(py, values)?.into_any().unbind() })
    }

    /// A keyed batch as its keyed items: one key each if the counts match, else the last item carries the
    /// keys (none: delivered now).
    fn split(&self, batch: &Bound<'_, Keyed>) -> PyResult<Vec<Keyed>> {
        let py = batch.py();
        let batch = batch.get();
        let values = batch.value.bind(py).try_iter()?.collect::<PyResult<Vec<_>>>()?;
        if batch.keys.len() == values.len() {
            return Ok(batch
                .keys
                .iter()
                .zip(values)
                .map(|(k, v)| Keyed { keys: vec![*k], value: v.unbind() })
                .collect());
        }
        if values.is_empty() {
            self.record_delivered(py, &batch.keys);
            return Ok(Vec::new());
        }
        let last = values.len() - 1;
        Ok(values
            .into_iter()
            .enumerate()
            .map(|(i, v)| Keyed { keys: if i == last { batch.keys.clone() } else { Vec::new() }, value: v.unbind() })
            .collect())
    }

    /// The state, in the `dict` form of the protocol (the sources' states as they reported them).
    ///
    /// Raises:
    ///     RuntimeError: A source failed to report its state, or the state of a source without a
    ///         deterministic epoch order was asked for in the middle of an epoch.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let json = detach(py, || self.checkpoint.state().and_then(|s| s.to_json()))
            .map_err(|e| PyRuntimeError::new_err(format!("this pipeline's state cannot be saved: {}", text(&e))))?;
        let state = py.import(intern!(py, "json"))?.call_method1(intern!(py, "loads"), (json,))?;
        for inp in state.get_item("inputs")?.try_iter()? {
            let inp = inp?;
            for e in inp.get_item("epochs")?.try_iter()? {
                let e = e?;
                e.set_item("source", decode(py, &e.get_item("source")?)?)?;
                let mut failures = Vec::new();
                for f in e.get_item("failures")?.try_iter()? {
                    let f = f?;
                    failures.push(vec![f.get_item("index")?, f.get_item("stage")?, f.get_item("cause")?]);
                }
                e.set_item("failures", failures)?;
            }
            inp.set_item("next_source", decode(py, &inp.get_item("next_source")?)?)?;
        }
        Ok(state)
    }

    /// Resumes from a :py:meth:`state_dict` (before any epoch begins).
    ///
    /// Raises:
    ///     ValueError: Not a state of this format, or of another number of inputs.
    ///     RuntimeError: An epoch has begun.
    fn load_state_dict(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let Ok(dict) = state.cast::<PyDict>() else {
            let shown: String = state.repr()?.to_string().chars().take(200).collect();
            return Err(PyValueError::new_err(format!("not a pipeline state of format version {VERSION}: {shown}")));
        };
        let text = state_to_json(dict).map_err(|e| {
            let shown = e.value(py).repr().map(|r| r.to_string()).unwrap_or_default();
            let err = PyValueError::new_err(format!("not a pipeline state of format version {VERSION}: {shown}"));
            err.set_cause(py, Some(e));
            err
        })?;
        self.load_json(py, &text)
    }
}

/// Internal: an input of a [`CheckpointTracker`] as a pipeline's source: each `iter()` is one epoch.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct CheckpointInput {
    tracker: Py<CheckpointTracker>,
    input: u32,
}

#[pymethods]
impl CheckpointInput {
    fn __iter__(&self, py: Python<'_>) -> PyResult<CheckpointEpoch> {
        self.tracker.get().epoch_items(py, self.input)
    }
}

/// Internal: an item in flight with the keys ``(input, epoch, index)`` of the source items it was made
/// from.
#[pyclass(module = "spdl_rs._native.pipeline", frozen, name = "Keyed")]
#[derive(Debug)]
pub struct Keyed {
    keys: Vec<Key>,
    value: Py<PyAny>,
}

#[pymethods]
impl Keyed {
    #[new]
    fn new(keys: Vec<Key>, value: Py<PyAny>) -> Self {
        Self { keys, value }
    }

    /// The keys, as ``(input, epoch, index)`` tuples.
    #[getter]
    fn keys(&self) -> Vec<Key> {
        self.keys.clone()
    }

    /// The item.
    #[getter]
    fn value(&self, py: Python<'_>) -> Py<PyAny> {
        self.value.clone_ref(py)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let keys = self.keys.clone().into_pyobject(py)?.repr()?.to_string();
        Ok(format!("_Keyed({keys}, {})", self.value.bind(py).repr()?))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.value)
    }
}

/// Internal: a sync op over keyed items: the keys follow its output, a failure is recorded against them, a
/// `None` output (no output) counts as delivered.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct KeyedOp {
    op: Py<PyAny>,
    stage: String,
    tracker: Py<CheckpointTracker>,
}

#[pymethods]
impl KeyedOp {
    #[new]
    fn new(op: Py<PyAny>, stage: String, tracker: Py<CheckpointTracker>) -> Self {
        Self { op, stage, tracker }
    }

    fn __call__(&self, py: Python<'_>, item: &Bound<'_, Keyed>) -> PyResult<Option<Keyed>> {
        let item = item.get();
        match self.op.bind(py).call1((item.value.clone_ref(py),)) {
            Err(e) => {
                self.tracker.get().record_failed(py, &item.keys, &self.stage, e.value(py).as_any());
                Err(e)
            }
            Ok(out) if out.is_none() => {
                self.tracker.get().record_delivered(py, &item.keys);
                Ok(None)
            }
            Ok(out) => Ok(Some(Keyed { keys: item.keys.clone(), value: out.unbind() })),
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.op)
    }
}

/// Internal: a custom aggregator (or `drop_last`) over keyed items: an output carries the keys of every
/// item accumulated since the previous output; what `drop_last` discards counts as delivered.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct KeyedAggregator {
    inner: Py<PyAny>,
    drop_last: bool,
    tracker: Py<CheckpointTracker>,
    /// The stage's name (what the engine names the step by).
    #[pyo3(get)]
    name: String,
    keys: Mutex<Vec<Key>>,
}

#[pymethods]
impl KeyedAggregator {
    #[new]
    fn new(inner: Py<PyAny>, drop_last: bool, tracker: Py<CheckpointTracker>, name: String) -> Self {
        Self { inner, drop_last, tracker, name, keys: Mutex::new(Vec::new()) }
    }

    fn accumulate(&self, py: Python<'_>, item: &Bound<'_, Keyed>) -> PyResult<Option<Keyed>> {
        let item = item.get();
        lock(&self.keys).extend_from_slice(&item.keys);
        let out = self.inner.bind(py).call_method1(intern!(py, "accumulate"), (item.value.clone_ref(py),));
        match out {
            Err(e) => {
                let keys = std::mem::take(&mut *lock(&self.keys));
                self.tracker.get().record_failed(py, &keys, &self.name, e.value(py).as_any());
                Err(e)
            }
            Ok(out) if out.is_none() => Ok(None),
            Ok(out) => Ok(Some(Keyed { keys: std::mem::take(&mut *lock(&self.keys)), value: out.unbind() })),
        }
    }

    fn flush(&self, py: Python<'_>) -> PyResult<Option<Keyed>> {
        let keys = std::mem::take(&mut *lock(&self.keys));
        let out = self.inner.bind(py).call_method0(intern!(py, "flush"))?;
        if out.is_none() || self.drop_last {
            self.tracker.get().record_delivered(py, &keys);
            return Ok(None);
        }
        Ok(Some(Keyed { keys, value: out.unbind() }))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.inner)
    }
}

/// Internal: one epoch of a checkpointed input, as [`Keyed`] items. Iterating runs the
/// checkpoint without the GIL and the source with it.
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct CheckpointEpoch {
    input: u32,
    checkpoint: Checkpoint,
    epoch: Mutex<KeyedEpoch<PySource>>,
}

#[pymethods]
impl CheckpointEpoch {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Keyed>> {
        match detach(py, || lock(&self.epoch).next()) {
            Some(keyed) => {
                let key = keyed.keys().first().copied();
                let value = keyed.into_value()?;
                let key = key.ok_or_else(|| PyRuntimeError::new_err("a source item without its key"))?;
                Ok(Some(Keyed { keys: vec![(key.input, key.epoch, key.index)], value }))
            }
            None => match detach(py, || self.checkpoint.input_error(self.input)) {
                Some(e) => Err(PyRuntimeError::new_err(text(&e))),
                None => Ok(None),
            },
        }
    }
}
