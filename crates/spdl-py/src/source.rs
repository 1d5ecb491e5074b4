//! `spdl_rs.source`: spdl-source's samplers and dataset listings for Python.

use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use pyo3::exceptions::{
    PyFileNotFoundError, PyIsADirectoryError, PyNotADirectoryError, PyOSError, PyPermissionError, PyTimeoutError,
    PyValueError,
};
use pyo3::prelude::*;
use spdl_source::sampler::{Remainder, Sampler, SequentialSampler, ShardedSampler, ShuffledSampler, WeightedSampler};
use spdl_source::{Dataset, SourceError};

use crate::args::{self, Int};
use crate::error::Error;
use crate::pipeline::{NativeOp, PyNativeOp};
use crate::signals::{SIGNAL_POLL, wait_with_signals};
use crate::value::Value;

/// A missing object is `FileNotFoundError`, a refused one (permissions, or a link out of a local store's root)
/// `PermissionError`, a local path that is not a directory `NotADirectoryError`, a failed read or request (after
/// its retries), a special file or an object over the size cap `OSError` (`TimeoutError` for a special file that
/// sent nothing in time), anything else (bad address, range, configuration, a sampler order over its limit)
/// `ValueError`.
fn source_err(e: SourceError) -> PyErr {
    let msg = spdl_report::error_chain(&e);
    match &e {
        SourceError::NotFound { .. } => PyFileNotFoundError::new_err(msg),
        SourceError::PermissionDenied { .. } | SourceError::OutsideRoot { .. } => PyPermissionError::new_err(msg),
        SourceError::Io { source, .. } => match source.kind() {
            std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(msg),
            std::io::ErrorKind::PermissionDenied => PyPermissionError::new_err(msg),
            std::io::ErrorKind::NotADirectory => PyNotADirectoryError::new_err(msg),
            std::io::ErrorKind::IsADirectory => PyIsADirectoryError::new_err(msg),
            std::io::ErrorKind::TimedOut => PyTimeoutError::new_err(msg),
            _ => PyOSError::new_err(msg),
        },
        SourceError::Request { .. }
        | SourceError::ShortBody { .. }
        | SourceError::Task { .. }
        | SourceError::Runtime { .. }
        | SourceError::ObjectTooLarge { .. }
        | SourceError::NotRegularFile { .. } => PyOSError::new_err(msg),
        _ => PyValueError::new_err(msg),
    }
}

