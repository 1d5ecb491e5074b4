//! # spdl-loader: the image-loading recipe
//!
//! One call wires what every image loader needs, on top of the spdl-rs crates:
//!
//! ```text
//! Listing ──> read (async, ObjectStore) ──> aggregate ──> decode + transform a batch ──> [h2d] ──> Batch
//!             spdl-source                  spdl-exec     spdl-io (blocking pool)          spdl-cuda
//! ```
//!
//! - [`Listing::open`] lists a directory (class folders give labels), a list file, or an object
//!   store (`s3://bucket/prefix`, or `http(s)://` with a list file), and opens the store the
//!   bytes come from: bytes come in one way, through an `ObjectStore` (the local store for
//!   files, which reads regular files only, size-capped).
//! - [`ImageLoader::new`] builds the [`spdl_exec::Pipeline`]: reads `io_concurrency` images at
//!   once, groups them by `batch_size`, decodes each batch with one
//!   [`spdl_io::image::BatchDecoder`] call straight into a recycled (or pinned) batch buffer,
//!   and, with a GPU, queues the batch's copy. An image that fails to read or decode is a
//!   failed item of its stage (`read` or `decode`, in the stats and against the budgets);
//!   the rest of its batch goes on.
//!
//! ```
//! use spdl_loader::{ImageLoader, Listing, ListOptions, LoaderOptions};
//!
//! let dir = tempfile::tempdir()?;
//! spdl_io::synth::write_dataset(dir.path(), 40, 3, 2)?; // 40 synthetic JPEGs in 2 classes
//! let listing = Listing::open(dir.path().to_str().unwrap(), &ListOptions::default())?;
//! let loader = ImageLoader::new(listing, LoaderOptions { batch_size: 8, ..LoaderOptions::default() })?;
//! let mut images = 0;
//! for batch in loader.pipeline() {
//!     images += batch?.labels.len();
//! }
//! assert_eq!(images, 40);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use spdl_buffer::{CachingPool, HeapBackend, Layout, PoolConfig, PoolStats, SharedAllocator};
use spdl_exec::{
    BuildOptions, FailureBudget, ItemFailure, OutputOrder, Partial, Pipeline, PipelineBuilder, PipelineError, Stage,
};
use spdl_io::image::{BatchDecoder, BatchOptions, Normalize, ResizeFilter, Transform};
use spdl_source::{DedicatedStore, FolderLayout, SourceError, StoreOptions};

#[cfg(feature = "video")]
mod clips;
pub mod usage;
#[cfg(feature = "video")]
pub use clips::{ClipBatch, ClipLoader, ClipLoaderOptions, ClipSampling, MAX_CLIP_FRAMES, MAX_CLIP_SIDE};

/// Extensions a listing keeps by default.
pub const IMAGE_EXTENSIONS: &[&str] = &["jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"];
/// Extensions a video listing keeps ([`Listing::open_with_extensions`]; the clip recipe, feature `video`).
pub const VIDEO_EXTENSIONS: &[&str] = &["mp4", "mkv", "webm", "avi", "mov"];
/// Most decode threads: each is a thread with its own buffers.
pub const MAX_THREADS: usize = 1024;
/// Most reads in flight.
pub const MAX_IO_CONCURRENCY: usize = 4096;
/// Largest batch.
pub const MAX_BATCH_SIZE: usize = 65_536;

/// What can go wrong when listing or building a loader.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoaderError {
    /// An option is out of range.
    #[error("invalid loader option `{option}`: {reason}")]
    InvalidOption {
        /// The option.
        option: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The dataset could not be listed or its store opened.
    #[error("cannot list {location}")]
    List {
        /// The path or address.
        location: String,
        /// Why.
        #[source]
        source: SourceError,
    },
    /// The listing found no file with the extensions it keeps.
    #[error("no {} ({extensions}) found in {location}", if *extensions == IMAGE_EXTENSIONS.join(", ") { "images" } else { "files" })]
    Empty {
        /// The path or address.
        location: String,
        /// The extensions looked for, comma-separated.
        extensions: String,
    },
    /// A GPU is present but could not be set up.
    #[error("a GPU is present but could not be set up")]
    Gpu(#[source] spdl_cuda::Error),
    /// The decoder's options are invalid.
    #[error("invalid decode options")]
    Decoder(#[source] spdl_io::Error),
    /// The pipeline could not be built.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
}

/// One image of a listing: its key in the store and its label (-1: none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// The key the store reads it by.
    pub key: String,
    /// The class index, or -1.
    pub label: i64,
}

/// How to list a dataset.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    /// Read the keys of the list file given as the path from this store (`s3://...`, `http(s)://...`).
    pub store: Option<String>,
    /// An S3-compatible server (path-style addressing) instead of AWS, for `s3://` stores.
    pub endpoint: Option<String>,
}

