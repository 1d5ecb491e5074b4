//! `spdl_rs.loader.ImageLoader`: spdl-loader's image-loading recipe for Python (list → read through the
//! store → decode a batch → batches of `spdl_rs.Buffer`), the same pipeline `spdl bench` runs, with no Python
//! call per image.

use std::sync::Arc;

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use spdl_buffer::Layout;
use spdl_exec::Item;
use spdl_io::image::{ResizeFilter, Transform, TransformName, UnknownTransform};
use spdl_loader::{GpuMode, ListOptions, Listing, LoaderError, LoaderOptions};

use crate::args::{self, Int};
use crate::buffer::PyBuffer;
use crate::io::options::{KeywordOptions, keyword_options};
use crate::signals::{SIGNAL_POLL, wait_with_signals};

mod demo;
pub(crate) use demo::run_demo;

/// The next batch of `pipeline`, waiting without the GIL (Ctrl-C raises `KeyboardInterrupt`); `None` at the end.
fn next_batch<T: Send + 'static>(py: Python<'_>, pipeline: &spdl_exec::Pipeline<T>, what: &str) -> PyResult<Option<T>> {
    let next = wait_with_signals(py, || match pipeline.get_item(Some(SIGNAL_POLL)) {
        Ok(Some(Item::Data(batch))) => Some(Ok(Some(batch))),
        Ok(Some(Item::EpochEnd { .. })) => None,
        Ok(None) => Some(Ok(None)),
        Err(e) if e.is_timeout() => None,
        Err(e) => Some(Err(e)),
    })?;
    next.map_err(|e| PyRuntimeError::new_err(format!("the {what} failed: {}", spdl_report::error_chain(&e))))
}

/// A recipe made in this process: used only here (a forked child gets `RuntimeError`), and leaked rather than
/// dropped in a child, whose copy of its pipeline's threads does not exist.
struct MadeHere<T> {
    inner: std::mem::ManuallyDrop<T>,
    made_in: u64,
    what: &'static str,
}

impl<T> MadeHere<T> {
    fn new(inner: T, made_in: u64, what: &'static str) -> Self {
        Self { inner: std::mem::ManuallyDrop::new(inner), made_in, what }
    }

    /// The recipe, if it was made in this process (not inherited through a fork).
    fn get(&self) -> PyResult<&T> {
        crate::lifecycle::check_not_forked(self.made_in, self.what)?;
        Ok(&self.inner)
    }
}

impl<T> Drop for MadeHere<T> {
    fn drop(&mut self) {
        if !crate::lifecycle::made_before_fork(self.made_in) {
            // SAFETY: dropped once, here; `inner` is not used after.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.inner) };
        }
    }
}

/// The per-stage stats table of `pipeline` (GIL released).
fn stats_table<T: Send + 'static>(py: Python<'_>, pipeline: &spdl_exec::Pipeline<T>) -> String {
    crate::lifecycle::detach(py, || pipeline.stats().to_string())
}

/// Stops `pipeline` and joins its threads (GIL released).
fn stop_pipeline<T: Send + 'static>(py: Python<'_>, pipeline: &spdl_exec::Pipeline<T>) {
    crate::lifecycle::detach(py, || pipeline.stop());
}

fn loader_err(e: LoaderError) -> PyErr {
    match e {
        LoaderError::List { .. } => PyOSError::new_err(spdl_report::error_chain(&e)),
        other => PyValueError::new_err(spdl_report::error_chain(&other)),
    }
}

fn transform(name: &str, size: u32, seed: u64) -> PyResult<Transform> {
    let name: TransformName = name.parse().map_err(|e: UnknownTransform| PyValueError::new_err(e.to_string()))?;
    Ok(name.transform(size, size, ResizeFilter::Bilinear, seed))
}