/// Runs `future` on the store's runtime without the GIL, waking every [`SIGNAL_POLL`] to run Python's signal
/// handlers: Ctrl-C raises `KeyboardInterrupt` within about that long, and the request is cancelled (dropped).
fn wait<T, F>(py: Python<'_>, store: &spdl_source::DedicatedStore, future: F) -> PyResult<T>
where
    F: std::future::Future<Output = Result<T, SourceError>> + Send,
    T: Send,
{
    let mut future = std::pin::pin!(future);
    // The timer is made inside `block_on`, where the runtime's time driver is in reach.
    wait_with_signals(py, || store.block_on(async { tokio::time::timeout(SIGNAL_POLL, future.as_mut()).await }).ok())?
        .map_err(source_err)
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
    fn sequential(n: Int) -> PyResult<Self> {
        let n = args::count("n", &n, 0, u64::MAX)?;
        Ok(Self { inner: Arc::new(SequentialSampler::new(n)), describe: format!("sequential({n})") })
    }

    /// A permutation of ``0..n`` derived from ``(seed, epoch)`` (ChaCha8, portable).
    #[staticmethod]
    fn shuffled(n: Int, seed: u64) -> PyResult<Self> {
        let n = args::count("n", &n, 0, u64::MAX)?;
        Ok(Self { inner: Arc::new(ShuffledSampler::new(n, seed)), describe: format!("shuffled({n}, seed={seed})") })
    }

    /// ``num_samples`` indices drawn with replacement, index ``i`` with probability proportional to
    /// ``weights[i]``.
    #[staticmethod]
    fn weighted(weights: Vec<f64>, num_samples: Int, seed: u64) -> PyResult<Self> {
        let num_samples = args::count("num_samples", &num_samples, 0, u64::MAX)?;
        let n = weights.len();
        let s = WeightedSampler::new(weights, num_samples, seed).map_err(source_err)?;
        Ok(Self { inner: Arc::new(s), describe: format!("weighted({n} weights, {num_samples}, seed={seed})") })
    }

    /// This sampler's share for ``rank`` of ``world_size``: every ``world_size``-th index of the epoch's
    /// order. ``drop_remainder``: drop the last ``len % world_size`` indices instead of padding.
    #[pyo3(signature = (rank, world_size, *, drop_remainder=false))]
    fn sharded(&self, rank: Int, world_size: Int, drop_remainder: bool) -> PyResult<Self> {
        // Shares are computed with 128-bit arithmetic, never from a list of ranks: no cap beyond the type's.
        let world_size = args::count("world_size", &world_size, 1, u64::MAX)?;
        let rank = args::count("rank", &rank, 0, world_size as u64 - 1)?;
        let remainder = if drop_remainder { Remainder::Drop } else { Remainder::Pad };
        let s = ShardedSampler::new(Arc::clone(&self.inner), rank, world_size, remainder).map_err(source_err)?;
        Ok(Self { inner: Arc::new(s), describe: format!("{}.sharded({rank}, {world_size})", self.describe) })
    }

    /// The indices of ``epoch``, in order. An order (or what computing it needs: a shuffle's whole permutation,
    /// a weighted sampler's draws) above ``2**31`` indices raises ``ValueError`` before anything is allocated; a
    /// sharded sampler computes only its share.
    #[pyo3(signature = (epoch=0))]
    fn order(&self, py: Python<'_>, epoch: u64) -> PyResult<Vec<usize>> {
        crate::lifecycle::detach(py, || self.inner.try_order(epoch)).map_err(source_err)
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
pub(crate) fn list_dataset(py: Python<'_>, root: PathBuf, extensions: Vec<String>, layout: &str) -> PyResult<Listing> {
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

/// An object store from an address: a local directory (``/data/train`` or ``file:///data/train``), an HTTP(S)
/// base URL (``https://host/path``; builds with the ``http`` feature) or ``s3://bucket/prefix`` (builds with
/// the ``s3`` feature). Every call releases the GIL while it waits; transient failures are retried with
/// backoff; errors name the key (the full address) and the cause: ``FileNotFoundError`` for a missing object,
/// ``PermissionError`` for a refused one, ``OSError`` for a read that still fails after its retries.
///
/// .. code-block:: python
///
///     store = Store.open("https://example.org/shards", read_timeout=10.0, max_attempts=5)
///     data = store.get("train/000001.jpg")          # bytes
///     blobs = store.get_many(keys, concurrency=32)   # bytes, in the order of keys
#[pyclass(name = "Store", module = "spdl_rs.source", frozen)]
pub struct PyStore {
    /// Shared with the store's native ops.
    cell: Arc<StoreCell>,
    url: String,
}

/// A store and what it takes to open it again: after a `fork` the runtime's threads (and the connections
/// they drove) do not exist in the child, so the first call there opens a new store with the same address
/// and options ([`StoreCell::current`]); the parent's is leaked, never shut down or joined in the child.
///
/// The store of the generation it was opened in is read without a lock (no thread of the parent can hold
/// one at the fork); the lock guards only the store reopened in a child.
struct StoreCell {
    url: String,
    opts: spdl_source::StoreOptions,
    made_in: u64,
    /// Dropped only in the generation it was opened in (its runtime shuts down without waiting then, which
    /// the last owner may do from an engine thread inside an async context).
    base: std::mem::ManuallyDrop<Arc<spdl_source::DedicatedStore>>,
    /// `(generation, store)` reopened in a forked child.
    child: std::sync::Mutex<Option<(u64, Arc<spdl_source::DedicatedStore>)>>,
}

impl StoreCell {
    fn open(url: &str, opts: &spdl_source::StoreOptions) -> Result<Self, SourceError> {
        let made_in = crate::lifecycle::generation();
        let store = spdl_source::DedicatedStore::open(url, opts, 1)?;
        Ok(StoreCell {
            url: url.to_owned(),
            opts: opts.clone(),
            made_in,
            base: std::mem::ManuallyDrop::new(Arc::new(store)),
            child: std::sync::Mutex::new(None),
        })
    }

    /// The store for this process: the one opened here, or (in a forked child) one opened again on the first
    /// call, on a runtime of the child's own.
    fn current(&self) -> Result<Arc<spdl_source::DedicatedStore>, SourceError> {
        let generation = crate::lifecycle::generation();
        if generation == self.made_in {
            return Ok(Arc::clone(&self.base));
        }
        let mut child = self.child.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((g, store)) = child.as_ref()
            && *g == generation
        {
            return Ok(Arc::clone(store));
        }
        // Reopened in an earlier child (this is a fork of a fork): its threads are gone too.
        if let Some((_, old)) = child.take() {
            std::mem::forget(old);
        }
        // Opened on a thread of its own: opening blocks on the new runtime, which tokio forbids from inside an
        // async context (a pipeline's scheduler calling the native op).
        let opened = std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("spdl-store-reopen".into())
                .spawn_scoped(s, || spdl_source::DedicatedStore::open(&self.url, &self.opts, 1))
                .map_err(|source| SourceError::Runtime { url: self.url.clone(), source })?
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        });
        let store = Arc::new(opened?);
        *child = Some((generation, Arc::clone(&store)));
        Ok(store)
    }

    /// [`current`](Self::current) from Python: a reopen (in a child) waits without the GIL.
    fn current_py(&self, py: Python<'_>) -> PyResult<Arc<spdl_source::DedicatedStore>> {
        if crate::lifecycle::generation() == self.made_in {
            return Ok(Arc::clone(&self.base));
        }
        crate::lifecycle::detach(py, || self.current()).map_err(source_err)
    }
}

impl Drop for StoreCell {
    fn drop(&mut self) {
        let generation = crate::lifecycle::generation();
        if generation == self.made_in {
            // SAFETY: `base` is not used after this (the cell is being dropped) and is dropped only here.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.base) };
        }
        // Otherwise `base` is leaked: its runtime's threads were the parent's.
        let child = self.child.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some((g, store)) = child
            && g != generation
        {
            std::mem::forget(store);
        }
    }
}

/// Native op: each item (a key) becomes the object's bytes. In a pipeline the request is awaited on the
/// store's runtime, so a stage's `concurrency` requests are in flight without the GIL or a blocked thread.
struct FetchOp {
    store: Arc<StoreCell>,
}

impl std::fmt::Debug for FetchOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FetchOp").field("url", &self.store.url).finish()
    }
}