/// A listed dataset and the store its bytes are read from.
pub struct Listing {
    /// The images, in order.
    pub samples: Vec<Sample>,
    /// Where they were listed (for messages).
    pub location: String,
    store: Arc<DedicatedStore>,
}

impl std::fmt::Debug for Listing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listing").field("location", &self.location).field("samples", &self.samples.len()).finish()
    }
}

fn is_store_url(s: &str) -> bool {
    ["s3://", "http://", "https://"].iter().any(|p| s.starts_with(p))
}

fn list_error(location: &str) -> impl FnOnce(SourceError) -> LoaderError + '_ {
    move |source| LoaderError::List { location: location.to_owned(), source }
}

/// A store of its own, with one I/O thread: its connections (or blocking file reads) live there,
/// and the pipeline's runtime only awaits them.
fn open_store(url: &str, opts: &StoreOptions) -> Result<DedicatedStore, LoaderError> {
    DedicatedStore::open(url, opts, 1).map_err(list_error(url))
}

impl Listing {
    /// Lists `path`: a directory (recursive; class folders become labels, a directory without
    /// any is listed flat), a list file (one key per line, relative to the file's directory),
    /// or an object store address. With [`ListOptions::store`], `path` is a list file of keys
    /// in that store.
    pub fn open(path: &str, opts: &ListOptions) -> Result<Self, LoaderError> {
        Self::open_with_extensions(path, opts, IMAGE_EXTENSIONS)
    }

