//! `spdl_rs.io`: spdl-io's decoders for Python. Every function releases the GIL for its whole duration,
//! and each has a native-op form (`spdl_rs.io.ops`) that a pipeline runs without the GIL at all.
//! Images are here; audio (and `probe`) in [`audio`], video (feature `ffmpeg`) in [`video`].
//!
//! Each decoder's options are one struct ([`options`]): the function takes them as `**options` and its op
//! as its keywords, both through [`KeywordOptions::from_kwargs`]. Every decoder returns `spdl_rs.Buffer`
//! objects (the decoded memory, zero-copy; `numpy.asarray` and DLPack view them in place).

#[macro_use]
pub(crate) mod options;
pub(crate) mod array;
pub(crate) mod audio;
#[cfg(feature = "ffmpeg")]
pub(crate) mod clips;
pub(crate) mod encode;
pub(crate) mod filter_desc;
pub(crate) mod literal;
#[cfg(feature = "ffmpeg")]
pub(crate) mod media;
#[cfg(feature = "ffmpeg")]
pub(crate) mod media_api;
#[cfg(feature = "ffmpeg")]
pub(crate) mod media_decode;
#[cfg(feature = "ffmpeg")]
pub(crate) mod mux;
pub(crate) mod npy;
pub(crate) mod ray;
pub(crate) mod spdl_form;
pub(crate) mod tar;
pub(crate) mod utils;
#[cfg(feature = "ffmpeg")]
pub(crate) mod video;
pub(crate) mod wav;
pub(crate) mod zip;

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::exceptions::{
    PyFileNotFoundError, PyIsADirectoryError, PyOSError, PyPermissionError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict};
use spdl_buffer::{Buffer, Layout, system_allocator};
use spdl_io::image::{
    BatchDecoder, BatchOptions, ImageOptions, Normalize, PixelFormat, ResizeFilter, Transform, TransformName,
    UnknownTransform,
};

use self::options::KeywordOptions;
use crate::args::{self, Int};
use crate::buffer::PyBuffer;
use crate::error::Error;
use crate::pipeline::{NativeOp, PyNativeOp};
use crate::signals::{SIGNAL_POLL, wait_with_signals};
use crate::value::Value;

/// An image source as Rust holds it: a path or encoded bytes.
enum Src {
    Path(PathBuf),
    Bytes(String, Data),
}

/// Encoded bytes: borrowed from a Python `bytes` object (no copy: [`PyBackedBytes`] keeps the object alive
/// and is read without the GIL), or owned (a pipeline's `Value::Bytes`, a file read for a mixed batch, a
/// copy of a `bytearray` or other buffer-protocol object).
pub(crate) enum Data {
    Py(PyBackedBytes),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Data {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Data::Py(b) => b,
            Data::Owned(v) => v,
        }
    }
}

impl AsRef<[u8]> for Data {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Src {
    fn name(&self) -> String {
        match self {
            Src::Path(p) => p.display().to_string(),
            Src::Bytes(n, _) => n.clone(),
        }
    }
}

/// A path (`str` or `os.PathLike`) or encoded bytes (`bytes`, `bytearray`, `memoryview`, numpy `uint8`).
/// `bytes` are borrowed, not copied (a list of 100,000 references to one object costs no more than the
/// object); other buffer-protocol objects are copied once (`bytes(obj)`; the stable ABI this module builds
/// against has no buffer borrowing before Python 3.11).
fn src_from_py(obj: &Bound<'_, PyAny>, index: usize) -> PyResult<Src> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Src::Bytes(format!("<bytes #{index}>"), Data::Py(PyBackedBytes::from(b.clone()))));
    }
    if let Ok(p) = obj.extract::<PathBuf>() {
        return Ok(Src::Path(p));
    }
    // Any other buffer-protocol object: one copy (`bytes(obj)`), then borrowed.
    let bytes = obj.py().get_type::<PyBytes>().call1((obj,))?;
    let bytes = bytes.cast_into::<PyBytes>()?;
    Ok(Src::Bytes(format!("<bytes #{index}>"), Data::Py(PyBackedBytes::from(bytes))))
}

/// The failed items of a non-strict batch: `(index, item, message)`, as Python sees them.
type FailedItems = Vec<(usize, String, String)>;

/// A media source argument: a path, or bytes named `name` in errors (default `<bytes>`).
fn media_src(obj: &Bound<'_, PyAny>, name: Option<&str>) -> PyResult<Src> {
    Ok(match src_from_py(obj, 0)? {
        Src::Bytes(_, b) => Src::Bytes(name.unwrap_or("<bytes>").to_owned(), b),
        path => path,
    })
}