/// Aborts a spawned request when the pipeline stops waiting for it.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl FetchOp {
    fn key(&self, stage: &str, input: Value) -> Result<String, Error> {
        match input {
            Value::Str(key) => Ok(key),
            other => Err(Error::wrong_input(stage, "fetch", other.describe(), "str (a key of the store)")),
        }
    }
}

fn fetch_failed(stage: &str, key: &str, source: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::native(stage, "fetch", format!("key {key:?}"), source)
}

impl NativeOp for FetchOp {
    fn name(&self) -> &str {
        "fetch"
    }

    fn expects(&self) -> &'static str {
        "str (a key of the store)"
    }

    fn call(&self, stage: &str, input: Value) -> Result<Vec<Value>, Error> {
        let key = self.key(stage, input)?;
        let store = self.store.current().map_err(|e| fetch_failed(stage, &key, e))?;
        let data = store.block_on(store.store().get(&key)).map_err(|e| fetch_failed(stage, &key, e))?;
        Ok(vec![Value::Bytes(Vec::from(data))])
    }

    fn is_async(&self) -> bool {
        true
    }

    fn call_async(&self, stage: &str, input: Value) -> BoxFuture<'static, Result<Vec<Value>, Error>> {
        let key = match self.key(stage, input) {
            Ok(key) => key,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let dedicated = match self.store.current() {
            Ok(s) => s,
            Err(e) => {
                let e = fetch_failed(stage, &key, e);
                return Box::pin(async move { Err(e) });
            }
        };
        let store = Arc::clone(dedicated.store());
        let task = {
            let key = key.clone();
            dedicated.handle().spawn(async move { store.get(&key).await })
        };
        let stage = stage.to_owned();
        Box::pin(async move {
            let _abort = AbortOnDrop(task.abort_handle());
            match task.await {
                Ok(Ok(data)) => Ok(vec![Value::Bytes(Vec::from(data))]),
                Ok(Err(e)) => Err(fetch_failed(&stage, &key, e)),
                // The request was cancelled (the store's runtime shut down) or panicked.
                Err(e) => Err(fetch_failed(&stage, &key, e)),
            }
        })
    }
}

impl std::fmt::Debug for PyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyStore").field("url", &self.url).finish_non_exhaustive()
    }
}

/// The shortest timeout taken (1 ms): 0 would fail every request.
const MIN_TIMEOUT: f64 = 0.001;

fn secs(what: &str, v: f64) -> PyResult<std::time::Duration> {
    args::duration_secs(what, v, MIN_TIMEOUT, args::MAX_SECONDS)
}

