//! `spdl_rs.source.ElasticSampler`: spdl-source's elastic ranks (canonical-partition epoch order, equal
//! shares, progress that resumes at another world size) as a checkpointable pipeline source.

use std::sync::{Mutex, PoisonError};

use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use spdl_source::sampler::{
    CanonicalOrder, ElasticShard, EpochProgress, Remainder, Sampler, Shard, Spans, batches_per_rank, per_rank,
};

use crate::args::{self, Int};

fn err(e: impl std::error::Error) -> PyErr {
    PyValueError::new_err(spdl_report::error_chain(&e))
}

/// One rank's share of a dataset's epochs, the same order for every world size.
///
/// The epoch's order is defined over ``num_partitions`` canonical partitions (shuffled by ``(seed, epoch)``
/// when ``shuffle``); what has been delivered anywhere is kept as position spans. Rank ``rank`` of
/// ``world_size`` takes every ``world_size``-th remaining position, padded (or, with ``drop_remainder``,
/// cut) so that every rank gets the same count. Iterating yields one epoch of sample indices and moves
/// to the next epoch. ``state_dict``/``load_state_dict`` make a pipeline over it checkpointable, and
/// :py:func:`spdl_rs.source.merge_rank_states` turns the ranks' pipeline states into one that resumes at
/// any world size.
#[pyclass(name = "ElasticSampler", module = "spdl_rs.source", frozen)]
#[derive(Debug)]
pub struct PyElasticSampler {
    shard: ElasticShard,
    drop_remainder: bool,
    seed: u64,
    progress: Mutex<EpochProgress>,
}

impl PyElasticSampler {
    fn progress(&self) -> EpochProgress {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

fn spans_to_py<'py>(py: Python<'py>, spans: &Spans) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, spans.pairs().iter().map(|&(s, e)| vec![s, e]))
}

/// Spans from a sequence of ``[start, end]`` pairs (lists or tuples).
fn spans_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Spans> {
    let mut pairs = Vec::new();
    for pair in obj.try_iter()? {
        let pair: Vec<u64> = pair?.extract()?;
        match pair[..] {
            [s, e] => pairs.push((s, e)),
            _ => return Err(PyValueError::new_err(format!("a span is [start, end], got {pair:?}"))),
        }
    }
    Spans::from_pairs(pairs).map_err(err)
}

fn get<'py>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<Bound<'py, PyAny>> {
    d.get_item(key)?.ok_or_else(|| PyKeyError::new_err(format!("ElasticSampler state: no `{key}`")))
}

#[pymethods]
impl PyElasticSampler {
    #[new]
    #[pyo3(signature = (n, /, *, rank, world_size, seed=0, shuffle=true, num_partitions=Int::from(64), drop_remainder=false))]
    fn new(
        n: Int,
        rank: Int,
        world_size: Int,
        seed: u64,
        shuffle: bool,
        num_partitions: Int,
        drop_remainder: bool,
    ) -> PyResult<Self> {
        let n = args::count("n", &n, 0, args::MAX_ITEMS)?;
        let world_size = args::count("world_size", &world_size, 1, args::MAX_WORLD_SIZE)?;
        let rank = args::count("rank", &rank, 0, world_size as u64 - 1)?;
        // Capped by the dataset's size (with a floor for small datasets): a shuffle permutes every partition.
        let max_parts = CanonicalOrder::max_partitions(n) as u64;
        let num_partitions = args::count("num_partitions", &num_partitions, 1, max_parts)?;
        let order = CanonicalOrder::new(n, num_partitions, seed, shuffle).map_err(err)?;
        let shard = Shard::new(rank, world_size).map_err(err)?;
        let remainder = if drop_remainder { Remainder::Drop } else { Remainder::Pad };
        Ok(Self {
            shard: ElasticShard::new(order, shard, remainder),
            drop_remainder,
            seed,
            progress: Mutex::new(EpochProgress::new(0)),
        })
    }