    /// [`Listing::open`], keeping the files whose extension (case-insensitive) is one of `extensions`
    /// when listing a directory or a store (a list file names what it names), e.g. [`VIDEO_EXTENSIONS`].
    ///
    /// ```
    /// use spdl_loader::{ListOptions, Listing, LoaderError, VIDEO_EXTENSIONS};
    ///
    /// let dir = tempfile::tempdir()?;
    /// std::fs::write(dir.path().join("a.mp4"), b"not really a video")?;
    /// std::fs::write(dir.path().join("b.jpg"), b"not an image")?;
    /// let listing = Listing::open_with_extensions(dir.path().to_str().unwrap(), &ListOptions::default(), VIDEO_EXTENSIONS)?;
    /// assert_eq!(listing.samples.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_with_extensions(path: &str, opts: &ListOptions, extensions: &[&str]) -> Result<Self, LoaderError> {
        let url = match &opts.store {
            Some(url) => Some(url.clone()),
            None if is_store_url(path) => Some(path.to_owned()),
            None => None,
        };
        let Some(url) = url else {
            if opts.endpoint.is_some() {
                return Err(LoaderError::InvalidOption {
                    option: "endpoint",
                    reason: "applies to s3:// stores only".into(),
                });
            }
            return Self::open_local(Path::new(path), extensions);
        };
        let mut store_opts = StoreOptions::default();
        if let Some(endpoint) = &opts.endpoint {
            store_opts =
                store_opts.s3(spdl_source::S3Options { endpoint: Some(endpoint.clone()), ..Default::default() });
        }
        let store = open_store(&url, &store_opts)?;
        let dataset = if opts.store.is_some() {
            spdl_source::Dataset::from_manifest(Path::new(path)).map_err(list_error(path))?
        } else {
            store
                .block_on(spdl_source::Dataset::from_store(&**store.store(), "", extensions, FolderLayout::Auto))
                .map_err(list_error(&url))?
        };
        let samples = dataset.iter().map(|r| Sample { key: r.key.clone(), label: r.label.unwrap_or(-1) }).collect();
        Self::checked(samples, url, store, extensions)
    }

    fn open_local(path: &Path, extensions: &[&str]) -> Result<Self, LoaderError> {
        let location = path.display().to_string();
        let io = |e: std::io::Error| LoaderError::List {
            location: location.clone(),
            source: SourceError::Io { operation: "open", path: path.to_path_buf(), source: e },
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        if !meta.is_dir() && !meta.is_file() {
            // A FIFO would block the listing forever, /dev/zero would never end.
            return Err(LoaderError::InvalidOption {
                option: "path",
                reason: format!("{location} is not a directory nor a regular file (a list of paths)"),
            });
        }
        let (dataset, root) = if meta.is_dir() {
            let d = spdl_source::Dataset::from_dir_with_layout(path, extensions, FolderLayout::Auto)
                .map_err(list_error(&location))?;
            (d, path.to_path_buf())
        } else {
            let d = spdl_source::Dataset::from_manifest(path).map_err(list_error(&location))?;
            (d, path.parent().map(Path::to_path_buf).unwrap_or_default())
        };
        let root = if root.as_os_str().is_empty() { PathBuf::from(".") } else { root };
        // Keys of a list file may be absolute or climb out of its directory: such a listing is read
        // from the file system's root, with every key made absolute.
        let needs_root = dataset.iter().any(|r| {
            let p = Path::new(&r.key);
            p.is_absolute() || p.components().any(|c| matches!(c, std::path::Component::ParentDir))
        });
        let (store_root, samples): (PathBuf, Vec<Sample>) = if needs_root {
            let base = std::fs::canonicalize(&root).map_err(io)?;
            let samples = dataset
                .iter()
                .map(|r| {
                    let full = base.join(&r.key);
                    let key = full.strip_prefix("/").unwrap_or(&full).to_string_lossy().into_owned();
                    Sample { key, label: r.label.unwrap_or(-1) }
                })
                .collect();
            (PathBuf::from("/"), samples)
        } else {
            (root, dataset.iter().map(|r| Sample { key: r.key.clone(), label: r.label.unwrap_or(-1) }).collect())
        };
        // Links out of the root are followed: a listing names what it names (a list file may point
        // anywhere its reader may read).
        let store_opts = StoreOptions { follow_links_outside_root: true, ..StoreOptions::default() };
        let store = open_store(&store_root.to_string_lossy(), &store_opts)?;
        Self::checked(samples, location, store, extensions)
    }

    fn checked(
        samples: Vec<Sample>,
        location: String,
        store: DedicatedStore,
        extensions: &[&str],
    ) -> Result<Self, LoaderError> {
        if samples.is_empty() {
            return Err(LoaderError::Empty { location, extensions: extensions.join(", ") });
        }
        Ok(Self { samples, location, store: Arc::new(store) })
    }

    /// The samples at `indices`, in that order (a shuffled, sharded epoch from a sampler), over
    /// the same store. Indices out of range are skipped.
    pub fn select(&self, indices: &[usize]) -> Listing {
        let samples = indices.iter().filter_map(|&i| self.samples.get(i).cloned()).collect();
        Listing { samples, location: self.location.clone(), store: Arc::clone(&self.store) }
    }

    /// Keeps the first `n` samples.
    pub fn truncate(&mut self, n: usize) {
        self.samples.truncate(n);
    }

    /// Whether the store is remote (an object store rather than local files).
    pub fn is_remote(&self) -> bool {
        is_store_url(&self.location)
    }
}

/// Whether batches go to the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuMode {
    /// Use a GPU when one can be used (feature `cuda`, a driver and a device at run time).
    #[default]
    Auto,
    /// Host batches only.
    Off,
}

/// Options of an [`ImageLoader`].
#[derive(Debug, Clone)]
pub struct LoaderOptions {
    /// Images per batch (default 32).
    pub batch_size: usize,
    /// Batches decoded at once, and the threads of the pipeline's pool (default 4).
    pub threads: usize,
    /// Reads in flight (default: 16 for local files, 64 for an object store).
    pub io_concurrency: Option<usize>,
    /// Passes over the listing (default 1).
    pub epochs: usize,
    /// What each image becomes (default: ImageNet's evaluation transform at 224).
    pub transform: Transform,
    /// Normalize to f32 with ImageNet's mean and std, fused into the batch write.
    pub normalize: bool,
    /// Axis order of a batch (default NHWC).
    pub layout: Layout,
    /// Whether batches go to the GPU.
    pub gpu: GpuMode,
    /// Most bytes of batch buffers kept for reuse on the host (default 2 GiB).
    pub batch_pool_bytes: usize,
    /// Order of the batches: as they are decoded (default), or in the listing's order.
    pub order: OutputOrder,
    /// The failures the whole pipeline tolerates (default: unlimited; each failure is logged).
    pub failure_budget: FailureBudget,
    /// Tune the reads in flight and the batches decoded at once while the pipeline runs,
    /// starting from `io_concurrency` and `threads` ([`spdl_exec::BuildOptions::autotune`]);
    /// the pool grows with the decode concurrency. Default off.
    pub autotune: bool,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        Self {
            batch_size: 32,
            threads: 4,
            io_concurrency: None,
            epochs: 1,
            transform: eval_transform(224),
            normalize: false,
            layout: Layout::Nhwc,
            gpu: GpuMode::Auto,
            batch_pool_bytes: 2 << 30,
            order: OutputOrder::Completion,
            failure_budget: FailureBudget::Unlimited,
            autotune: false,
        }
    }
}

