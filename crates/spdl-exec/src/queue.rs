//! Bounded queues between stages.
//!
//! A queue is a crossbeam bounded channel (a lock-free multi-producer multi-consumer
//! buffer) plus two `tokio::sync::Notify` signals, so that the scheduler's async drivers can
//! wait on it without a thread, and a condvar for pool threads and the consumer. Every
//! queue has at most one async waiter per end (the driver of the stage on that side), so
//! `notify_one` with its stored permit is enough and no wake-up is lost.
//!
//! Wake-ups, not queue operations, are what a trivial stage costs (a futex wake and a
//! context switch, far worse on a loaded machine), so both directions are batched:
//! - a producer waiting for room is woken only once the queue has drained to half its
//!   capacity (the low-water mark), not at every free slot;
//! - a consumer waiting for items is woken once the queue holds half its capacity (the
//!   high-water mark), or when the producer *flushes*: every producer calls
//!   [`QueueTx::flush`] before it waits (for input, for room, for a pending future), after a
//!   slow item (≥ [`SLOW_ITEM`], where batching gains nothing), after an epoch marker, and
//!   when it ends. A waiting consumer also re-checks every [`BACKSTOP`], which bounds the
//!   extra latency if a producer stalls inside a function right after a fast item.
//!
//! Nobody blocks inside crossbeam (it would wake at every operation): pool threads and the
//! consumer wait on a condvar of ours, async drivers on the `Notify`s.

use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use crossbeam_channel as cb;
use tokio::sync::Notify;

/// The longest a waiting consumer sleeps before it looks at the queue again.
pub(crate) const BACKSTOP: Duration = Duration::from_millis(1);
/// An item that took this long to make is pushed with a flush (no batching).
pub(crate) const SLOW_ITEM: Duration = Duration::from_micros(50);

/// What travels through a queue: an item, or the end of an epoch of a continuous source.
#[derive(Debug)]
pub(crate) enum Msg<T> {
    Item(T),
    EpochEnd(u64),
}

#[derive(Debug, Default)]
struct Signals {
    /// Signalled after a push and when a sender goes away.
    pushed: Notify,
    /// Signalled after a pop and when the receiver goes away.
    popped: Notify,
    /// Live senders; 0 means closed for the receiver once the queue is empty.
    senders: AtomicUsize,
    /// The queue's capacity now (the auto-tuner may change it: see [`QueueLimit`]).
    /// Producers are woken when the queue has drained to half of it (the low-water mark),
    /// consumers when it has filled to half (the high-water mark).
    capacity: AtomicUsize,
    /// The channel can hold more than `capacity` (it is unbounded and allocated as it fills,
    /// or preallocated at a resizable queue's largest capacity), so `capacity` is enforced
    /// here, before each push.
    limited: bool,
    /// The most `capacity` may be set to.
    max: usize,
    /// Threads (not async drivers) waiting for items or room, and what they wait on.
    item_waiters: AtomicUsize,
    room_waiters: AtomicUsize,
    /// The receiving end is gone (pushes fail as closed).
    receiver_dropped: std::sync::atomic::AtomicBool,
    lock: Mutex<()>,
    items: Condvar,
    room: Condvar,
}

impl Signals {
    fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed).max(1)
    }

    fn low_water(&self) -> usize {
        self.capacity() / 2
    }

    fn high_water(&self) -> usize {
        self.capacity().div_ceil(2)
    }

    fn receiver_gone(&self) -> bool {
        self.receiver_dropped.load(Ordering::SeqCst)
    }

    fn wake_consumers(&self) {
        self.pushed.notify_one();
        if self.item_waiters.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.items.notify_all();
        }
    }

    fn wake_producers(&self) {
        self.popped.notify_one();
        if self.room_waiters.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.room.notify_all();
        }
    }

    /// Blocks the calling thread on `cv` for at most `timeout` unless `ready()` already holds
    /// (checked under the lock, after registering, so that a wake-up cannot be missed).
    fn wait(&self, waiters: &AtomicUsize, cv: &Condvar, timeout: Duration, ready: impl Fn() -> bool) {
        crate::pool::before_block();
        waiters.fetch_add(1, Ordering::SeqCst);
        let guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        if !ready() {
            drop(cv.wait_timeout(guard, timeout));
        }
        waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why a non-blocking or timed push did not happen; the message comes back.
#[derive(Debug)]
pub(crate) enum PushError<T> {
    Full(Msg<T>),
    Closed(Msg<T>),
}

/// Why a pop returned nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PopError {
    Empty,
    Closed,
}