keyword_options! {
    /// The loader's keyword options.
    struct ImageLoaderArgs {
        batch_size: Int = Int::from(32),
        num_threads: Int = Int::from(4),
        io_concurrency: Option<Int> = None,
        epochs: Int = Int::from(1),
        size: Int = Int::from(224),
        transform: String = "center-crop".to_owned(),
        seed: u64 = 0,
        normalize: bool = false,
        layout: String = "NHWC".to_owned(),
        store: Option<String> = None,
        endpoint: Option<String> = None,
        limit: Option<Int> = None,
    }
}

/// Loads batches of images from a directory (class folders give labels), a list file or an object store
/// (`s3://bucket/prefix`; `http(s)://` with `store=` and a list file), decoded and transformed in Rust.
/// Iterating yields `(images, labels)`: an `spdl_rs.Buffer` `[N, H, W, 3]` (`uint8`, or `float32` with
/// `normalize`) and a list of ints (-1: no label). An image that fails is logged and counted (`failed_images`).
///
/// A loader made before a `fork` raises `RuntimeError` in the child (its pipeline's threads are the
/// parent's) and is leaked there, not stopped, when dropped.
#[pyclass(module = "spdl_rs._native.loader", frozen)]
pub struct ImageLoader {
    inner: MadeHere<spdl_loader::ImageLoader>,
}

impl ImageLoader {
    /// The loader, if it was made in this process (not inherited through a fork).
    fn get(&self) -> PyResult<&spdl_loader::ImageLoader> {
        self.inner.get()
    }
}

impl std::fmt::Debug for ImageLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.inner.fmt(f)
    }
}

#[pymethods]
impl ImageLoader {
    /// Lists `path` and builds the pipeline (it starts on the first batch asked). Keywords: `batch_size`,
    /// `num_threads`, `io_concurrency`, `epochs`, `size`, `transform` (`"center-crop"`, `"resize"`,
    /// `"random-resized-crop"`), `seed`, `normalize`, `layout` (`"NHWC"`, `"NCHW"`), `store`, `endpoint`,
    /// `limit` (images per epoch).
    #[new]
    #[pyo3(signature = (path, **options: "Unpack[ImageLoaderArgs]"))]
    fn new(py: Python<'_>, path: String, options: Option<Bound<'_, pyo3::types::PyDict>>) -> PyResult<Self> {
        let args = ImageLoaderArgs::from_kwargs("ImageLoader", options.as_ref())?;
        let layout = match args.layout.as_str() {
            "NHWC" => Layout::Nhwc,
            "NCHW" => Layout::Nchw,
            other => return Err(PyValueError::new_err(format!("layout must be \"NHWC\" or \"NCHW\", got {other:?}"))),
        };
        let batch_size = args::count("batch_size", &args.batch_size, 1, args::MAX_BATCH)?;
        let threads = args::count("num_threads", &args.num_threads, 1, args::MAX_THREADS)?;
        let io_concurrency = args::opt_count("io_concurrency", args.io_concurrency.as_ref(), 1, args::MAX_CONCURRENCY)?;
        let epochs = args::count("epochs", &args.epochs, 1, args::MAX_EPOCHS)?;
        let size = args::count("size", &args.size, 1, args::MAX_SIDE)? as u32;
        let limit = args::opt_count("limit", args.limit.as_ref(), 0, u64::MAX)?;
        let opts = LoaderOptions {
            batch_size,
            threads,
            io_concurrency,
            epochs,
            transform: transform(&args.transform, size, args.seed)?,
            normalize: args.normalize,
            layout,
            gpu: GpuMode::Off,
            ..LoaderOptions::default()
        };
        let list_opts = ListOptions { store: args.store.clone(), endpoint: args.endpoint.clone() };
        let made_in = crate::lifecycle::generation();
        let inner = crate::lifecycle::detach(py, move || -> Result<spdl_loader::ImageLoader, Box<LoaderError>> {
            let mut listing = Listing::open(&path, &list_opts)?;
            if let Some(n) = limit {
                listing.truncate(n);
            }
            Ok(spdl_loader::ImageLoader::new(listing, opts)?)
        });
        Ok(Self { inner: MadeHere::new(inner.map_err(|e| loader_err(*e))?, made_in, "ImageLoader") })
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// The next batch, waiting without the GIL (Ctrl-C raises `KeyboardInterrupt`).
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<(Py<PyBuffer>, Vec<i64>)>> {
        let Some(batch) = next_batch(py, self.get()?.pipeline(), "image loader")? else { return Ok(None) };
        match batch.images {
            spdl_loader::Images::Host(buffer) => {
                Ok(Some((Py::new(py, PyBuffer::from_arc(Arc::new(buffer)))?, batch.labels)))
            }
            spdl_loader::Images::Device(_) => Err(PyRuntimeError::new_err("a device batch from a host-only loader")),
        }
    }

    /// Images per epoch (after `limit`).
    #[getter]
    fn images_per_epoch(&self) -> PyResult<usize> {
        Ok(self.get()?.images_per_epoch())
    }

    /// Images that failed to read or decode so far (each also logged).
    #[getter]
    fn failed_images(&self) -> PyResult<u64> {
        Ok(self.get()?.failed_images())
    }

    /// The per-stage stats table (the bottleneck is marked).
    fn stats_table(&self, py: Python<'_>) -> PyResult<String> {
        Ok(stats_table(py, self.get()?.pipeline()))
    }

    /// Stops the pipeline and joins its threads (GIL released); iteration then ends.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        stop_pipeline(py, self.get()?.pipeline());
        Ok(())
    }
}