/// ImageNet's evaluation transform: the shorter side resized to `size * 256 / 224`, then a
/// center crop of `size` x `size`.
pub fn eval_transform(size: u32) -> Transform {
    spdl_io::image::TransformName::CenterCrop.transform(size, size, ResizeFilter::Bilinear, 0)
}

/// The bounds every recipe's pipeline options share: threads, batch size, reads in flight, epochs.
pub(crate) fn check_pipeline_options(
    threads: usize,
    batch_size: usize,
    io_concurrency: Option<usize>,
    epochs: usize,
) -> Result<(), LoaderError> {
    let bad = |option, reason: String| Err(LoaderError::InvalidOption { option, reason });
    if threads == 0 || threads > MAX_THREADS {
        return bad("threads", format!("must be within 1..={MAX_THREADS}, got {threads}"));
    }
    if batch_size == 0 || batch_size > MAX_BATCH_SIZE {
        return bad("batch_size", format!("must be within 1..={MAX_BATCH_SIZE}, got {batch_size}"));
    }
    if let Some(c) = io_concurrency
        && (c == 0 || c > MAX_IO_CONCURRENCY)
    {
        return bad("io_concurrency", format!("must be within 1..={MAX_IO_CONCURRENCY}, got {c}"));
    }
    if epochs == 0 {
        return bad("epochs", "must be at least 1".into());
    }
    Ok(())
}

impl LoaderOptions {
    /// Checks every option against its bounds, and one batch's bytes against the decode memory budget:
    /// what opening a loader checks first, for a front end (the CLI, Python) that wants the error before it
    /// lists anything. Each option is checked here only.
    ///
    /// ```
    /// use spdl_loader::{LoaderError, LoaderOptions};
    /// assert!(LoaderOptions::default().validate().is_ok());
    /// let bad = LoaderOptions { batch_size: 0, ..LoaderOptions::default() };
    /// assert!(matches!(bad.validate(), Err(LoaderError::InvalidOption { option: "batch_size", .. })));
    /// ```
    pub fn validate(&self) -> Result<(), LoaderError> {
        let bad = |option, reason: String| Err(LoaderError::InvalidOption { option, reason });
        check_pipeline_options(self.threads, self.batch_size, self.io_concurrency, self.epochs)?;
        // The bytes of one batch, checked against the process's decode memory budget before any is paid.
        let (w, h) = self.transform.output_size().unwrap_or((0, 0));
        let sample = if self.normalize { 4u64 } else { 1 };
        let batch_bytes = (self.batch_size as u64)
            .saturating_mul(u64::from(w))
            .saturating_mul(u64::from(h))
            .saturating_mul(3 * sample);
        let budget = spdl_io::decode_memory_budget();
        if batch_bytes > budget {
            return bad(
                "batch_size",
                format!(
                    "one batch of {} images of {w}x{h} is {batch_bytes} bytes, above the decode memory budget of \
                     {budget} bytes",
                    self.batch_size
                ),
            );
        }
        Ok(())
    }
}

/// Where a batch's pixels are.
#[derive(Debug)]
pub enum Images {
    /// In host memory (pinned when a GPU is used).
    Host(spdl_buffer::Buffer),
    /// On the GPU; the copy may still be running (its event orders later work on the device).
    Device(spdl_cuda::DeviceBuffer),
}

impl Images {
    /// The batch's outer length (images).
    pub fn len(&self) -> usize {
        match self {
            Images::Host(b) => b.shape().first().copied().unwrap_or(0),
            Images::Device(d) => d.shape().first().copied().unwrap_or(0),
        }
    }