/// Queues up to this capacity preallocate their slots; larger ones allocate as they fill,
/// so a huge capacity (an "unlimited" sink) costs memory only for what is queued.
pub(crate) const PREALLOCATED_CAPACITY: usize = 1024;

/// Creates a bounded queue of `capacity` messages (at least 1).
///
/// Above [`PREALLOCATED_CAPACITY`] the channel grows block by block and the capacity is
/// checked before each push; producers that push at the same instant may overshoot it by
/// at most one message each.
pub(crate) fn queue<T>(capacity: usize) -> (QueueTx<T>, QueueRx<T>) {
    resizable_queue(capacity, capacity)
}

/// Creates a bounded queue of `capacity` messages whose capacity [`QueueLimit::set`] may
/// later move up to `max` (the channel is sized for `max`, allocated as it fills above
/// [`PREALLOCATED_CAPACITY`]).
pub(crate) fn resizable_queue<T>(capacity: usize, max: usize) -> (QueueTx<T>, QueueRx<T>) {
    let capacity = capacity.max(1);
    let max = max.max(capacity);
    let lazy = max > PREALLOCATED_CAPACITY;
    let (tx, rx) = if lazy { cb::unbounded() } else { cb::bounded(max) };
    let signals = Arc::new(Signals {
        senders: AtomicUsize::new(1),
        capacity: AtomicUsize::new(capacity),
        limited: lazy || max > capacity,
        max,
        ..Signals::default()
    });
    (QueueTx { tx: Some(tx), signals: Arc::clone(&signals) }, QueueRx { rx: Some(rx), signals })
}

/// A handle on a queue's capacity, for the stats and the auto-tuner. Setting it only
/// changes when a push counts the queue as full: nothing is allocated or moved, and a
/// lower capacity lets the queue drain below it before the next push.
#[derive(Clone)]
pub(crate) struct QueueLimit {
    signals: Arc<Signals>,
}

impl std::fmt::Debug for QueueLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueLimit").field("capacity", &self.capacity()).field("max", &self.signals.max).finish()
    }
}

impl QueueLimit {
    /// The capacity now.
    pub(crate) fn capacity(&self) -> usize {
        self.signals.capacity()
    }

    /// Whether both limits are of the same queue.
    pub(crate) fn same_queue(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.signals, &other.signals)
    }

    /// Sets the capacity (within `1..=max` of the queue); producers waiting for room are
    /// woken when it grows.
    pub(crate) fn set(&self, capacity: usize) {
        let capacity = capacity.clamp(1, self.signals.max.max(1));
        let old = self.signals.capacity.swap(capacity, Ordering::SeqCst);
        if capacity > old {
            self.signals.wake_producers();
        }
    }
}

/// The sending end. Cloneable; the queue closes when the last clone drops.
#[derive(Debug)]
pub(crate) struct QueueTx<T> {
    // `Option` only so that `Drop` can release the channel end before signalling.
    tx: Option<cb::Sender<Msg<T>>>,
    signals: Arc<Signals>,
}

impl<T> Clone for QueueTx<T> {
    fn clone(&self) -> Self {
        self.signals.senders.fetch_add(1, Ordering::SeqCst);
        Self { tx: self.tx.clone(), signals: Arc::clone(&self.signals) }
    }
}

impl<T> Drop for QueueTx<T> {
    fn drop(&mut self) {
        drop(self.tx.take());
        self.signals.senders.fetch_sub(1, Ordering::SeqCst);
        self.signals.wake_consumers();
    }
}

impl<T> QueueTx<T> {
    /// A handle on this queue's capacity (settable up to the `max` of [`resizable_queue`]).
    pub(crate) fn limit(&self) -> QueueLimit {
        QueueLimit { signals: Arc::clone(&self.signals) }
    }

    /// Wakes a waiting consumer if anything is queued. Call before waiting or idling.
    pub(crate) fn flush(&self) {
        if self.tx.as_ref().is_some_and(|tx| !tx.is_empty()) {
            self.signals.wake_consumers();
        }
    }

    /// Pushes without waiting. A waiting consumer is woken at the high-water mark only:
    /// see [`QueueTx::flush`].
    pub(crate) fn try_push(&self, msg: Msg<T>) -> Result<(), PushError<T>> {
        let Some(tx) = &self.tx else {
            return Err(PushError::Closed(msg));
        };
        if self.signals.limited && tx.len() >= self.signals.capacity() {
            return Err(if self.signals.receiver_gone() { PushError::Closed(msg) } else { PushError::Full(msg) });
        }
        match tx.try_send(msg) {
            Ok(()) => {
                if tx.len() >= self.signals.high_water() {
                    self.signals.wake_consumers();
                }
                Ok(())
            }
            Err(cb::TrySendError::Full(m)) => Err(PushError::Full(m)),
            Err(cb::TrySendError::Disconnected(m)) => Err(PushError::Closed(m)),
        }
    }