    /// Yields this rank's sample indices for the current epoch (what remains of it), and moves to the
    /// next epoch.
    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let indices = {
            let mut p = self.progress.lock().unwrap_or_else(PoisonError::into_inner);
            let indices = crate::lifecycle::detach(py, || self.shard.indices(&p)).map_err(err)?;
            *p = EpochProgress::new(p.epoch + 1);
            indices
        };
        Ok(PyList::new(py, indices)?.try_iter()?.into_any())
    }

    /// Indices the next iteration yields (the same on every rank).
    fn __len__(&self) -> usize {
        let p = self.progress();
        let remaining = self.shard.order().len() as u64 - p.done.count();
        per_rank(remaining, self.shard.shard().world_size, self.remainder()) as usize
    }

    /// Batches of ``batch_size`` the next iteration makes on every rank (``drop_last``: a short last batch
    /// is dropped).
    #[pyo3(signature = (batch_size, *, drop_last=false))]
    fn num_batches(&self, batch_size: Int, drop_last: bool) -> PyResult<u64> {
        let batch_size = args::count("batch_size", &batch_size, 1, args::MAX_ITEMS)?;
        Ok(batches_per_rank(self.__len__() as u64, batch_size, drop_last))
    }

    /// The epoch the next iteration yields.
    #[getter]
    fn epoch(&self) -> u64 {
        self.progress().epoch
    }

    /// Moves to the start of ``epoch`` (nothing of it delivered).
    fn set_epoch(&self, epoch: u64) {
        *self.progress.lock().unwrap_or_else(PoisonError::into_inner) = EpochProgress::new(epoch);
    }

    /// The state from which the next iteration starts: the epoch, the positions of its order delivered
    /// anywhere, and the configuration (checked on load; ``rank`` and ``world_size`` are recorded for
    /// :py:func:`~spdl_rs.source.merge_rank_states` and not restored).
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let p = self.progress();
        let d = PyDict::new(py);
        d.set_item("epoch", p.epoch)?;
        d.set_item("done", spans_to_py(py, &p.done)?)?;
        d.set_item("n", self.shard.order().len())?;
        d.set_item("seed", self.seed)?;
        d.set_item("shuffle", self.shard.order().shuffle())?;
        d.set_item("num_partitions", self.shard.order().partitions())?;
        d.set_item("rank", self.shard.shard().rank)?;
        d.set_item("world_size", self.shard.shard().world_size)?;
        d.set_item("drop_remainder", self.drop_remainder)?;
        Ok(d)
    }

    /// Restores a state from :py:meth:`state_dict` (from any rank and world size of the same dataset order).
    fn load_state_dict(&self, state: &Bound<'_, PyDict>) -> PyResult<()> {
        let progress = self.check(state)?;
        *self.progress.lock().unwrap_or_else(PoisonError::into_inner) = progress;
        Ok(())
    }

    /// The progress after ranks delivered parts of their shares: ``start`` is the sampler state every rank
    /// started the epoch from (its ``world_size`` and ``drop_remainder`` are those of the run that
    /// delivered), ``delivered`` holds ``(rank, [[start, end], ...])``: positions in that rank's share.
    /// Returns ``start`` with ``done`` grown; valid for any world size.
    #[staticmethod]
    fn merge_progress<'py>(
        py: Python<'py>,
        start: &Bound<'py, PyDict>,
        delivered: Vec<(usize, Bound<'py, PyAny>)>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let n: usize = get(start, "n")?.extract()?;
        let order = CanonicalOrder::new(
            n,
            get(start, "num_partitions")?.extract()?,
            get(start, "seed")?.extract()?,
            get(start, "shuffle")?.extract()?,
        )
        .map_err(err)?;
        let world_size: usize = get(start, "world_size")?.extract()?;
        let remainder = if get(start, "drop_remainder")?.extract()? { Remainder::Drop } else { Remainder::Pad };
        let progress =
            EpochProgress { epoch: get(start, "epoch")?.extract()?, done: spans_from_py(&get(start, "done")?)? };
        let delivered: Vec<(usize, Spans)> =
            delivered.iter().map(|(r, s)| Ok((*r, spans_from_py(s)?))).collect::<PyResult<_>>()?;
        let shard = ElasticShard::new(order, Shard::new(0, world_size).map_err(err)?, remainder);
        let merged = crate::lifecycle::detach(py, || shard.merge(&progress, &delivered)).map_err(err)?;
        let out = start.copy()?;
        out.set_item("done", spans_to_py(py, &merged.done)?)?;
        Ok(out)
    }

    fn __repr__(&self) -> String {
        let o = self.shard.order();
        format!(
            "spdl_rs.source.ElasticSampler({}, rank={}, world_size={}, seed={}, shuffle={}, num_partitions={}, drop_remainder={})",
            o.len(),
            self.shard.shard().rank,
            self.shard.shard().world_size,
            self.seed,
            if o.shuffle() { "True" } else { "False" },
            o.partitions(),
            if self.drop_remainder { "True" } else { "False" },
        )
    }
}

impl PyElasticSampler {
    fn remainder(&self) -> Remainder {
        if self.drop_remainder { Remainder::Drop } else { Remainder::Pad }
    }

    /// The progress in `state`, checked against this sampler's order.
    fn check(&self, state: &Bound<'_, PyDict>) -> PyResult<EpochProgress> {
        let o = self.shard.order();
        let n: usize = get(state, "n")?.extract()?;
        let seed: u64 = get(state, "seed")?.extract()?;
        let shuffle: bool = get(state, "shuffle")?.extract()?;
        let parts: usize = get(state, "num_partitions")?.extract()?;
        if (n, seed, shuffle, parts) != (o.len(), self.seed, o.shuffle(), o.partitions()) {
            return Err(PyValueError::new_err(format!(
                "ElasticSampler state is for another order: (n, seed, shuffle, num_partitions) = ({n}, {seed}, {shuffle}, {parts}), this sampler has ({}, {}, {}, {})",
                o.len(),
                self.seed,
                o.shuffle(),
                o.partitions()
            )));
        }
        let done = spans_from_py(&get(state, "done")?)?;
        if done.pairs().last().is_some_and(|&(_, e)| e > n as u64) {
            return Err(PyValueError::new_err(format!("ElasticSampler state: a delivered position is past {n}")));
        }
        Ok(EpochProgress { epoch: get(state, "epoch")?.extract()?, done })
    }
}
