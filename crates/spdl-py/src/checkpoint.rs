//! `spdl_rs._native.pipeline.CheckpointTracker`: spdl-checkpoint's whole-pipeline checkpoint
//! ([`spdl_checkpoint::Checkpoint`]) over Python sources that implement the torchdata `Stateful`
//! protocol (`state_dict()`/`load_state_dict()`). The engine keeps the log (epochs, watermarks, delivered
//! spans, failures), enumerates each epoch and skips what a loaded state says was delivered; the Python
//! layer (`spdl_rs.pipeline._checkpoint`) carries the keys through its steps and turns the sources'
//! states, which Rust cannot see, into text with the `encode`/`decode` functions it gives here.

use std::sync::{Mutex, PoisonError};

use pyo3::exceptions::{PyRuntimeError, PyStopIteration, PyValueError};
use pyo3::prelude::*;
use spdl_checkpoint::{Checkpoint, CheckpointError, CheckpointSource, ItemKey, KeyedEpoch, KeyedSource};
use spdl_exec::BoxError;

use crate::lifecycle::detach;

/// A Python `Stateful` source as a [`CheckpointSource`]: its state is `encode(source.state_dict())`, a
/// JSON string; an epoch is `iter(source)`.
#[derive(Debug)]
struct PySource {
    source: Py<PyAny>,
    encode: Py<PyAny>,
    decode: Py<PyAny>,
    ordered: bool,
    name: String,
}

impl CheckpointSource for PySource {
    type Item = PyResult<Py<PyAny>>;
    type Epoch = PyEpoch;

    fn state(&self) -> Result<serde_json::Value, BoxError> {
        Python::attach(|py| -> PyResult<String> {
            let state = self.source.bind(py).call_method0("state_dict")?;
            self.encode.bind(py).call1((state,))?.extract()
        })
        .map(serde_json::Value::String)
        .map_err(Into::into)
    }

    fn load_state(&mut self, state: &serde_json::Value) -> Result<(), BoxError> {
        let text = state.as_str().ok_or("a source's state is the text its encoder made")?;
        Python::attach(|py| -> PyResult<()> {
            let state = self.decode.bind(py).call1((text,))?;
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

/// A source item with its key: `(input, epoch, index, item)`.
type KeyedItem = (u32, u64, u64, Py<PyAny>);

fn keys(keys: Vec<Key>) -> Vec<ItemKey> {
    keys.into_iter().map(|(input, epoch, index)| ItemKey { input, epoch, index }).collect()
}

/// Internal: the checkpoint of one pipeline (spdl-exec's): its inputs, what was delivered, what failed.
/// Every call that takes the checkpoint's lock runs without the GIL (a source's state is read under the
/// lock, with the GIL).
#[pyclass(module = "spdl_rs._native.pipeline", frozen)]
#[derive(Debug)]
pub struct CheckpointTracker {
    checkpoint: Checkpoint,
    encode: Py<PyAny>,
    decode: Py<PyAny>,
    sources: Mutex<Vec<KeyedSource<PySource>>>,
}

#[pymethods]
impl CheckpointTracker {
    #[new]
    fn new(encode: Py<PyAny>, decode: Py<PyAny>) -> Self {
        Self { checkpoint: Checkpoint::new(), encode, decode, sources: Mutex::new(Vec::new()) }
    }

    /// Registers `source` as the next input and returns its number; reads its state.
    ///
    /// Raises:
    ///     RuntimeError: The source failed to report its state.
    #[pyo3(signature = (source, *, deterministic_epoch_order, name))]
    fn add_input(
        &self,
        py: Python<'_>,
        source: Py<PyAny>,
        deterministic_epoch_order: bool,
        name: String,
    ) -> PyResult<u32> {
        let source = PySource {
            source,
            encode: self.encode.clone_ref(py),
            decode: self.decode.clone_ref(py),
            ordered: deterministic_epoch_order,
            name,
        };
        let keyed = detach(py, || self.checkpoint.input(source)).map_err(|e| PyRuntimeError::new_err(text(&e)))?;
        let mut sources = lock(&self.sources);
        sources.push(keyed);
        u32::try_from(sources.len() - 1).map_err(|_| PyValueError::new_err("too many inputs"))
    }

    /// One epoch of input `input`, without what a loaded state says was delivered.
    fn epoch(&self, py: Python<'_>, input: u32) -> PyResult<CheckpointEpoch> {
        let source = lock(&self.sources)
            .get(input as usize)
            .cloned()
            .ok_or_else(|| PyValueError::new_err(format!("no input {input}")))?;
        let epoch = detach(py, move || source.into_iter());
        Ok(CheckpointEpoch { input, checkpoint: self.checkpoint.clone(), epoch: Mutex::new(epoch) })
    }

    /// Records `keys` (``(input, epoch, index)`` tuples) as delivered.
    fn deliver(&self, py: Python<'_>, keys: Vec<Key>) {
        let keys = self::keys(keys);
        detach(py, || self.checkpoint.deliver(&keys));
    }

    /// Records `keys` as failed in `stage` with `cause` (they count as delivered).
    fn fail(&self, py: Python<'_>, keys: Vec<Key>, stage: &str, cause: &str) {
        let keys = self::keys(keys);
        detach(py, || self.checkpoint.fail(&keys, stage, cause));
    }

    /// The state as JSON text (the sources' states as their encoder's text).
    ///
    /// Raises:
    ///     RuntimeError: A source failed to report its state, or the state of a source without a
    ///         deterministic epoch order was asked for in the middle of an epoch.
    fn state_json(&self, py: Python<'_>) -> PyResult<String> {
        detach(py, || self.checkpoint.state().and_then(|s| s.to_json()))
            .map_err(|e| PyRuntimeError::new_err(format!("this pipeline's state cannot be saved: {}", text(&e))))
    }

    /// Resumes from a state's JSON text (before any epoch begins).
    ///
    /// Raises:
    ///     ValueError: Not a state of this format, or of another number of inputs.
    ///     RuntimeError: An epoch has begun.
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

/// Internal: one epoch of a checkpointed input: ``(input, epoch, index, item)`` tuples. Iterating runs the
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

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<KeyedItem>> {
        match detach(py, || lock(&self.epoch).next()) {
            Some(keyed) => {
                let key = keyed.keys().first().copied();
                let value = keyed.into_value()?;
                let key = key.ok_or_else(|| PyRuntimeError::new_err("a source item without its key"))?;
                Ok(Some((key.input, key.epoch, key.index, value)))
            }
            None => match detach(py, || self.checkpoint.input_error(self.input)) {
                Some(e) => Err(PyRuntimeError::new_err(text(&e))),
                None => Ok(None),
            },
        }
    }
}