#[cfg(feature = "ffmpeg")]
keyword_options! {
    /// The clip loader's keyword options.
    struct ClipLoaderArgs {
        batch_size: Int = Int::from(8),
        num_threads: Int = Int::from(4),
        io_concurrency: Option<Int> = None,
        epochs: Int = Int::from(1),
        num_clips: Int = Int::from(4),
        num_frames: Int = Int::from(16),
        size: Int = Int::from(112),
        sampling: String = "random".to_owned(),
        seed: u64 = 0,
        store: Option<String> = None,
        endpoint: Option<String> = None,
        limit: Option<Int> = None,
    }
}

/// Loads batches of video clips from a directory of videos (class folders give labels), a list file or an
/// object store, in Rust: each video is read through the store, `num_clips` clips of `num_frames` frames are
/// sampled from it (seeded by `seed`, the epoch and the video) and decoded once per GOP at `size` x `size`.
/// Iterating yields `(clips, labels)`: an `spdl_rs.Buffer` `[B, num_clips, num_frames, size, size, 3]` `uint8`
/// and a list of ints (-1: no label). A video that fails is logged and counted (`failed_videos`).
///
/// A loader made before a `fork` raises `RuntimeError` in the child.
#[cfg(feature = "ffmpeg")]
#[pyclass(module = "spdl_rs._native.loader", frozen)]
pub struct ClipLoader {
    inner: MadeHere<spdl_loader::ClipLoader>,
}

#[cfg(feature = "ffmpeg")]
impl ClipLoader {
    fn get(&self) -> PyResult<&spdl_loader::ClipLoader> {
        self.inner.get()
    }
}