    /// Pushes, blocking the calling (pool) thread for at most `timeout` while the queue is
    /// full (woken at the low-water mark).
    pub(crate) fn push_timeout(&self, msg: Msg<T>, timeout: Duration) -> Result<(), PushError<T>> {
        let msg = match self.try_push(msg) {
            Err(PushError::Full(m)) => m,
            other => return other,
        };
        self.signals.wait(&self.signals.room_waiters, &self.signals.room, timeout, || {
            self.tx.as_ref().is_none_or(|tx| tx.len() < self.signals.capacity())
        });
        self.try_push(msg)
    }

    /// Pushes, waiting asynchronously for room. Gives the message back if the queue is closed.
    pub(crate) async fn push(&self, msg: Msg<T>) -> Result<(), Msg<T>> {
        let mut msg = match self.try_push(msg) {
            Ok(()) => return Ok(()),
            Err(PushError::Closed(m)) => return Err(m),
            Err(PushError::Full(m)) => m,
        };
        loop {
            let mut notified = pin!(self.signals.popped.notified());
            notified.as_mut().enable();
            msg = match self.try_push(msg) {
                Ok(()) => return Ok(()),
                Err(PushError::Closed(m)) => return Err(m),
                Err(PushError::Full(m)) => m,
            };
            notified.await;
        }
    }
}

/// The receiving end.
#[derive(Debug)]
pub(crate) struct QueueRx<T> {
    rx: Option<cb::Receiver<Msg<T>>>,
    signals: Arc<Signals>,
}

impl<T> Drop for QueueRx<T> {
    fn drop(&mut self) {
        drop(self.rx.take());
        self.signals.receiver_dropped.store(true, Ordering::SeqCst);
        self.signals.wake_producers();
    }
}

impl<T> QueueRx<T> {
    fn closed(&self) -> bool {
        self.signals.senders.load(Ordering::SeqCst) == 0
    }

    /// Closed (no sender left) and drained: nothing will ever come.
    pub(crate) fn is_finished(&self) -> bool {
        self.closed() && self.len() == 0
    }

    /// Messages waiting in the queue.
    pub(crate) fn len(&self) -> usize {
        self.rx.as_ref().map_or(0, cb::Receiver::len)
    }

    fn popped(&self, rx: &cb::Receiver<Msg<T>>) {
        if rx.len() <= self.signals.low_water() {
            self.signals.wake_producers();
        }
    }

    /// Pops without waiting.
    pub(crate) fn try_pop(&self) -> Result<Msg<T>, PopError> {
        let Some(rx) = &self.rx else {
            return Err(PopError::Closed);
        };
        match rx.try_recv() {
            Ok(m) => {
                self.popped(rx);
                Ok(m)
            }
            Err(cb::TryRecvError::Empty) => Err(PopError::Empty),
            Err(cb::TryRecvError::Disconnected) => Err(PopError::Closed),
        }
    }