/// A decoded buffer as the `spdl_rs.Buffer` every decoder returns (no copy), with `info` when there is one:
/// `buffer` or `(buffer, info)`.
fn buffer_result(py: Python<'_>, buffer: Buffer, info: Option<Bound<'_, PyDict>>) -> PyResult<Py<PyAny>> {
    let buffer = Py::new(py, PyBuffer::new(buffer))?;
    match info {
        Some(info) => Ok((buffer, info).into_pyobject(py)?.into_any().unbind()),
        None => Ok(buffer.into_any()),
    }
}

/// Logs the failed items of a non-strict batch on the `spdl_rs.io` logger (one warning each).
fn log_failures(py: Python<'_>, what: &str, failures: &[(usize, String, String)]) {
    if failures.is_empty() {
        return;
    }
    let logged = py.import("logging").and_then(|logging| {
        let logger = logging.call_method1("getLogger", ("spdl_rs.io",))?;
        for (index, item, message) in failures {
            logger.call_method1(
                "warning",
                ("%s: item %d (%s) failed, its slot is zero: %s", what, *index, item.as_str(), message.as_str()),
            )?;
        }
        Ok(())
    });
    if let Err(e) = logged {
        // A broken logging setup must not turn a decoded batch into an error.
        e.write_unraisable(py, None);
    }
}

fn src_from_value(v: Value, stage: &str, op: &str, expects: &'static str, index: usize) -> Result<Src, Error> {
    match v {
        Value::Str(s) => Ok(Src::Path(PathBuf::from(s))),
        Value::Bytes(b) => Ok(Src::Bytes(format!("<bytes #{index}>"), Data::Owned(b))),
        Value::Py(obj) => crate::pipeline::tstate::attach(|py| src_from_py(obj.bind(py), index))
            .map_err(|e| Error::wrong_input(stage, op, format!("a Python object ({e})"), expects)),
        other => Err(Error::wrong_input(stage, op, other.describe(), expects)),
    }
}

fn pixel_format(name: &str) -> PyResult<PixelFormat> {
    match name.to_ascii_lowercase().as_str() {
        "rgb" | "rgb24" => Ok(PixelFormat::Rgb8),
        "rgba" => Ok(PixelFormat::Rgba8),
        "gray" | "grey" | "gray8" => Ok(PixelFormat::Gray8),
        other => Err(PyValueError::new_err(format!("pixel_format must be rgb, rgba or gray, got {other:?}"))),
    }
}

fn filter(name: &str) -> PyResult<ResizeFilter> {
    match name.to_ascii_lowercase().as_str() {
        "nearest" => Ok(ResizeFilter::Nearest),
        "box" | "area" => Ok(ResizeFilter::Box),
        "bilinear" => Ok(ResizeFilter::Bilinear),
        "hamming" => Ok(ResizeFilter::Hamming),
        "bicubic" => Ok(ResizeFilter::Bicubic),
        other => Err(PyValueError::new_err(format!(
            "filter must be nearest, box, bilinear, hamming or bicubic, got {other:?}"
        ))),
    }
}

/// An output width or height.
fn side(name: &str, v: &Int) -> PyResult<u32> {
    Ok(args::count(name, v, 1, args::MAX_SIDE)? as u32)
}

fn transform(size: Option<(u32, u32)>, filter_name: &str) -> PyResult<Transform> {
    Ok(match size {
        None => Transform::None,
        Some((width, height)) => Transform::Resize { width, height, filter: filter(filter_name)? },
    })
}

fn layout(name: &str) -> PyResult<Layout> {
    match name.to_ascii_uppercase().as_str() {
        "NHWC" => Ok(Layout::Nhwc),
        "NCHW" => Ok(Layout::Nchw),
        other => Err(PyValueError::new_err(format!("layout must be \"NHWC\" or \"NCHW\", got {other:?}"))),
    }
}