#[cfg(feature = "ffmpeg")]
impl std::fmt::Debug for ClipLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClipLoader")
            .field("videos_per_epoch", &self.inner.inner.videos_per_epoch())
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "ffmpeg")]
#[pymethods]
impl ClipLoader {
    /// Lists `path` (videos: mp4, mkv, webm, avi, mov) and builds the pipeline (it starts on the first batch
    /// asked). Keywords: `batch_size` (videos), `num_threads`, `io_concurrency`, `epochs`, `num_clips`,
    /// `num_frames`, `size`, `sampling` (`"random"`, `"regular"`), `seed`, `store`, `endpoint`, `limit`.
    #[new]
    #[pyo3(signature = (path, **options: "Unpack[ClipLoaderArgs]"))]
    fn new(py: Python<'_>, path: String, options: Option<Bound<'_, pyo3::types::PyDict>>) -> PyResult<Self> {
        use spdl_loader::{ClipLoaderOptions, ClipSampling, VIDEO_EXTENSIONS};
        let args = ClipLoaderArgs::from_kwargs("ClipLoader", options.as_ref())?;
        let sampling = match args.sampling.as_str() {
            "random" => ClipSampling::Random,
            "regular" => ClipSampling::Regular,
            other => {
                return Err(PyValueError::new_err(format!(
                    "sampling must be \"random\" or \"regular\", got {other:?}"
                )));
            }
        };
        let size = args::count("size", &args.size, 1, args::MAX_SIDE)? as u32;
        let opts = ClipLoaderOptions {
            batch_size: args::count("batch_size", &args.batch_size, 1, args::MAX_BATCH)?,
            threads: args::count("num_threads", &args.num_threads, 1, args::MAX_THREADS)?,
            io_concurrency: args::opt_count("io_concurrency", args.io_concurrency.as_ref(), 1, args::MAX_CONCURRENCY)?,
            epochs: args::count("epochs", &args.epochs, 1, args::MAX_EPOCHS)?,
            num_clips: args::count("num_clips", &args.num_clips, 1, spdl_loader::MAX_CLIP_FRAMES as u64)?,
            num_frames: args::count("num_frames", &args.num_frames, 1, spdl_loader::MAX_CLIP_FRAMES as u64)?,
            size: Some((size, size)),
            sampling,
            seed: args.seed,
            ..ClipLoaderOptions::default()
        };
        let limit = args::opt_count("limit", args.limit.as_ref(), 0, u64::MAX)?;
        let list_opts = ListOptions { store: args.store.clone(), endpoint: args.endpoint.clone() };
        let made_in = crate::lifecycle::generation();
        let inner = crate::lifecycle::detach(py, move || -> Result<spdl_loader::ClipLoader, Box<LoaderError>> {
            let mut listing = Listing::open_with_extensions(&path, &list_opts, VIDEO_EXTENSIONS)?;
            if let Some(n) = limit {
                listing.truncate(n);
            }
            Ok(spdl_loader::ClipLoader::new(listing, opts)?)
        });
        Ok(Self { inner: MadeHere::new(inner.map_err(|e| loader_err(*e))?, made_in, "ClipLoader") })
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// The next batch, waiting without the GIL (Ctrl-C raises `KeyboardInterrupt`).
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<(Py<PyBuffer>, Vec<i64>)>> {
        let Some(batch) = next_batch(py, self.get()?.pipeline(), "clip loader")? else { return Ok(None) };
        let stacked = crate::lifecycle::detach(py, || batch.stack(&spdl_buffer::system_allocator()).map_err(Box::new))
            .map_err(|e| loader_err(*e))?;
        Ok(Some((Py::new(py, PyBuffer::from_arc(Arc::new(stacked)))?, batch.labels)))
    }

    /// Videos per epoch (after `limit`).
    #[getter]
    fn videos_per_epoch(&self) -> PyResult<usize> {
        Ok(self.get()?.videos_per_epoch())
    }

    /// Videos that failed to read or decode so far (each also logged).
    #[getter]
    fn failed_videos(&self) -> PyResult<u64> {
        Ok(self.get()?.failed_videos())
    }

    /// The per-stage stats table (the bottleneck is marked).
    fn stats_table(&self, py: Python<'_>) -> PyResult<String> {
        Ok(stats_table(py, self.get()?.pipeline()))
    }

    /// Stops the pipeline and joins its threads (GIL released); iteration then ends.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        stop_pipeline(py, self.get()?.pipeline());
        Ok(())
    }
}