#[pymethods]
impl PyStore {
    /// Opens the store that ``url`` names. ``connect_timeout``/``read_timeout`` in seconds; ``attempt_timeout``
    /// caps one whole request, body included (seconds, default 600; ``None``: no cap), so a server that drips
    /// bytes cannot hold a call; ``max_attempts`` counts the first try (1 disables retries); ``max_in_flight``
    /// caps concurrent requests; ``max_object_size`` (bytes, default 2 GiB) refuses larger objects, from their
    /// stated size when there is one, with ``OSError``.
    ///
    /// Local directories only: ``follow_symlinks_outside_root`` (default ``False``: a key that leads out of the
    /// root through a link raises ``PermissionError``) and ``special_file_limit`` (default ``None``: FIFOs,
    /// devices and sockets raise ``OSError`` without being opened; a number of bytes reads them up to that).
    ///
    /// Every call waits without the GIL and wakes every 50 ms for signals: Ctrl-C raises ``KeyboardInterrupt``
    /// and cancels the request.
    ///
    /// For ``s3://`` addresses, ``endpoint`` (an S3-compatible server such as ``http://127.0.0.1:9000``),
    /// ``region``, ``access_key``/``secret_key`` (both or neither) and ``force_path_style`` (default: on when
    /// ``endpoint`` is given) override the standard AWS chain (``AWS_ACCESS_KEY_ID``, ``AWS_REGION``,
    /// ``AWS_ENDPOINT_URL``, ``~/.aws/config``...); other stores refuse them.
    #[staticmethod]
    #[pyo3(signature = (
        url, *, connect_timeout=10.0, read_timeout=30.0, max_attempts=None, max_in_flight=Int::from(64),
        endpoint=None, region=None, access_key=None, secret_key=None, force_path_style=None,
        attempt_timeout=Some(600.0), max_object_size=None, follow_symlinks_outside_root=false,
        special_file_limit=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn open(
        py: Python<'_>,
        url: String,
        connect_timeout: f64,
        read_timeout: f64,
        max_attempts: Option<Int>,
        max_in_flight: Int,
        endpoint: Option<String>,
        region: Option<String>,
        access_key: Option<String>,
        secret_key: Option<String>,
        force_path_style: Option<bool>,
        attempt_timeout: Option<f64>,
        max_object_size: Option<Int>,
        follow_symlinks_outside_root: bool,
        special_file_limit: Option<Int>,
    ) -> PyResult<Self> {
        let max_attempts = args::opt_count("max_attempts", max_attempts.as_ref(), 1, args::MAX_ATTEMPTS)?;
        let max_in_flight = args::count("max_in_flight", &max_in_flight, 1, args::MAX_CONCURRENCY)?;
        let max_object_size =
            max_object_size.map(|n| args::size_bytes("max_object_size", &n, 1, args::MAX_BYTES)).transpose()?;
        let special_file_limit =
            special_file_limit.map(|n| args::size_bytes("special_file_limit", &n, 0, args::MAX_BYTES)).transpose()?;
        let credentials = match (access_key, secret_key) {
            (Some(a), Some(s)) => Some((a, s)),
            (None, None) => None,
            _ => return Err(PyValueError::new_err("access_key and secret_key go together: give both or neither")),
        };
        let s3 = spdl_source::S3Options { region, endpoint, force_path_style, credentials };
        if s3 != spdl_source::S3Options::default() && !url.starts_with("s3://") {
            return Err(PyValueError::new_err(format!(
                "{url}: endpoint, region, access_key, secret_key and force_path_style apply to s3:// addresses only"
            )));
        }
        let mut opts = spdl_source::StoreOptions::default()
            .connect_timeout(secs("connect_timeout", connect_timeout)?)
            .read_timeout(secs("read_timeout", read_timeout)?)
            .max_in_flight(max_in_flight)
            .s3(s3);
        let remote = url.contains("://") && !url.starts_with("file://");
        if remote && (follow_symlinks_outside_root || special_file_limit.is_some()) {
            return Err(PyValueError::new_err(format!(
                "{url}: follow_symlinks_outside_root and special_file_limit apply to local directories only"
            )));
        }
        opts = match attempt_timeout {
            Some(t) => opts.attempt_timeout(secs("attempt_timeout", t)?),
            None => opts.no_attempt_timeout(),
        };
        if let Some(n) = max_object_size {
            opts = opts.max_object_size(n);
        }
        opts = opts.follow_links_outside_root(follow_symlinks_outside_root).special_file_limit(special_file_limit);
        if let Some(n) = max_attempts {
            opts = opts.retry(spdl_source::RetryPolicy { max_attempts: n as u32, ..Default::default() });
        }
        let cell = crate::lifecycle::detach(py, || StoreCell::open(&url, &opts)).map_err(source_err)?;
        Ok(PyStore { cell: Arc::new(cell), url })
    }

