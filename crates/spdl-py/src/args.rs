//! The checks of counts, sizes and durations that Python gives the native module: one helper per kind, one
//! message (`num_threads must be between 1 and 1024, got 1000000000`), a `ValueError` for every value out of
//! range (negative, zero where it must not be, huge, NaN), never an `OverflowError`, an abort or a runaway
//! allocation. Nothing is preallocated from an argument before it passed here.
//!
//! The same checks are exposed to the Python package (`_native._check_count`, `_check_size`,
//! `_check_duration` and the caps in `_native.ARG_LIMITS`), so that the Python-level APIs (the pipeline
//! builder, `DataLoader`, samplers) refuse the same values with the same words.

use std::time::Duration;

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt};

/// Threads of a pool (a pipeline's, a decoder's, a loader's).
pub(crate) const MAX_THREADS: u64 = 1024;
/// Calls or requests in flight at once (a stage's concurrency, a store's requests).
pub(crate) const MAX_CONCURRENCY: u64 = 4096;
/// Items in one batch.
pub(crate) const MAX_BATCH: u64 = 65_536;
/// Slots of a queue or buffer (queues allocate as they fill: a large one costs nothing until it holds items).
pub(crate) const MAX_QUEUE: u64 = 1 << 48;
/// Canonical partitions of an elastic sampler, when the dataset has fewer samples (above it, up to the
/// dataset's size).
pub(crate) const MAX_PARTITIONS_FLOOR: u64 = 1 << 16;
/// Frames or packets asked of one decode or one streaming chunk.
pub(crate) const MAX_FRAMES: u64 = 1 << 24;
/// A dataset's length, the number of draws of a sampler (spdl-source's `MAX_ORDER_LEN`).
pub(crate) const MAX_ITEMS: u64 = 1 << 31;
/// Ranks of a distributed job.
pub(crate) const MAX_WORLD_SIZE: u64 = 1 << 20;
/// Epochs of a loader.
pub(crate) const MAX_EPOCHS: u64 = 1 << 20;
/// Output width or height of an image, in pixels.
pub(crate) const MAX_SIDE: u64 = 65_535;
/// A byte size (an object's, a budget's): 1 TiB.
pub(crate) const MAX_BYTES: u64 = 1 << 40;
/// Attempts of a request.
pub(crate) const MAX_ATTEMPTS: u64 = 1000;
/// A timeout or interval: one year, in seconds.
pub(crate) const MAX_SECONDS: f64 = 365.0 * 86_400.0;

/// A Python `int` of any size: extracting one never fails on its value (`-1`, `2**100`), so that the
/// range check, not PyO3's `OverflowError`, decides. `shown` keeps the text of a value beyond `i128`.
#[derive(Debug, Clone)]
pub(crate) struct Int {
    value: i128,
    shown: Option<String>,
}

impl Int {
    /// The value (saturated to `i128` for a larger one).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code, reason = "read by the `cuda` feature's functions only"))]
    pub(crate) fn value(&self) -> i128 {
        self.value
    }

    /// The value as Python shows it.
    pub(crate) fn show(&self) -> String {
        self.shown.clone().unwrap_or_else(|| self.value.to_string())
    }
}

impl From<i128> for Int {
    fn from(value: i128) -> Self {
        Int { value, shown: None }
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Int {
    type Error = PyErr;
    const INPUT_TYPE: pyo3::inspect::PyStaticExpr = <PyInt as pyo3::PyTypeInfo>::TYPE_HINT;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        // `bool` is an `int` in Python: taken as 0 / 1, as PyO3 does for integers.
        if obj.is_instance_of::<PyFloat>() {
            return Err(PyTypeError::new_err(format!("expected an integer, got the float {}", obj.str()?)));
        }
        match obj.extract::<i128>() {
            Ok(value) => Ok(Int { value, shown: None }),
            Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
                let negative = obj.lt(0)?;
                Ok(Int { value: if negative { i128::MIN } else { i128::MAX }, shown: Some(obj.str()?.to_string()) })
            }
            Err(e) => Err(e),
        }
    }
}

/// The one message: `{name} must be between {min} and {max}, got {got}`.
pub(crate) fn out_of_range(name: &str, min: impl std::fmt::Display, max: impl std::fmt::Display, got: &str) -> PyErr {
    PyValueError::new_err(format!("{name} must be between {min} and {max}, got {got}"))
}

/// A count (threads, items, partitions...) in `min..=max`.
pub(crate) fn count(name: &str, v: &Int, min: u64, max: u64) -> PyResult<usize> {
    let max = max.min(usize::MAX as u64);
    if v.value < i128::from(min) || v.value > i128::from(max) {
        return Err(out_of_range(name, min, max, &v.show()));
    }
    Ok(v.value as usize)
}

/// An optional count: `None` stays `None`.
pub(crate) fn opt_count(name: &str, v: Option<&Int>, min: u64, max: u64) -> PyResult<Option<usize>> {
    v.map(|v| count(name, v, min, max)).transpose()
}

/// A size in bytes in `min..=max`.
pub(crate) fn size_bytes(name: &str, v: &Int, min: u64, max: u64) -> PyResult<u64> {
    if v.value < i128::from(min) || v.value > i128::from(max) {
        return Err(out_of_range(name, min, max, &v.show()));
    }
    Ok(v.value as u64)
}

