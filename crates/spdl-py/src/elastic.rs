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
        let delivered: Vec<(usize, Spans)> =
            delivered.iter().map(|(r, s)| Ok((*r, spans_from_py(s)?))).collect::<PyResult<_>>()?;
        merge_progress(py, start, &delivered)
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

/// [`PyElasticSampler::merge_progress`] on spans already read.
fn merge_progress<'py>(
    py: Python<'py>,
    start: &Bound<'py, PyDict>,
    delivered: &[(usize, Spans)],
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
    let progress = EpochProgress { epoch: get(start, "epoch")?.extract()?, done: spans_from_py(&get(start, "done")?)? };
    let shard = ElasticShard::new(order, Shard::new(0, world_size).map_err(err)?, remainder);
    let merged = crate::lifecycle::detach(py, || shard.merge(&progress, delivered)).map_err(err)?;
    let out = start.copy()?;
    out.set_item("done", spans_to_py(py, &merged.done)?)?;
    Ok(out)
}

/// The positions of its share a rank delivered in one epoch: its open epoch's state (the watermark, the
/// spans delivered past it, the failures), or, for an epoch it has no state of, all of `share` if it
/// completed the epoch and nothing otherwise.
fn delivered_spans(epoch_state: Option<&Bound<'_, PyAny>>, completed: bool, share: u64) -> PyResult<Spans> {
    let Some(e) = epoch_state else {
        let pairs = if completed && share > 0 { vec![(0, share)] } else { Vec::new() };
        return Spans::from_pairs(pairs).map_err(err);
    };
    let watermark: u64 = e.get_item("watermark")?.extract()?;
    let mut pairs = if watermark > 0 { vec![(0, watermark)] } else { Vec::new() };
    pairs.extend(spans_from_py(&e.get_item("delivered")?)?.pairs());
    for failure in e.get_item("failures")?.try_iter()? {
        let at: u64 = failure?.get_item(0)?.extract()?;
        pairs.push((at, at + 1));
    }
    Spans::from_pairs(pairs).map_err(err)
}

/// The ElasticSampler state a pipeline input starts from: its first open epoch's, else its next epoch's.
fn sampler_state<'py>(inp: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    let epochs = inp.get_item("epochs")?;
    let src = if epochs.len()? > 0 { epochs.get_item(0)?.get_item("source")? } else { inp.get_item("next_source")? };
    match src.cast_into::<PyDict>() {
        Ok(d) if d.contains("world_size")? && d.contains("done")? => Ok(d),
        _ => Err(PyValueError::new_err("merge_rank_states: the source is not an ElasticSampler")),
    }
}

/// The epochs of an input's state, each with its number.
fn open_epochs<'py>(inp: &Bound<'py, PyAny>) -> PyResult<Vec<(u64, Bound<'py, PyAny>)>> {
    inp.get_item("epochs")?.try_iter()?.map(|e| e.and_then(|e| Ok((e.get_item("epoch")?.extract()?, e)))).collect()
}