    /// The whole object ``key`` as ``bytes``.
    fn get<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let store = self.cell.current_py(py)?;
        let data = wait(py, &store, store.store().get(key))?;
        Ok(pyo3::types::PyBytes::new(py, &data))
    }

    /// Bytes ``start..end`` of object ``key`` (``end`` past the object's size is clipped).
    fn get_range<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        start: Int,
        end: Int,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let start = args::size_bytes("start", &start, 0, u64::MAX)?;
        let end = args::size_bytes("end", &end, 0, u64::MAX)?;
        let store = self.cell.current_py(py)?;
        let data = wait(py, &store, store.store().get_range(key, start..end))?;
        Ok(pyo3::types::PyBytes::new(py, &data))
    }

    /// The size in bytes of object ``key``, without reading it.
    fn size(&self, py: Python<'_>, key: &str) -> PyResult<u64> {
        let store = self.cell.current_py(py)?;
        wait(py, &store, store.store().head(key)).map(|m| m.size)
    }

    /// ``(key, size)`` of every object whose key starts with ``prefix``, in key order.
    #[pyo3(signature = (prefix=""))]
    fn list(&self, py: Python<'_>, prefix: &str) -> PyResult<Vec<(String, u64)>> {
        use futures::TryStreamExt;
        let store = self.cell.current_py(py)?;
        wait(py, &store, store.store().list(prefix).map_ok(|m| (m.key, m.size)).try_collect::<Vec<_>>())
    }

    /// Reads ``keys`` with up to ``concurrency`` requests in flight; returns their bytes in the order of
    /// ``keys``. The first failure raises, naming its key.
    #[pyo3(signature = (keys, *, concurrency=Int::from(16)))]
    fn get_many<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
        concurrency: Int,
    ) -> PyResult<Vec<Bound<'py, pyo3::types::PyBytes>>> {
        use futures::{StreamExt, TryStreamExt};
        let concurrency = args::count("concurrency", &concurrency, 1, args::MAX_CONCURRENCY)?;
        let dedicated = self.cell.current_py(py)?;
        let store = dedicated.store();
        let all = wait(
            py,
            &dedicated,
            futures::stream::iter(keys.iter().map(|k| store.get(k))).buffered(concurrency).try_collect::<Vec<_>>(),
        )?;
        Ok(all.iter().map(|b| pyo3::types::PyBytes::new(py, b)).collect())
    }

    /// A native pipeline op that turns each item (a key) into the object's ``bytes``, e.g.
    /// ``builder.pipe(store.get_op(), concurrency=32)``: the requests are awaited in Rust, so the stage holds
    /// ``concurrency`` of them in flight without taking the GIL or blocking a thread per request, and a
    /// following native op (``spdl_rs.io.ops.decode_image``...) keeps the whole chain out of Python. A failed
    /// key is counted as a failed item of the stage, its error naming the key.
    fn get_op(&self) -> PyNativeOp {
        PyNativeOp { op: Arc::new(FetchOp { store: Arc::clone(&self.cell) }) }
    }

    /// The address the store was opened with.
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    fn __repr__(&self) -> String {
        format!("Store({:?})", self.url)
    }
}

/// What a sampler's `__reduce__` returns: the function that rebuilds it and its arguments.
type Pickled<'py, A> = PyResult<(Bound<'py, PyAny>, A)>;

/// SPDL's checks of a distributed sampler's dataset size `n`, `rank` and `world_size`, with its `ValueError`
/// messages, then the module's cap on `world_size`; returns `(rank, world_size)`.
fn check_rank(n: &Int, rank: &Int, world_size: &Int) -> PyResult<(u64, u64)> {
    let err = |msg: String| Err(PyValueError::new_err(msg));
    if n.value() <= 0 {
        return err(format!("The size of dataset must be larger than 0. Found: {}", n.show()));
    }
    if world_size.value() <= 0 {
        return err(format!("`world_size` must be greater than zero. Found: {}", world_size.show()));
    }
    if rank.value() < 0 || rank.value() >= world_size.value() {
        return err(format!("`rank` ({}) must be within the range [0, {}).", rank.show(), world_size.show()));
    }
    let world_size = args::size_bytes("world_size", world_size, 1, args::MAX_WORLD_SIZE)?;
    Ok((rank.value() as u64, world_size))
}

/// `(this rank's count, the positions handed out over all ranks)` for `total` positions dealt round-robin:
/// the short last round left out (`drop_last_round`) or handed to the first ranks.
fn share(total: u128, rank: u64, world_size: u64, drop_last_round: bool) -> (u128, u128) {
    let (rank, world_size) = (u128::from(rank), u128::from(world_size));
    if drop_last_round {
        let per_rank = total / world_size;
        return (per_rank, per_rank * world_size);
    }
    (total / world_size + u128::from(rank < total % world_size), total)
}