/// `None`, `"imagenet"`, `"unit"` or `(mean, std)` (one value, or one per channel).
fn normalize(spec: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Normalize>> {
    let Some(spec) = spec.filter(|s| !s.is_none()) else { return Ok(None) };
    if let Ok(name) = spec.extract::<String>() {
        return match name.as_str() {
            "imagenet" => Ok(Some(Normalize::imagenet())),
            "unit" => Ok(Some(Normalize::unit())),
            other => Err(PyValueError::new_err(format!(
                "normalize must be \"imagenet\", \"unit\" or (mean, std), got {other:?}"
            ))),
        };
    }
    let (mean, std): (Vec<f32>, Vec<f32>) = spec.extract()?;
    Ok(Some(Normalize { mean, std }))
}

fn io_err(e: spdl_io::Error) -> PyErr {
    let msg = spdl_report::error_chain(&e);
    match e {
        spdl_io::Error::Io { source, .. } => match source.kind() {
            std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(msg),
            std::io::ErrorKind::PermissionDenied => PyPermissionError::new_err(msg),
            std::io::ErrorKind::IsADirectory => PyIsADirectoryError::new_err(msg),
            _ => PyOSError::new_err(msg),
        },
        spdl_io::Error::NotRegularFile { kind: "a directory", .. } => PyIsADirectoryError::new_err(msg),
        spdl_io::Error::NotRegularFile { .. } => PyOSError::new_err(msg),
        spdl_io::Error::InvalidOptions(_) => PyValueError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

/// Inputs smaller than this (in memory) are decoded on the calling thread: their cost is bounded to
/// milliseconds, less than a thread hop's share would be worth.
const INLINE_BYTES: usize = 1 << 20;

/// Runs `f` with the GIL released on a thread of its own and waits for it in slices, checking for signals
/// between them: Ctrl-C raises `KeyboardInterrupt` within about 50 ms even while a long decode runs (a
/// decode in Rust never returns to the interpreter's signal check on its own). After an interrupt the
/// call's thread finishes its work (bounded by the decoders' limits) in the background and its result is
/// dropped. A panic on that thread is a `RuntimeError`.
pub(crate) fn interruptible<T: Send + 'static>(py: Python<'_>, f: impl FnOnce() -> T + Send + 'static) -> PyResult<T> {
    use std::sync::mpsc::{RecvTimeoutError, sync_channel};
    let (tx, rx) = sync_channel(1);
    std::thread::Builder::new()
        .name("spdl-io-call".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start a decoding thread: {e}")))?;
    // `None`: the thread ended without a result (it panicked).
    let got = wait_with_signals(py, move || match rx.recv_timeout(SIGNAL_POLL) {
        Ok(v) => Some(Some(v)),
        Err(RecvTimeoutError::Timeout) => None,
        Err(RecvTimeoutError::Disconnected) => Some(None),
    })?;
    got.ok_or_else(|| PyRuntimeError::new_err("the decoding thread panicked (see the log for its message)"))
}

/// Decode memory: `decode_memory_budget()` gives the process-wide budget in bytes.
#[pyfunction]
pub(crate) fn decode_memory_budget() -> u64 {
    spdl_io::decode_memory_budget()
}

/// Sets the process-wide decode memory budget in bytes: large decodes (16 MiB of working memory or more)
/// reserve their bytes from it before allocating and wait while it is in use; a decode or a batch larger
/// than the whole budget fails. Default: a quarter of the machine's (or the cgroup's) memory.
///
/// Raises:
///     ValueError: ``nbytes`` is below 16 MiB.
#[pyfunction]
pub(crate) fn set_decode_memory_budget(nbytes: Int) -> PyResult<()> {
    let nbytes = args::size_bytes("nbytes", &nbytes, spdl_io::UNMETERED_BYTES, u64::MAX)?;
    spdl_io::set_decode_memory_budget(nbytes).map_err(io_err)
}

keyword_options! {
    /// The options of `load_image`, `decode_image` and their op.
    struct ImageArgs {
        size: Option<(Int, Int)> = None,
        pixel_format: String = "rgb".to_owned(),
        filter: String = "bilinear".to_owned(),
        exif_orientation: bool = false,
    }
}

/// Decoding settings for one image.
#[derive(Debug, Clone)]
struct ImageSpec {
    opts: ImageOptions,
    transform: Transform,
}

impl ImageSpec {
    /// The settings of a call of `func` with keyword `options`.
    fn from_kwargs(func: &str, options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let args = ImageArgs::from_kwargs(func, options)?;
        let opts = ImageOptions {
            format: pixel_format(&args.pixel_format)?,
            exif_orientation: args.exif_orientation,
            ..ImageOptions::default()
        };
        opts.validate().map_err(io_err)?;
        let size = match &args.size {
            Some((w, h)) => Some((side("width", w)?, side("height", h)?)),
            None => None,
        };
        let transform = transform(size, &args.filter)?;
        transform.validate().map_err(io_err)?;
        Ok(Self { opts, transform })
    }

    fn decode(&self, src: &Src) -> Result<Buffer, spdl_io::Error> {
        let alloc = system_allocator();
        match src {
            Src::Path(p) => spdl_io::image::load_image(p, &self.opts, &self.transform, &alloc),
            Src::Bytes(name, b) => spdl_io::image::decode_image(b, name, &self.opts, &self.transform, &alloc),
        }
    }
}

/// Decodes one image file into an HWC `uint8` :py:class:`spdl_rs.Buffer` (GIL released).
///
/// Args:
///     path: The file.
///     size: ``(width, height)`` to resize to, or ``None`` for the original size.
///     pixel_format: ``"rgb"``, ``"rgba"`` or ``"gray"``.
///     filter: The resize filter (``"bilinear"``, ``"nearest"``, ``"box"``, ``"hamming"``, ``"bicubic"``).
///     exif_orientation: Apply the EXIF orientation.
pub(crate) fn load_image(py: Python<'_>, path: PathBuf, options: Option<&Bound<'_, PyDict>>) -> PyResult<PyBuffer> {
    let spec = ImageSpec::from_kwargs("load_image", options)?;
    let src = Src::Path(path);
    interruptible(py, move || spec.decode(&src))?.map(PyBuffer::new).map_err(io_err)
}

/// Decodes one encoded image (JPEG, PNG, WebP, GIF, BMP, TIFF) into an HWC `uint8` :py:class:`spdl_rs.Buffer`
/// (GIL released). Arguments as :py:func:`load_image`; ``name`` appears in error messages.
pub(crate) fn decode_image(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    name: &str,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyBuffer> {
    let spec = ImageSpec::from_kwargs("decode_image", options)?;
    let src = match src_from_py(data, 0)? {
        Src::Bytes(_, b) => Src::Bytes(name.to_owned(), b),
        Src::Path(_) => {
            return Err(PyValueError::new_err("decode_image takes encoded bytes; use load_image for a path"));
        }
    };
    let inline = matches!(&src, Src::Bytes(_, b) if b.len() < INLINE_BYTES);
    let out = if inline {
        crate::lifecycle::detach(py, || spec.decode(&src))
    } else {
        interruptible(py, move || spec.decode(&src))?
    };
    out.map(PyBuffer::new).map_err(io_err)
}

/// The format and size of an encoded image, from its header only: ``(format, width, height)``.
#[pyfunction]
pub(crate) fn image_info(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<(String, u32, u32)> {
    let Src::Bytes(name, b) = src_from_py(data, 0)? else {
        return Err(PyValueError::new_err("image_info takes encoded bytes"));
    };
    let info = crate::lifecycle::detach(py, || spdl_io::image::image_info(&b, &name)).map_err(io_err)?;
    Ok((format!("{:?}", info.format).to_lowercase(), info.width, info.height))
}

keyword_options! {
    /// The options of `load_image_batch` and its op (besides the output `width` and `height`).
    struct ImageBatchArgs {
        layout: String as "Literal[\"NHWC\", \"NCHW\"]" = "NHWC".to_owned(),
        normalize: Option<Py<PyAny>> as "str | tuple[Sequence[float], Sequence[float]] | None" = None,
        pixel_format: String = "rgb".to_owned(),
        filter: String = "bilinear".to_owned(),
        strict: bool = true,
        num_threads: Option<Int> = None,
        transform: String as "Literal[\"resize\", \"center-crop\", \"random-resized-crop\"]" = "resize".to_owned(),
        seed: u64 = 0,
    }
}

/// Batch settings shared by the function and the native op.
#[derive(Debug)]
struct BatchSpec {
    decoder: BatchDecoder,
}

impl BatchSpec {
    /// The settings of a call of `func` with keyword `options`; `num_threads=None` means `default_threads`.
    fn from_kwargs(
        py: Python<'_>,
        func: &str,
        width: &Int,
        height: &Int,
        options: Option<&Bound<'_, PyDict>>,
        default_threads: Option<usize>,
    ) -> PyResult<Self> {
        let (width, height) = (side("width", width)?, side("height", height)?);
        let args = ImageBatchArgs::from_kwargs(func, options)?;
        let transform = batch_transform(&args.transform, width, height, &args.filter, args.seed)?;
        let opts = BatchOptions {
            transform,
            layout: layout(&args.layout)?,
            normalize: normalize(args.normalize.as_ref().map(|n| n.bind(py)))?,
            strict: args.strict,
            threads: args::opt_count("num_threads", args.num_threads.as_ref(), 1, args::MAX_THREADS)?
                .or(default_threads),
            image: ImageOptions { format: pixel_format(&args.pixel_format)?, ..ImageOptions::default() },
        };
        let decoder = BatchDecoder::new(opts, system_allocator()).map_err(io_err)?;
        Ok(Self { decoder })
    }

    /// Decodes the batch: all paths, all bytes, or a mix (then files are read first). `keys` seed each item's
    /// random transform (default: its position). Returns the buffer and the failed items (non-strict mode) as
    /// `(index, item, message)`.
    fn run(&self, srcs: Vec<Src>, keys: Option<&[u64]>) -> Result<(Buffer, FailedItems), spdl_io::Error> {
        let positions: Vec<u64>;
        let keys = match keys {
            Some(k) => k,
            None => {
                positions = (0..srcs.len() as u64).collect();
                &positions
            }
        };
        let out = if srcs.iter().all(|s| matches!(s, Src::Path(_))) {
            let paths: Vec<PathBuf> =
                srcs.into_iter().filter_map(|s| if let Src::Path(p) = s { Some(p) } else { None }).collect();
            self.decoder.load_keyed(&paths, keys)?
        } else {
            let mut items = Vec::with_capacity(srcs.len());
            for s in srcs {
                items.push(match s {
                    Src::Bytes(n, b) => (n, b),
                    Src::Path(p) => {
                        let b = spdl_io::read_file(&p, &spdl_io::ReadLimits::default())?;
                        (p.display().to_string(), Data::Owned(b))
                    }
                });
            }
            self.decoder.decode_keyed(&items, keys)?
        };
        let failures = out.failures.iter().map(crate::error::batch_failure).collect();
        Ok((out.buffer, failures))
    }
}

/// The batch transform named `name`, to a `width` x `height` output.
fn batch_transform(name: &str, width: u32, height: u32, filter_name: &str, seed: u64) -> PyResult<Transform> {
    let filter = filter(filter_name)?;
    let name: TransformName = name.parse().map_err(|e: UnknownTransform| PyValueError::new_err(e.to_string()))?;
    Ok(name.transform(width, height, filter, seed))
}

/// Decodes a batch of images (paths or encoded bytes) resized to ``width`` x ``height`` into one contiguous
/// :py:class:`spdl_rs.Buffer` of shape ``[N, H, W, C]`` (or ``[N, C, H, W]``), in parallel, GIL released.
/// Each image is written straight into its slot of the batch.
///
/// Args:
///     srcs: Paths or encoded bytes.
///     width, height: The output size of every image.
///     layout: ``"NHWC"`` or ``"NCHW"``.
///     normalize: ``None`` (``uint8`` output), ``"imagenet"``, ``"unit"`` or ``(mean, std)`` (``float32``
///         output, ``(x / 255 - mean) / std``).
///     pixel_format: ``"rgb"``, ``"rgba"`` or ``"gray"``.
///     filter: The resize filter.
///     strict: Fail the whole batch if one image fails (the message names its index and file). ``False``:
///         a failed image's slot stays zero and the failure is logged on the ``spdl_rs.io`` logger.
///     num_threads: Decoding threads (``None``: all cores).
///     return_info: Return ``(buffer, info)``, where ``info["failures"]`` lists the failed items as
///         ``(index, item, message)`` tuples.
///     transform: ``"resize"`` (to ``width`` x ``height``), ``"center-crop"`` (ImageNet eval: the shorter
///         side resized to 256/224 of the output, then the centered ``width`` x ``height``) or
///         ``"random-resized-crop"`` (ImageNet train: torchvision's ``RandomResizedCrop`` + a horizontal
///         flip half the time). With a JPEG build on libjpeg-turbo, only the region the crop keeps is decoded.
///     seed: Seed of the random crop and flip.
///     keys: One integer per item that seeds its crop and flip with ``seed`` (e.g. its index in the dataset
///         mixed with the epoch); default: its position in the batch.
pub(crate) fn load_image_batch(
    py: Python<'_>,
    srcs: &Bound<'_, PyAny>,
    width: Int,
    height: Int,
    return_info: bool,
    keys: Option<Vec<u64>>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<PyAny>> {
    let spec = BatchSpec::from_kwargs(py, "load_image_batch", &width, &height, options, None)?;
    if srcs.is_instance_of::<pyo3::types::PyString>() || srcs.is_instance_of::<PyBytes>() {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "load_image_batch takes a sequence of paths or encoded bytes, not one str or bytes",
        ));
    }
    // Items are taken one at a time from the sequence (no intermediate list of Python objects) and held
    // borrowed: a list of references to one `bytes` costs a few dozen bytes per item, not a copy each.
    let srcs = srcs.try_iter()?.enumerate().map(|(i, s)| src_from_py(&s?, i)).collect::<PyResult<Vec<_>>>()?;

    let (buffer, failures) = interruptible(py, move || spec.run(srcs, keys.as_deref()))?.map_err(io_err)?;
    log_failures(py, "load_image_batch", &failures);
    let info = if return_info {
        let info = PyDict::new(py);
        info.set_item("failures", failures)?;
        Some(info)
    } else {
        None
    };
    buffer_result(py, buffer, info)
}

const IMAGE_INPUT: &str = "a path (str) or encoded bytes";
const BATCH_INPUT: &str = "a list of paths or encoded bytes (aggregate first)";

#[derive(Debug)]
struct DecodeImageOp {
    name: String,
    spec: ImageSpec,
}

impl NativeOp for DecodeImageOp {
    fn name(&self) -> &str {
        &self.name
    }
    fn expects(&self) -> &'static str {
        IMAGE_INPUT
    }
    fn call(&self, stage: &str, input: Value) -> Result<Vec<Value>, Error> {
        let src = src_from_value(input, stage, &self.name, IMAGE_INPUT, 0)?;
        let buf = self.spec.decode(&src).map_err(|e| Error::native(stage, &self.name, src.name(), e))?;
        Ok(vec![Value::Buffer(Arc::new(buf))])
    }
}

#[derive(Debug)]
struct ImageBatchOp {
    spec: BatchSpec,
}

impl NativeOp for ImageBatchOp {
    fn name(&self) -> &str {
        "load_image_batch"
    }
    fn expects(&self) -> &'static str {
        BATCH_INPUT
    }
    fn call(&self, stage: &str, input: Value) -> Result<Vec<Value>, Error> {
        let items = match input {
            Value::List(v) => v,
            other => {
                return Err(Error::wrong_input(stage, self.name(), other.describe(), BATCH_INPUT));
            }
        };
        let n = items.len();
        let srcs = items
            .into_iter()
            .enumerate()
            .map(|(i, v)| src_from_value(v, stage, "load_image_batch", BATCH_INPUT, i))
            .collect::<Result<Vec<_>, _>>()?;
        let (buf, failures) =
            self.spec.run(srcs, None).map_err(|e| Error::native(stage, self.name(), format!("a batch of {n}"), e))?;
        if !failures.is_empty() {
            // Rare (non-strict batches only): the GIL is taken just to log them.
            crate::pipeline::tstate::attach(|py| log_failures(py, stage, &failures));
        }
        Ok(vec![Value::Buffer(Arc::new(buf))])
    }
}

/// Native op: decodes each item (a path or encoded bytes) into an HWC `uint8` buffer, without the GIL.
/// Arguments as :py:func:`spdl_rs.io.load_image`.
#[pyfunction]
#[pyo3(signature = (**options: "Unpack[ImageArgs]"))]
pub(crate) fn decode_image_op(options: Option<&Bound<'_, PyDict>>) -> PyResult<PyNativeOp> {
    let spec = ImageSpec::from_kwargs("decode_image_op", options)?;
    Ok(PyNativeOp { op: Arc::new(DecodeImageOp { name: "decode_image".to_owned(), spec }) })
}

/// Native op: decodes each item (a list of paths or encoded bytes, e.g. after ``aggregate(32)``) into one
/// batch buffer, without the GIL. Arguments as :py:func:`spdl_rs.io.load_image_batch`; ``num_threads``
/// (``None``) means 1 here (the pipeline's ``concurrency`` gives the parallelism).
#[pyfunction]
#[pyo3(signature = (width, height, **options: "Unpack[ImageBatchArgs]"))]
pub(crate) fn load_image_batch_op(
    py: Python<'_>,
    width: Int,
    height: Int,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyNativeOp> {
    let spec = BatchSpec::from_kwargs(py, "load_image_batch_op", &width, &height, options, Some(1))?;
    Ok(PyNativeOp { op: Arc::new(ImageBatchOp { spec }) })
}
