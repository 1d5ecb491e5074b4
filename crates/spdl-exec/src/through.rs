//! A stage run by a function that takes the stage's whole input stream: the primitive under
//! regions that run elsewhere (a pool of worker processes, a remote service), where items
//! are shipped in and results come back out of step with them.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use spdl_report::error_chain;

use crate::builder::state::Open;
use crate::builder::{PipelineBuilder, Wiring};
use crate::context::{Done, Shared};
use crate::driver::panicked;
use crate::error::PipelineError;
use crate::failure::BoxError;
use crate::queue::{Msg, PopError, PushError, QueueRx, QueueTx, queue};
use crate::stats::{StageCell, StageKind};

/// One wait on a queue between checks for a stop.
const SLICE: Duration = Duration::from_millis(20);

/// Where the current epoch's input stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Open,
    Epoch(u64),
    Closed,
}

struct State<T> {
    rx: QueueRx<T>,
    shared: Arc<Shared>,
    cell: Arc<StageCell>,
    /// The first item of the epoch, popped before the function was called.
    first: Mutex<Option<T>>,
    end: Mutex<End>,
}

impl<T> State<T> {
    fn end(&self) -> End {
        *self.end.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_end(&self, e: End) {
        *self.end.lock().unwrap_or_else(PoisonError::into_inner) = e;
    }

    /// The next input of this epoch, waiting for it; `None` at the epoch's end, at the end
    /// of the input or when the pipeline stops.
    fn next(&self) -> Option<T> {
        if let Some(first) = self.first.lock().unwrap_or_else(PoisonError::into_inner).take() {
            return Some(first);
        }
        loop {
            if self.end() != End::Open {
                return None;
            }
            if self.shared.cancelled() {
                self.set_end(End::Closed);
                return None;
            }
            match self.rx.pop_blocking(Some(SLICE)) {
                Ok(Msg::Item(item)) => {
                    self.cell.items_in.fetch_add(1, Relaxed);
                    return Some(item);
                }
                Ok(Msg::EpochEnd(e)) => self.set_end(End::Epoch(e)),
                Err(PopError::Closed) => self.set_end(End::Closed),
                Err(PopError::Empty) => {}
            }
        }
    }
}

/// The inputs of one epoch of a [`PipelineBuilder::through`] stage: an iterator that waits
/// for each item and ends at the epoch's end, at the end of the input, or when the pipeline
/// stops. It is `Send`: the function may hand it to a thread of its own (a feeder) while it
/// yields outputs.
pub struct Inputs<T> {
    state: Arc<State<T>>,
}

impl<T> std::fmt::Debug for Inputs<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inputs").field("end", &self.state.end()).finish_non_exhaustive()
    }
}

impl<T> Iterator for Inputs<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        self.state.next()
    }
}

impl<T: Send + 'static> PipelineBuilder<T, Open> {
    /// Adds a stage run by `f`, which takes a whole epoch's inputs as an iterator
    /// ([`Inputs`]) and returns an iterator of outputs. `f` is called on a thread of the
    /// stage's own once per epoch (once for a one-pass source); its outputs go downstream
    /// as they are yielded (the output iterator is advanced only while the queue has room).
    ///
    /// This is for work that runs elsewhere and is not one call per item: items shipped to
    /// worker processes and results read back, a batching service, a state machine. An `Err`
    /// from `f` or from the output iterator (or a panic) counts as one failure of the stage
    /// and ends that epoch's call; inputs the call did not take are counted as failed.
    ///
    /// ```
    /// use spdl_exec::{BuildOptions, Inputs, PipelineBuilder};
    ///
    /// // Running sums: each output depends on every input before it.
    /// let pipeline = PipelineBuilder::new()
    ///     .source(1..=4u64)
    ///     .through("running_sum", |inputs: Inputs<u64>| {
    ///         Ok::<_, std::io::Error>(inputs.scan(0, |acc, x| { *acc += x; Some(Ok::<_, std::io::Error>(*acc)) }))
    ///     })
    ///     .sink(2)
    ///     .build(BuildOptions::default())
    ///     .unwrap();
    /// let all: Vec<u64> = pipeline.iter().map(Result::unwrap).collect();
    /// assert_eq!(all, [1, 3, 6, 10]);
    /// ```
    pub fn through<U, F, I, E, E2>(self, name: impl Into<String>, f: F) -> PipelineBuilder<U, Open>
    where
        U: Send + 'static,
        F: FnMut(Inputs<T>) -> Result<I, E> + Send + 'static,
        I: IntoIterator<Item = Result<U, E2>>,
        E: Into<BoxError>,
        E2: Into<BoxError>,
    {
        let name = name.into();
        self.then(move |w: &mut Wiring, input, cap| {
            let cell = w.cell(name.clone(), StageKind::Through, 1);
            let cap = w.capacity(cap, &format!("stage `{name}`"));
            let (tx, rx) = queue(cap);
            let shared = w.shared();
            let thread_name = format!("spdl-exec-through-{name}");
            w.task(&name, async move {
                let (done_tx, done_rx) = futures::channel::oneshot::channel::<()>();
                let state = Arc::new(State {
                    rx: input,
                    shared: Arc::clone(&shared),
                    cell,
                    first: Mutex::new(None),
                    end: Mutex::new(End::Open),
                });
                let spawned = std::thread::Builder::new().name(thread_name).spawn({
                    let shared = Arc::clone(&shared);
                    move || {
                        run(&state, &tx, f, &shared);
                        drop(tx);
                        let _ = done_tx.send(());
                    }
                });
                match spawned {
                    Ok(handle) => {
                        shared.add_thread(handle);
                        let _ = done_rx.await;
                    }
                    Err(source) => shared.fail(PipelineError::Spawn { what: "through-stage", source }),
                }
            });
            rx
        })
    }
}