/// Deals the indices ``0 .. n-1`` out to the ranks round-robin, in the same order at every iteration.
///
/// Rank ``r`` of ``world_size`` gets ``r, r + world_size, r + 2 * world_size, ...``: the ranks' shares are
/// disjoint. For a new order at each epoch use :py:class:`DistributedRandomSampler`.
///
/// When ``n`` is not a multiple of ``world_size``, the last round is short. By default it is left out, so
/// that every rank gets ``n // world_size`` indices (a warning says that some are never visited); with
/// ``ddp_drop_last_distributed_round=False`` every index is handed out and the first ``n % world_size``
/// ranks get one more.
///
/// .. code-block:: python
///
///     list(DistributedDeterministicSampler(10, rank=1, world_size=4))  # [1, 5]
///     list(DistributedDeterministicSampler(10, rank=1, world_size=4,
///                                          ddp_drop_last_distributed_round=False))  # [1, 5, 9]
///
/// Args:
///     n: The size of the dataset (positive).
///     rank: This process's rank, in ``[0, world_size)`` (e.g. ``torch.distributed.get_rank()``).
///     world_size: The number of ranks (e.g. ``torch.distributed.get_world_size()``).
///     ddp_drop_last_distributed_round: Leave out the short last round (the default), or hand it out.
///
/// Raises:
///     ValueError: ``n`` or ``world_size`` is not positive, ``rank`` is out of range, or the last round is
///         dropped while ``n < world_size``.
#[pyclass(name = "DistributedDeterministicSampler", module = "spdl_rs.source", frozen)]
#[derive(Debug)]
pub struct PyDistributedDeterministicSampler {
    rank: u64,
    world_size: u64,
    len: u128,
    total: u128,
}

#[pymethods]
impl PyDistributedDeterministicSampler {
    #[new]
    #[pyo3(signature = (n, /, *, rank, world_size, ddp_drop_last_distributed_round=true))]
    fn new(
        py: Python<'_>,
        n: Int,
        rank: Int,
        world_size: Int,
        ddp_drop_last_distributed_round: bool,
    ) -> PyResult<Self> {
        let (rank, world_size) = check_rank(&n, &rank, &world_size)?;
        let n_value = n.value() as u128;
        if ddp_drop_last_distributed_round {
            if n_value < u128::from(world_size) {
                return Err(PyValueError::new_err(format!(
                    "The size of dataset ({}) must be larger than or equal to the world size ({world_size}) when \
                     ddp_drop_last_distributed_round=True",
                    n.show()
                )));
            }
            if !n_value.is_multiple_of(u128::from(world_size)) {
                let msg = format!(
                    "The size of dataset ({}) is not divisible by the world size ({world_size}). Some samples are \
                     never visited.",
                    n.show()
                );
                let category = py.get_type::<pyo3::exceptions::PyUserWarning>();
                PyErr::warn(py, &category, &std::ffi::CString::new(msg)?, 1)?;
            }
        }
        let (len, total) = share(n_value, rank, world_size, ddp_drop_last_distributed_round);
        Ok(Self { rank, world_size, len, total })
    }

    /// The number of indices one iteration yields.
    fn __len__(&self) -> PyResult<usize> {
        usize::try_from(self.len).map_err(|_| pyo3::exceptions::PyOverflowError::new_err("the share is too large"))
    }

    /// Yields this rank's indices.
    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyIterator>> {
        let range = py.get_type::<pyo3::types::PyRange>().call1((self.rank, self.total, self.world_size))?;
        range.try_iter()
    }

    /// Pickles as the dealt share (unpickling neither checks nor warns again).
    fn __reduce__<'py>(&self, py: Python<'py>) -> Pickled<'py, (u64, u64, u128, u128)> {
        let rebuild = py.import("spdl_rs._native.source")?.getattr("_deterministic_sampler")?;
        Ok((rebuild, (self.rank, self.world_size, self.len, self.total)))
    }
}

/// `_deterministic_sampler(rank, world_size, len, total)`: a `DistributedDeterministicSampler` unpickled.
#[pyfunction]
pub(crate) fn _deterministic_sampler(
    rank: u64,
    world_size: u64,
    len: u128,
    total: u128,
) -> PyDistributedDeterministicSampler {
    PyDistributedDeterministicSampler { rank, world_size, len, total }
}