/// An integer in `min..=max` that is neither a count nor a size (a rank, a frame number...).
pub(crate) fn int_in(name: &str, v: &Int, min: i64, max: i64) -> PyResult<i64> {
    if v.value < i128::from(min) || v.value > i128::from(max) {
        return Err(out_of_range(name, min, max, &v.show()));
    }
    Ok(v.value as i64)
}

/// A duration in seconds in `min..=max` (NaN is refused).
pub(crate) fn duration_secs(name: &str, v: f64, min: f64, max: f64) -> PyResult<Duration> {
    if v.is_nan() || v < min || v > max {
        return Err(out_of_range(name, min, max, &v.to_string()));
    }
    // `inf` (where `max` allows it) and values past `Duration`'s range wait forever.
    Ok(Duration::try_from_secs_f64(v).unwrap_or(Duration::MAX))
}

/// `_native._check_count(name, value, min, max)`: `value` if it is an integer in `min..=max`, else the
/// module's `ValueError` (a `TypeError` for a non-integer).
#[pyfunction]
pub(crate) fn _check_count(name: &str, value: Int, min: Int, max: Int) -> PyResult<u64> {
    let min = size_bytes("min", &min, 0, u64::MAX)?;
    let max = size_bytes("max", &max, 0, u64::MAX)?;
    size_bytes(name, &value, min, max)
}

/// `_native._check_size(name, value, min, max)`: as `_check_count`, for byte sizes.
#[pyfunction]
pub(crate) fn _check_size(name: &str, value: Int, min: Int, max: Int) -> PyResult<u64> {
    _check_count(name, value, min, max)
}

/// Whether `value` is an `int` and not a `bool` (which Python counts as one).
pub(crate) fn is_plain_int(value: &Bound<'_, PyAny>) -> bool {
    value.is_instance_of::<PyInt>() && !value.is_instance_of::<PyBool>()
}

/// The largest queue or buffer size a pipeline option takes (`2**48`): past any memory, below any overflow.
pub(crate) const MAX_PIPELINE_SIZE: u64 = 1 << 48;

/// A pipeline's size option (`buffer_size`, `stage_buffer_size`, `max_memory_bytes`): an `int` (not a `bool`)
/// in `minimum..=2**48`, else a `ValueError` that says SPDL's words first where SPDL has them ("must be
/// greater than 0", for a value below the minimum). The one check of these options, at the boundary:
/// `CoreOptions` and the builder's `add_sink` call it.
pub(crate) fn pipeline_size(name: &str, value: &Bound<'_, PyAny>, minimum: u64) -> PyResult<u64> {
    let shown = || value.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".to_owned());
    let int = if is_plain_int(value) { value.extract::<i128>().ok() } else { None };
    match int {
        Some(v) if v >= i128::from(minimum) && v <= i128::from(MAX_PIPELINE_SIZE) => Ok(v as u64),
        Some(v) if v < i128::from(minimum) => {
            let zero = if minimum == 0 { " (0 is taken too: a large one)" } else { "" };
            Err(PyValueError::new_err(format!("`{name}` must be greater than 0. Found: {v}{zero}")))
        }
        _ => Err(PyValueError::new_err(format!("{name} must be an integer in [{minimum}, 2**48], got {}", shown()))),
    }
}

/// `_native._check_pipeline_size(name, value, minimum)`: [`pipeline_size`] for the Python builder.
#[pyfunction]
#[pyo3(signature = (name, value: "int", minimum))]
pub(crate) fn _check_pipeline_size(name: &str, value: &Bound<'_, PyAny>, minimum: u64) -> PyResult<u64> {
    pipeline_size(name, value, minimum)
}

/// `_native._check_duration(name, value, min, max)`: `value` (seconds, an int or a float) if it is in
/// `min..=max` and not NaN.
#[pyfunction]
pub(crate) fn _check_duration(name: &str, value: &Bound<'_, PyAny>, min: f64, max: f64) -> PyResult<f64> {
    if !(value.is_instance_of::<PyFloat>() || value.is_instance_of::<PyInt>()) {
        return Err(PyTypeError::new_err(format!(
            "{name} must be a number of seconds, got {}",
            value.get_type().name()?
        )));
    }
    let v: f64 = value.extract()?;
    duration_secs(name, v, min, max)?;
    Ok(v)
}

/// Adds `ARG_LIMITS` (the caps by name) to the native module.
pub(crate) fn add_limits(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let d = PyDict::new(m.py());
    d.set_item("threads", MAX_THREADS)?;
    d.set_item("concurrency", MAX_CONCURRENCY)?;
    d.set_item("batch", MAX_BATCH)?;
    d.set_item("queue", MAX_QUEUE)?;
    d.set_item("partitions_floor", MAX_PARTITIONS_FLOOR)?;
    d.set_item("frames", MAX_FRAMES)?;
    d.set_item("items", MAX_ITEMS)?;
    d.set_item("world_size", MAX_WORLD_SIZE)?;
    d.set_item("epochs", MAX_EPOCHS)?;
    d.set_item("side", MAX_SIDE)?;
    d.set_item("bytes", MAX_BYTES)?;
    d.set_item("attempts", MAX_ATTEMPTS)?;
    d.set_item("seconds", MAX_SECONDS)?;
    m.add("ARG_LIMITS", d)?;
    Ok(())
}