/// Merges the :py:meth:`~spdl_rs.pipeline.Pipeline.state_dict` of every rank of a job (each a pipeline over an
/// :py:class:`~spdl_rs.source.ElasticSampler`, one source) into one state that a pipeline of **any** rank
/// of **any** world size loads: over the union of the new ranks, every sample of the epoch not yet delivered
/// anywhere is delivered once (padding aside), then the following epochs go on as if never interrupted.
///
/// Gather the states first (e.g. ``torch.distributed.all_gather_object``); pass all of them, one per rank.
///
/// Raises:
///     ValueError: The states are not from one job's ranks (other samplers, missing or repeated ranks, more
///         than one source).
#[pyfunction]
pub(crate) fn merge_rank_states<'py>(py: Python<'py>, states: Vec<Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyDict>> {
    let Some(state0) = states.first() else {
        return Err(PyValueError::new_err("merge_rank_states needs the state of every rank, got none"));
    };
    let mut inputs = Vec::with_capacity(states.len());
    for s in &states {
        let one = match s.cast::<PyDict>() {
            Ok(d) => d.get_item("inputs")?.filter(|i| i.len().is_ok_and(|n| n == 1)),
            Err(_) => None,
        };
        let Some(one) = one else {
            return Err(PyValueError::new_err("merge_rank_states takes pipeline states with exactly one source each"));
        };
        inputs.push(one.get_item(0)?);
    }
    let first = sampler_state(&inputs[0])?;
    let world_size: u64 = get(&first, "world_size")?.extract()?;
    let mut by_rank: Vec<(u64, &Bound<'py, PyAny>)> =
        inputs.iter().map(|inp| Ok((get(&sampler_state(inp)?, "rank")?.extract()?, inp))).collect::<PyResult<_>>()?;
    by_rank.sort_by_key(|(r, _)| *r);
    let ranks: Vec<u64> = by_rank.iter().map(|(r, _)| *r).collect();
    if !ranks.iter().copied().eq(0..world_size) {
        return Err(PyValueError::new_err(format!(
            "merge_rank_states needs one state per rank 0..{}, got ranks {ranks:?}",
            world_size as i128 - 1
        )));
    }
    let field = |inp: &Bound<'py, PyAny>, key: &str| -> PyResult<u64> { inp.get_item(key)?.extract() };

    // Every epoch some rank has open or not yet begun: its start state, and each rank's part of it.
    let mut epochs: Vec<u64> = Vec::new();
    for inp in &inputs {
        epochs.extend(open_epochs(inp)?.into_iter().map(|(e, _)| e));
    }
    epochs.sort_unstable();
    epochs.dedup();
    let mut next_epoch = 0;
    let mut failures_done = 0;
    for inp in &inputs {
        next_epoch = next_epoch.max(field(inp, "next_epoch")?);
        failures_done += field(inp, "failures_done")?;
    }
    let merged_epochs = PyList::empty(py);
    for &epoch in &epochs {
        let mut start = None;
        for inp in &inputs {
            if let Some((_, e)) = open_epochs(inp)?.into_iter().find(|(n, _)| *n == epoch) {
                start = Some(e.get_item("source")?);
            } else if field(inp, "next_epoch")? == epoch {
                start = Some(inp.get_item("next_source")?);
            }
            if start.is_some() {
                break;
            }
        }
        let Some(start) = start else { continue }; // an open epoch has a start state on the rank that has it open
        let start = start.cast_into::<PyDict>()?.copy()?;
        start.set_item("world_size", world_size)?;
        let sampler = PyElasticSampler::new(
            Int::from(i128::from(get(&start, "n")?.extract::<u64>()?)),
            Int::from(0),
            Int::from(i128::from(world_size)),
            get(&start, "seed")?.extract()?,
            get(&start, "shuffle")?.extract()?,
            Int::from(i128::from(get(&start, "num_partitions")?.extract::<u64>()?)),
            get(&start, "drop_remainder")?.extract()?,
        )?;
        sampler.load_state_dict(&start)?;
        let share = sampler.__len__() as u64;
        let mut delivered = Vec::with_capacity(by_rank.len());
        for &(rank, inp) in &by_rank {
            let mine = open_epochs(inp)?.into_iter().find(|(n, _)| *n == epoch).map(|(_, e)| e);
            if let Some(m) = &mine {
                failures_done += m.get_item("failures")?.len()? as u64;
            }
            delivered.push((rank as usize, delivered_spans(mine.as_ref(), field(inp, "next_epoch")? > epoch, share)?));
        }
        let progress = merge_progress(py, &start, &delivered)?;
        let done = spans_from_py(&get(&progress, "done")?)?.count();
        if done < get(&start, "n")?.extract::<u64>()? {
            let e = PyDict::new(py);
            e.set_item("epoch", epoch)?;
            e.set_item("source", progress)?;
            e.set_item("watermark", 0)?;
            e.set_item("delivered", PyList::empty(py))?;
            e.set_item("failures", PyList::empty(py))?;
            merged_epochs.append(e)?;
        }
    }
    // The sampler's epoch runs ahead of the pipeline's epoch count by a fixed offset (set_epoch before the
    // first run); the next epoch starts with nothing delivered.
    let inp0 = &inputs[0];
    let offset: i128 = match open_epochs(inp0)?.into_iter().next() {
        Some((epoch, e)) => e.get_item("source")?.get_item("epoch")?.extract::<i128>()? - i128::from(epoch),
        None => {
            inp0.get_item("next_source")?.get_item("epoch")?.extract::<i128>()? - i128::from(field(inp0, "next_epoch")?)
        }
    };
    let next_source = first.copy()?;
    next_source.set_item("epoch", i128::from(next_epoch) + offset)?;
    next_source.set_item("done", PyList::empty(py))?;
    next_source.set_item("world_size", world_size)?;
    let input = PyDict::new(py);
    input.set_item("epochs", merged_epochs)?;
    input.set_item("next_epoch", next_epoch)?;
    input.set_item("next_source", next_source)?;
    input.set_item("failures_done", failures_done)?;
    let out = PyDict::new(py);
    out.set_item("version", state0.get_item("version")?)?;
    out.set_item("inputs", PyList::new(py, [input])?)?;
    Ok(out)
}
