//! `spdl_rs.source`: spdl-source's samplers and dataset listings for Python.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use spdl_source::sampler::{Remainder, Sampler, SequentialSampler, ShardedSampler, ShuffledSampler, WeightedSampler};
use spdl_source::{Dataset, SourceError};

fn source_err(e: SourceError) -> PyErr {
    let msg = crate::error::error_chain(&e);
    if matches!(e, SourceError::Io { .. }) { PyOSError::new_err(msg) } else { PyValueError::new_err(msg) }
}

/// A deterministic order of indices per epoch: the same (configuration, epoch) gives the same order on
/// every machine, so every rank of a distributed job agrees and a run resumes exactly.
///
/// Make one with :py:meth:`sequential`, :py:meth:`shuffled` or :py:meth:`weighted`; take one rank's share
/// with :py:meth:`sharded`. Use it as a pipeline source: ``builder.add_source(sampler.order(epoch))``.
#[pyclass(name = "Sampler", module = "spdl_rs.source", frozen)]
pub struct PySampler {
    inner: Arc<dyn Sampler>,
    describe: String,
}

impl std::fmt::Debug for PySampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PySampler").field("describe", &self.describe).finish_non_exhaustive()
    }
}

#[pymethods]
impl PySampler {
    /// ``0, 1, ..., n - 1`` every epoch.
    #[staticmethod]
    fn sequential(n: usize) -> Self {
        Self { inner: Arc::new(SequentialSampler::new(n)), describe: format!("sequential({n})") }
    }

    /// A permutation of ``0..n`` derived from ``(seed, epoch)`` (ChaCha8, portable).
    #[staticmethod]
    fn shuffled(n: usize, seed: u64) -> Self {
        Self { inner: Arc::new(ShuffledSampler::new(n, seed)), describe: format!("shuffled({n}, seed={seed})") }
    }

    /// ``num_samples`` indices drawn with replacement, index ``i`` with probability proportional to
    /// ``weights[i]``.
    #[staticmethod]
    fn weighted(weights: Vec<f64>, num_samples: usize, seed: u64) -> PyResult<Self> {
        let n = weights.len();
        let s = WeightedSampler::new(weights, num_samples, seed).map_err(source_err)?;
        Ok(Self { inner: Arc::new(s), describe: format!("weighted({n} weights, {num_samples}, seed={seed})") })
    }

    /// This sampler's share for ``rank`` of ``world_size``: every ``world_size``-th index of the epoch's
    /// order. ``drop_remainder``: drop the last ``len % world_size`` indices instead of padding.
    #[pyo3(signature = (rank, world_size, *, drop_remainder=false))]
    fn sharded(&self, rank: usize, world_size: usize, drop_remainder: bool) -> PyResult<Self> {
        let remainder = if drop_remainder { Remainder::Drop } else { Remainder::Pad };
        let s = ShardedSampler::new(Arc::clone(&self.inner), rank, world_size, remainder).map_err(source_err)?;
        Ok(Self { inner: Arc::new(s), describe: format!("{}.sharded({rank}, {world_size})", self.describe) })
    }

    /// The indices of ``epoch``, in order.
    #[pyo3(signature = (epoch=0))]
    fn order(&self, py: Python<'_>, epoch: u64) -> Vec<usize> {
        py.detach(|| self.inner.order(epoch))
    }

    /// The seed the order derives from (0 for samplers that do not shuffle).
    #[getter]
    fn seed(&self) -> u64 {
        self.inner.seed()
    }

    /// Indices per epoch.
    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __repr__(&self) -> String {
        format!("spdl_rs.source.Sampler.{}", self.describe)
    }
}

/// `(keys, labels, classes)`.
type Listing = (Vec<String>, Vec<Option<i64>>, Vec<String>);

/// Lists a dataset directory: ``(keys, labels, classes)`` with keys sorted.
///
/// ``layout="class_folders"`` (ImageNet style, ``root/CLASS/file``): labels index ``classes``;
/// ``layout="flat"``: every matching file, labels all ``None``. ``extensions`` filters by suffix (case
/// insensitive, without the dot); empty means every file.
#[pyfunction]
#[pyo3(signature = (root, *, extensions=Vec::new(), layout="class_folders"))]
fn list_dataset(py: Python<'_>, root: PathBuf, extensions: Vec<String>, layout: &str) -> PyResult<Listing> {
    let exts: Vec<&str> = extensions.iter().map(String::as_str).collect();
    let ds = py
        .detach(|| match layout {
            "class_folders" => Ok(Dataset::image_folder(&root, &exts)),
            "flat" => Ok(Dataset::from_dir(&root, &exts)),
            other => Err(other.to_owned()),
        })
        .map_err(|other| PyValueError::new_err(format!("layout must be \"class_folders\" or \"flat\", got {other:?}")))?
        .map_err(source_err)?;
    let keys = ds.records().iter().map(|r| r.key.clone()).collect();
    let labels = ds.records().iter().map(|r| r.label).collect();
    Ok((keys, labels, ds.classes().to_vec()))
}

/// Registers the source classes and functions on the native module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySampler>()?;
    m.add_function(wrap_pyfunction!(list_dataset, m)?)?;
    Ok(())
}