    /// Pops, blocking the calling thread for at most `timeout` (`None`: until an item or close).
    pub(crate) fn pop_blocking(&self, timeout: Option<Duration>) -> Result<Msg<T>, PopError> {
        let deadline = timeout.and_then(|t| std::time::Instant::now().checked_add(t));
        loop {
            match self.try_pop() {
                Err(PopError::Empty) => {}
                other => return other,
            }
            let slice = match deadline {
                None => BACKSTOP,
                Some(d) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Err(PopError::Empty);
                    }
                    left.min(BACKSTOP)
                }
            };
            self.signals
                .wait(&self.signals.item_waiters, &self.signals.items, slice, || self.len() > 0 || self.closed());
        }
    }

    /// Pops, waiting asynchronously. `None` once the queue is closed and empty.
    pub(crate) async fn pop(&self) -> Option<Msg<T>> {
        loop {
            match self.try_pop() {
                Ok(m) => return Some(m),
                Err(PopError::Closed) => return None,
                Err(PopError::Empty) => {}
            }
            let mut notified = pin!(self.signals.pushed.notified());
            notified.as_mut().enable();
            match self.try_pop() {
                Ok(m) => return Some(m),
                Err(PopError::Closed) => return None,
                Err(PopError::Empty) => {}
            }
            let _ = tokio::time::timeout(BACKSTOP, notified).await;
        }
    }

    /// Waits asynchronously until the queue holds a message or is closed, without popping.
    pub(crate) async fn ready(&self) {
        loop {
            if self.len() > 0 || self.closed() {
                return;
            }
            let mut notified = pin!(self.signals.pushed.notified());
            notified.as_mut().enable();
            if self.len() > 0 || self.closed() {
                return;
            }
            let _ = tokio::time::timeout(BACKSTOP, notified).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closes_when_last_sender_drops() {
        let (tx, rx) = queue::<u32>(2);
        let tx2 = tx.clone();
        assert!(tx.try_push(Msg::Item(1)).is_ok());
        assert!(tx2.try_push(Msg::Item(2)).is_ok());
        assert!(matches!(tx.try_push(Msg::Item(3)), Err(PushError::Full(_))));
        drop(tx);
        drop(tx2);
        assert!(matches!(rx.try_pop(), Ok(Msg::Item(1))));
        assert!(matches!(rx.try_pop(), Ok(Msg::Item(2))));
        assert_eq!(rx.try_pop().err(), Some(PopError::Closed));
    }

    #[test]
    fn a_huge_capacity_allocates_only_what_is_queued_and_still_bounds() {
        // Preallocating 2^40 slots would abort; a lazy queue costs what it holds.
        let (tx, rx) = queue::<u32>(1 << 40);
        for i in 0..1000 {
            assert!(tx.try_push(Msg::Item(i)).is_ok());
        }
        assert_eq!(rx.len(), 1000);
        let (tx, rx) = queue::<u32>(PREALLOCATED_CAPACITY + 2);
        for i in 0..PREALLOCATED_CAPACITY + 2 {
            assert!(tx.try_push(Msg::Item(i as u32)).is_ok());
        }
        assert!(matches!(tx.try_push(Msg::Item(0)), Err(PushError::Full(_))));
        assert!(matches!(tx.push_timeout(Msg::Item(0), Duration::from_millis(5)), Err(PushError::Full(_))));
        assert!(rx.try_pop().is_ok());
        assert!(tx.try_push(Msg::Item(0)).is_ok());
        drop(rx);
        assert!(matches!(tx.try_push(Msg::Item(0)), Err(PushError::Closed(_))));
    }

    #[test]
    fn a_resizable_queue_moves_its_capacity_within_its_bounds() {
        let (tx, rx) = resizable_queue::<u32>(2, 8);
        let limit = tx.limit();
        assert_eq!(limit.capacity(), 2);
        assert!(tx.try_push(Msg::Item(0)).is_ok());
        assert!(tx.try_push(Msg::Item(1)).is_ok());
        assert!(matches!(tx.try_push(Msg::Item(2)), Err(PushError::Full(_))));
        limit.set(4);
        assert!(tx.try_push(Msg::Item(2)).is_ok());
        assert!(tx.try_push(Msg::Item(3)).is_ok());
        assert!(matches!(tx.try_push(Msg::Item(4)), Err(PushError::Full(_))));
        // Never above the queue's largest capacity.
        limit.set(100);
        assert_eq!(limit.capacity(), 8);
        // Lowered: what is queued stays, and pushes wait until it drains below the new capacity.
        limit.set(1);
        assert!(matches!(tx.try_push(Msg::Item(4)), Err(PushError::Full(_))));
        for want in 0..4 {
            assert!(matches!(rx.try_pop(), Ok(Msg::Item(v)) if v == want));
        }
        assert!(tx.try_push(Msg::Item(4)).is_ok());
        assert!(matches!(tx.try_push(Msg::Item(5)), Err(PushError::Full(_))));
        // A plain queue's limit cannot move.
        let (plain, _rx) = queue::<u32>(3);
        plain.limit().set(10);
        assert_eq!(plain.limit().capacity(), 3);
        assert!(plain.limit().same_queue(&plain.limit()) && !plain.limit().same_queue(&limit));
    }

    #[test]
    fn async_push_waits_for_room() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        let (tx, rx) = queue::<u32>(1);
        let consumer = std::thread::spawn(move || {
            let mut got = Vec::new();
            while let Ok(Msg::Item(v)) = rx.pop_blocking(Some(Duration::from_secs(30))) {
                got.push(v);
            }
            got
        });
        rt.block_on(async {
            for i in 0..100 {
                assert!(tx.push(Msg::Item(i)).await.is_ok());
            }
        });
        drop(tx);
        let got = consumer.join().expect("consumer thread");
        assert_eq!(got, (0..100).collect::<Vec<_>>());
    }
}