    /// Whether the batch holds no image.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A decoded batch, as the training loop receives it.
#[derive(Debug)]
pub struct Batch {
    /// The pixels, `[N, H, W, C]` or `[N, C, H, W]`.
    pub images: Images,
    /// One label per slot (-1: none).
    pub labels: Vec<i64>,
    /// Slots whose image failed to decode (zero-filled); each is also a failed item of `decode`.
    pub failed: usize,
}

/// Whether the loader uses a GPU, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuStatus {
    /// Batches are pinned and copied to this device.
    Used {
        /// The device's index.
        index: usize,
        /// Its name.
        name: String,
    },
    /// [`GpuMode::Off`].
    Off,
    /// No GPU could be used (no driver, no device, or built without the `cuda` feature).
    Unavailable,
}

/// One bytes-on-the-way sample.
struct Encoded {
    /// Where the bytes came from (the store's full address of the key), naming the image in failures.
    location: String,
    label: i64,
    seed_key: u64,
    bytes: Vec<u8>,
}

/// The key that seeds the random transform of the `index`-th sample in `epoch`: crops differ
/// across epochs and images, and do not depend on which batch or thread decodes them.
pub fn item_key(epoch: usize, index: usize) -> u64 {
    ((epoch as u64) << 40) ^ index as u64
}

/// The image-loading pipeline and what it owns.
pub struct ImageLoader {
    // Dropped first: the pipeline's stages hold clones of the store.
    pipeline: Pipeline<Batch>,
    gpu: Option<Arc<spdl_cuda::Transfer>>,
    status: GpuStatus,
    heap_pool: Option<Arc<CachingPool<HeapBackend>>>,
    listing: Listing,
}

impl std::fmt::Debug for ImageLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageLoader").field("listing", &self.listing).field("gpu", &self.status).finish()
    }
}

fn open_gpu(mode: GpuMode) -> Result<(Option<Arc<spdl_cuda::Transfer>>, GpuStatus), LoaderError> {
    if mode == GpuMode::Off {
        return Ok((None, GpuStatus::Off));
    }
    match spdl_cuda::Transfer::open_if_available(&spdl_cuda::TransferConfig::default()) {
        Ok(Some(t)) => {
            let status =
                GpuStatus::Used { index: t.device().index(), name: t.device().name().unwrap_or_else(|_| "?".into()) };
            Ok((Some(Arc::new(t)), status))
        }
        Ok(None) => Ok((None, GpuStatus::Unavailable)),
        Err(e) => Err(LoaderError::Gpu(e)),
    }
}

