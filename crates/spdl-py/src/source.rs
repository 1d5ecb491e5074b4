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