/// Draws a random order of dataset indices and deals it out to the ranks round-robin.
///
/// One iteration draws ``num_draws`` indices (default: ``n``) from NumPy's ``default_rng(seed)``; rank ``r``
/// gets draws ``r, r + world_size, ...``. Without ``weights`` the draw is a permutation (no index twice, the
/// ranks' shares are disjoint); with ``weights`` indices are drawn with replacement, with probability
/// proportional to their weight, and ``num_draws`` may exceed ``n``.
///
/// Every iteration yields the same sequence until :py:meth:`shuffle` sets another seed; the sequence depends
/// only on the current seed. Call ``sampler.shuffle(seed=epoch)`` before each epoch, or wrap the sampler
/// with :py:func:`spdl_rs.source.utils.embed_shuffle` (which also works when the sampler is iterated in a
/// subprocess).
///
/// When the number of draws is not a multiple of ``world_size``, the short last round is not drawn by default
/// (every rank gets ``num_draws // world_size``); with ``ddp_drop_last_distributed_round=False`` all draws
/// are made and the first ``num_draws % world_size`` ranks get one more.
///
/// .. code-block:: python
///
///     list(DistributedRandomSampler(9, rank=0, world_size=3))  # [0, 7, 4]
///     list(DistributedRandomSampler(9, rank=1, world_size=3))  # [8, 2, 6]
///     sampler = DistributedRandomSampler(5, rank=0, world_size=1, weights=[0, 0, 1, 1, 1], num_draws=10)
///     list(sampler)  # [3, 2, 2, 2, 4, 4, 3, 4, 3, 4]
///
/// Indices are yielded as Python ``int`` values (SPDL yields NumPy integers of the same values).
///
/// Args:
///     n: The size of the dataset (positive).
///     rank: This process's rank, in ``[0, world_size)``.
///     world_size: The number of ranks.
///     num_draws: Indices drawn per iteration over all ranks (default ``n``); at most ``n`` without
///         ``weights``.
///     weights: One non-negative, finite weight per index (at least one positive); enables drawing with
///         replacement.
///     seed: The seed of the first iterations (``None``: 0, SPDL's default).
///     ddp_drop_last_distributed_round: Leave out the short last round (the default), or draw it.
///
/// Raises:
///     ValueError: For a non-positive ``n``, ``world_size`` or ``num_draws``, an out-of-range ``rank``, fewer
///         draws than ranks while dropping the last round, more draws than ``n`` without weights, or weights
///         of the wrong length, negative, not finite, or summing to zero.
#[pyclass(name = "DistributedRandomSampler", module = "spdl_rs.source", frozen)]
#[derive(Debug)]
pub struct PyDistributedRandomSampler {
    n: u64,
    rank: u64,
    world_size: u64,
    /// The weights over their sum (a NumPy `float64` array), or `None`: a permutation.
    weights: Py<PyAny>,
    /// The seed of the next iterations (any Python int NumPy's `default_rng` takes).
    seed: std::sync::Mutex<Py<PyAny>>,
    len: u64,
    num_draws: u64,
}

/// The weights over their sum as a NumPy array (SPDL's checks and messages; NumPy's sum, as SPDL's).
fn normalized_weights<'py>(py: Python<'py>, weights: &Bound<'py, PyAny>, n: u64) -> PyResult<Bound<'py, PyAny>> {
    use pyo3::types::IntoPyDict;
    let size = weights.len()?;
    if size as u64 != n {
        return Err(PyValueError::new_err(format!(
            "When provided, the number of elements in `weights` ({size}) must be same as the size of dataset ({n})"
        )));
    }
    let np = py.import("numpy")?;
    let w = np.getattr("array")?.call((weights,), Some(&[("dtype", np.getattr("float64")?)].into_py_dict(py)?))?;
    let values: Vec<f64> = w.call_method0("tolist")?.extract()?;
    if values.iter().any(|v| !v.is_finite() || *v < 0.0) {
        return Err(PyValueError::new_err(
            "Failed to normalize the sample weight. Some elements are negative or not finite.",
        ));
    }
    let quiet = [("over", "ignore"), ("invalid", "ignore")].into_py_dict(py)?;
    let errstate = np.getattr("errstate")?.call((), Some(&quiet))?;
    errstate.call_method0("__enter__")?;
    let total = np.getattr("sum")?.call1((&w,));
    errstate.call_method1("__exit__", (py.None(), py.None(), py.None()))?;
    let total: f64 = total?.extract()?;
    if !total.is_finite() || total <= 0.0 {
        return Err(PyValueError::new_err("The sum of `weights` must be positive and finite."));
    }
    w.call_method1("__truediv__", (total,))
}