impl ImageLoader {
    /// Builds the pipeline over `listing` (it starts on the first batch asked).
    pub fn new(listing: Listing, opts: LoaderOptions) -> Result<Self, LoaderError> {
        opts.validate()?;
        let (gpu, status) = open_gpu(opts.gpu)?;
        // Batches are recycled either way: pinned blocks with a GPU, a heap pool without one (no mmap, page
        // faults and munmap per batch; RSS stays flat). The cap keeps a stalled consumer from growing it.
        let (allocator, heap_pool): (SharedAllocator, _) = match &gpu {
            Some(t) => (t.allocator(), None),
            None => {
                let pool = Arc::new(CachingPool::new(HeapBackend, PoolConfig { max_bytes: opts.batch_pool_bytes }));
                (pool.clone(), Some(pool))
            }
        };
        let decoder = Arc::new(
            BatchDecoder::new(
                BatchOptions {
                    transform: opts.transform,
                    layout: opts.layout,
                    normalize: opts.normalize.then(Normalize::imagenet),
                    strict: false,
                    threads: Some(1),
                    ..BatchOptions::default()
                },
                allocator,
            )
            .map_err(LoaderError::Decoder)?,
        );
        let io_concurrency = opts.io_concurrency.unwrap_or(if listing.is_remote() { 64 } else { 16 });
        // The read stage keeps the store (its runtime) alive as long as the pipeline.
        let store = Arc::clone(listing.store.store());
        let handle = listing.store.handle().clone();
        let samples = Arc::new(listing.samples.clone());
        let epochs = opts.epochs;
        let source = (0..epochs).flat_map(move |epoch| {
            let samples = Arc::clone(&samples);
            (0..samples.len()).map(move |i| (epoch, i, Arc::clone(&samples)))
        });
        let read = Stage::map_async("read", move |(epoch, i, samples): (usize, usize, Arc<Vec<Sample>>)| {
            let store = Arc::clone(&store);
            let handle = handle.clone();
            async move {
                let Sample { key, label } = samples[i].clone();
                let location = store.location(&key);
                // On the store's own runtime: its connections (or its blocking file reads) live there.
                let task = {
                    let key = key.clone();
                    handle.spawn(async move { store.get(&key).await })
                };
                match task.await {
                    Ok(Ok(bytes)) => {
                        Ok(Encoded { location, label, seed_key: item_key(epoch, i), bytes: Vec::from(bytes) })
                    }
                    // The error names the object's address and the cause.
                    Ok(Err(e)) => Err(spdl_report::error_chain(&e)),
                    Err(e) => Err(format!("{location}: the read was cancelled: {e}")),
                }
            }
        })
        .concurrency(io_concurrency)
        .tune(1, io_concurrency.max(256));
        // One decoded batch: what a decode call in flight and each queued batch hold.
        let (w, h) = opts.transform.output_size().unwrap_or((224, 224));
        let elem = if opts.normalize { 4 } else { 1 };
        let batch_bytes = (opts.batch_size as u64).saturating_mul(u64::from(w) * u64::from(h) * 3 * elem);
        let decode = Stage::map_partial("decode", move |batch: Vec<Encoded>| {
            let named: Vec<(&str, &[u8])> = batch.iter().map(|e| (e.location.as_str(), e.bytes.as_slice())).collect();
            let keys: Vec<u64> = batch.iter().map(|e| e.seed_key).collect();
            let out = decoder.decode_keyed(&named, &keys)?;
            let failures: Vec<ItemFailure> = out
                .failures
                .iter()
                .map(|f| {
                    let (i, cause) = f.batch_item().unwrap_or((usize::MAX, f));
                    let item = batch.get(i).map_or_else(|| f.item().unwrap_or("?").to_owned(), |e| e.location.clone());
                    ItemFailure::part(item, spdl_report::error_chain(cause))
                })
                .collect();
            let output = Batch {
                images: Images::Host(out.buffer),
                labels: batch.iter().map(|e| e.label).collect(),
                failed: failures.len(),
            };
            Ok::<_, spdl_io::Error>(Partial { output, parts: batch.len() as u64, failures })
        })
        .concurrency(opts.threads)
        .tune(1, MAX_THREADS.min(4 * std::thread::available_parallelism().map_or(1, |n| n.get())).max(opts.threads))
        .item_bytes(batch_bytes)
        .order(opts.order);
        let builder = PipelineBuilder::new().source(source).pipe(read).aggregate(opts.batch_size).pipe(decode);
        let builder = match &gpu {
            // One copy stream: copies queue in order on the copy engine and overlap decoding and compute.
            Some(t) => {
                let t = Arc::clone(t);
                builder.pipe(Stage::map("h2d", move |batch: Batch| match batch.images {
                    Images::Host(host) => Ok(Batch {
                        images: Images::Device(t.transfer(host)?),
                        labels: batch.labels,
                        failed: batch.failed,
                    }),
                    Images::Device(_) => Ok::<_, spdl_cuda::Error>(batch),
                }))
            }
            None => builder,
        };
        let build = BuildOptions {
            num_threads: opts.threads,
            failure_budget: opts.failure_budget,
            autotune: opts.autotune,
            ..BuildOptions::default()
        };
        let pipeline = builder.sink(3).build(build)?;
        Ok(Self { pipeline, gpu, status, heap_pool, listing })
    }

    /// The pipeline: iterate it for batches (each [`spdl_exec::Pipeline::iter`] is one epoch's
    /// worth, here all epochs), read its stats, stop it.
    pub fn pipeline(&self) -> &Pipeline<Batch> {
        &self.pipeline
    }

    /// Whether a GPU is used.
    pub fn gpu_status(&self) -> &GpuStatus {
        &self.status
    }

    /// The GPU transfer, when one is used (its stats: H2D bytes and GB/s, the pinned pool).
    pub fn transfer(&self) -> Option<&spdl_cuda::Transfer> {
        self.gpu.as_deref()
    }

    /// The host batch pool's stats, when batches are not pinned.
    pub fn batch_pool_stats(&self) -> Option<PoolStats> {
        self.heap_pool.as_ref().map(|p| p.stats())
    }

    /// Images per epoch.
    pub fn images_per_epoch(&self) -> usize {
        self.listing.samples.len()
    }

    /// Failed images so far: failed reads and failed decodes (each image of a batch that
    /// failed as a whole counts once per image).
    pub fn failed_images(&self) -> u64 {
        let stats = self.pipeline.stats();
        let read = stats.stage("read").map_or(0, |s| s.items_failed);
        let decode = stats.stage("decode").map_or(0, |s| s.items_failed);
        read + decode
    }
}