/// Pushes an output, waiting for room while the pipeline runs. `false`: stop.
fn push<U>(tx: &QueueTx<U>, shared: &Shared, cell: &StageCell, mut msg: Msg<U>) -> bool {
    let is_item = matches!(msg, Msg::Item(_));
    let t0 = Instant::now();
    loop {
        match tx.push_timeout(msg, SLICE) {
            Ok(()) => break,
            Err(PushError::Closed(_)) => return false,
            Err(PushError::Full(m)) => {
                if shared.cancelled() {
                    return false;
                }
                msg = m;
            }
        }
    }
    cell.add_blocked(t0);
    if is_item {
        cell.items_out.fetch_add(1, Relaxed);
    }
    tx.flush();
    true
}

fn run<T, U, F, I, E, E2>(state: &Arc<State<T>>, tx: &QueueTx<U>, mut f: F, shared: &Shared)
where
    F: FnMut(Inputs<T>) -> Result<I, E>,
    I: IntoIterator<Item = Result<U, E2>>,
    E: Into<BoxError>,
    E2: Into<BoxError>,
{
    let cell = Arc::clone(&state.cell);
    let mut calls = 0u64;
    loop {
        // Wait for the epoch's first message: no call for an input that has ended.
        state.set_end(End::Open);
        let first = loop {
            if shared.cancelled() {
                return;
            }
            match state.rx.pop_blocking(Some(SLICE)) {
                Ok(Msg::Item(item)) => break item,
                Ok(Msg::EpochEnd(e)) => {
                    if !push(tx, shared, &cell, Msg::EpochEnd(e)) {
                        return;
                    }
                }
                Err(PopError::Closed) => return,
                Err(PopError::Empty) => {}
            }
        };
        cell.items_in.fetch_add(1, Relaxed);
        *state.first.lock().unwrap_or_else(PoisonError::into_inner) = Some(first);
        let t0 = Instant::now();
        let index = calls;
        calls += 1;
        let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<bool, String> {
            let outputs = f(Inputs { state: Arc::clone(state) }).map_err(|e| error_chain(&*e.into()))?;
            for out in outputs {
                match out {
                    Ok(u) => {
                        if !push(tx, shared, &cell, Msg::Item(u)) {
                            return Ok(false);
                        }
                    }
                    Err(e) => return Err(error_chain(&*e.into())),
                }
            }
            Ok(true)
        }));
        let result = match outcome {
            Ok(Ok(go_on)) => {
                if !go_on {
                    return;
                }
                Ok(())
            }
            Ok(Err(cause)) => Err(cause),
            Err(p) => Err(panicked(&*p)),
        };
        shared.settle(&cell, Done { index, item: None, elapsed: t0.elapsed(), result, parts: None });
        // Inputs of this epoch the call did not take are failures of the stage.
        let mut left = 0u64;
        while let Some(_item) = state.next() {
            left += 1;
        }
        if left > 0 {
            let cause = format!("{left} inputs of the epoch were not taken by the stage's function");
            shared.fail_many(&cell, index, left, cause);
        }
        match state.end() {
            End::Epoch(e) => {
                if !push(tx, shared, &cell, Msg::EpochEnd(e)) {
                    return;
                }
            }
            End::Closed | End::Open => return,
        }
    }
}