#[pymethods]
impl PyDistributedRandomSampler {
    #[new]
    #[pyo3(signature = (n, /, *, rank, world_size, num_draws=None, weights=None, seed=None, ddp_drop_last_distributed_round=true))]
    #[allow(clippy::too_many_arguments, reason = "SPDL's signature")]
    fn new(
        py: Python<'_>,
        n: Int,
        rank: Int,
        world_size: Int,
        num_draws: Option<Int>,
        weights: Option<Bound<'_, PyAny>>,
        seed: Option<Py<PyAny>>,
        ddp_drop_last_distributed_round: bool,
    ) -> PyResult<Self> {
        let (rank, world_size) = check_rank(&n, &rank, &world_size)?;
        if let Some(d) = num_draws.as_ref().filter(|d| d.value() <= 0) {
            return Err(PyValueError::new_err(format!("`num_draws` must be greater than zero. Found: {}", d.show())));
        }
        // Each iteration draws (and, without replacement, permutes) in memory: sizes within the order cap.
        let n = args::size_bytes("n", &n, 1, args::MAX_ITEMS)?;
        let total = match &num_draws {
            Some(d) => args::size_bytes("num_draws", d, 1, args::MAX_ITEMS)?,
            None => n,
        };
        if ddp_drop_last_distributed_round && total < world_size {
            return Err(PyValueError::new_err(format!(
                "The number of draws must be greater than or equal to `world_size` when \
                 ddp_drop_last_distributed_round=True. Found: num_draws={total}, world_size={world_size}"
            )));
        }
        let weights = match &weights {
            None if total > n => {
                return Err(PyValueError::new_err(format!(
                    "`num_draws` cannot exceed the dataset size when sampling without replacement. Found: \
                     num_draws={total}, dataset size={n}"
                )));
            }
            None => py.None(),
            Some(w) => normalized_weights(py, w, n)?.unbind(),
        };
        let (len, num_draws) = share(u128::from(total), rank, world_size, ddp_drop_last_distributed_round);
        let seed = seed.unwrap_or_else(|| pyo3::types::PyInt::new(py, 0).into_any().unbind());
        Ok(Self {
            n,
            rank,
            world_size,
            weights,
            seed: std::sync::Mutex::new(seed),
            len: len as u64,
            num_draws: num_draws as u64,
        })
    }

    /// The number of indices one iteration yields.
    fn __len__(&self) -> usize {
        self.len as usize
    }

    /// Yields this rank's share of the draws made with the current seed.
    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyIterator>> {
        use pyo3::types::IntoPyDict;
        let np = py.import("numpy")?;
        let seed = self.seed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone_ref(py);
        let rng = np.getattr("random")?.getattr("default_rng")?.call1((seed,))?;
        let kwargs = [("size", self.num_draws.into_pyobject(py)?.into_any())].into_py_dict(py)?;
        kwargs.set_item("replace", !self.weights.is_none(py))?;
        kwargs.set_item("p", &self.weights)?;
        let drawn = rng.getattr("choice")?.call((self.n,), Some(&kwargs))?;
        let slice = pyo3::types::PySlice::new(py, self.rank as isize, isize::MAX, self.world_size as isize);
        drawn.get_item(slice)?.call_method0("tolist")?.try_iter()
    }

    /// Sets the seed of the following iterations (the order depends on this seed alone, not on history).
    fn shuffle(&self, seed: Py<PyAny>) {
        *self.seed.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = seed;
    }

    /// Pickles as the checked configuration and the current seed.
    fn __reduce__<'py>(&self, py: Python<'py>) -> Pickled<'py, RandomSamplerState> {
        let rebuild = py.import("spdl_rs._native.source")?.getattr("_random_sampler")?;
        let seed = self.seed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone_ref(py);
        let state = (self.n, self.rank, self.world_size, self.weights.clone_ref(py), seed, self.len, self.num_draws);
        Ok((rebuild, state))
    }
}

/// What a pickled `DistributedRandomSampler` holds: `(n, rank, world_size, weights, seed, len, num_draws)`.
type RandomSamplerState = (u64, u64, u64, Py<PyAny>, Py<PyAny>, u64, u64);

/// `_random_sampler(n, rank, world_size, weights, seed, len, num_draws)`: a `DistributedRandomSampler`
/// unpickled.
#[pyfunction]
#[allow(clippy::too_many_arguments, reason = "the pickled fields")]
pub(crate) fn _random_sampler(
    n: u64,
    rank: u64,
    world_size: u64,
    weights: Py<PyAny>,
    seed: Py<PyAny>,
    len: u64,
    num_draws: u64,
) -> PyDistributedRandomSampler {
    PyDistributedRandomSampler { n, rank, world_size, weights, seed: std::sync::Mutex::new(seed), len, num_draws }
}
