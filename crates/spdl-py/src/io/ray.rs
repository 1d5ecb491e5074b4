//! `spdl_rs.ray`'s Ray Data `map_batches` callables: [`ImageBatchDecoder`] decodes a column of images with
//! `load_image_batch`'s decoder, [`VideoClipDecoder`] a column of videos with the clip samplers. The decoding
//! options are the functions' own (one declaration: [`super::ImageBatchArgs`], [`super::clips::ClipArgs`]),
//! checked when the decoder is made, on the driver, before Ray ships it. A decoder pickles as its
//! constructor's arguments; every call releases the GIL while it decodes.

use std::hash::BuildHasher;
use std::sync::Arc;

use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyMapping, PyMemoryView, PyString, PyTuple};

use super::options::KeywordOptions;
use super::{BatchSpec, Src, buffer_result, interruptible, pixel_format, src_from_py};
use crate::args::Int;

/// The logger a lenient decoder reports its dropped rows on.
const LOGGER: &str = "spdl_rs.ray";

/// What both decoders do with a batch's columns: which one they read and write, the key and name
/// columns, and what a failed row does.
#[derive(Debug)]
struct Columns {
    who: &'static str,
    column: String,
    output_column: String,
    keep_input: bool,
    key_column: Option<String>,
    strict: bool,
    name_column: Option<String>,
}

/// A failed row: its index in the batch, its name and the cause.
type Failure = (usize, String, String);

impl Columns {
    fn check(self) -> PyResult<Self> {
        for (name, value) in [("column", &self.column), ("output_column", &self.output_column)] {
            if value.is_empty() {
                return Err(PyValueError::new_err(format!("{name} must be a non-empty string, got ''")));
            }
        }
        if self.key_column.as_deref() == Some("") {
            return Err(PyValueError::new_err("key_column must be a non-empty string or None, got ''"));
        }
        Ok(self)
    }

    fn kwargs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("column", &self.column)?;
        d.set_item("output_column", &self.output_column)?;
        d.set_item("keep_input", self.keep_input)?;
        d.set_item("key_column", &self.key_column)?;
        d.set_item("strict", self.strict)?;
        d.set_item("name_column", &self.name_column)?;
        Ok(d)
    }

    /// `batch` as a mapping of columns.
    fn mapping<'a, 'py>(&self, batch: &'a Bound<'py, PyAny>) -> PyResult<&'a Bound<'py, PyMapping>> {
        batch.cast::<PyMapping>().map_err(|_| {
            let kind = batch.get_type().name().map_or_else(|_| "?".to_owned(), |n| n.to_string());
            PyTypeError::new_err(format!(
                "{} takes a dict of columns (map_batches(..., batch_format='numpy')), got {kind}",
                self.who
            ))
        })
    }

    /// The column `name` of the batch, or a `KeyError` that lists the batch's columns.
    fn get<'py>(&self, batch: &Bound<'py, PyMapping>, what: &str, name: &str) -> PyResult<Bound<'py, PyAny>> {
        if batch.contains(name)? {
            return batch.get_item(name);
        }
        let sorted = batch.py().import("builtins")?.getattr("sorted")?.call1((batch,))?;
        Err(PyKeyError::new_err(format!(
            "{}: {what} {} is not in the batch (columns: {})",
            self.who,
            PyString::new(batch.py(), name).repr()?,
            sorted.repr()?
        )))
    }

    /// The rows of the input column.
    fn rows<'py>(&self, batch: &Bound<'py, PyMapping>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        self.get(batch, "column", &self.column)?.try_iter()?.collect()
    }

    /// The key column's values (non-negative integers), where there is one.
    fn keys(&self, batch: &Bound<'_, PyMapping>) -> PyResult<Option<Vec<u64>>> {
        let Some(key) = &self.key_column else { return Ok(None) };
        let np = batch.py().import("numpy")?;
        let keys = np.call_method1("asarray", (self.get(batch, "key_column", key)?,))?;
        let dtype = keys.getattr("dtype")?;
        let integral = matches!(dtype.getattr("kind")?.extract::<String>()?.as_str(), "i" | "u");
        let values: Option<Vec<u64>> = if integral { keys.call_method0("tolist")?.extract().ok() } else { None };
        values.map(Some).ok_or_else(|| {
            PyValueError::new_err(format!(
                "{}: key_column {} must hold non-negative integers, got dtype {}",
                self.who,
                PyString::new(batch.py(), key).repr().map_or_else(|_| key.clone(), |r| r.to_string()),
                dtype.str().map_or_else(|_| "?".to_owned(), |s| s.to_string())
            ))
        })
    }

    /// What names row `index` in messages: the name column's value where the batch has one.
    fn names<'py>(&self, batch: &Bound<'py, PyMapping>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match &self.name_column {
            Some(name) if batch.contains(name)? => Ok(Some(batch.get_item(name)?)),
            _ => Ok(None),
        }
    }

    /// The output batch: the other columns (and the input column with `keep_input`) and `decoded` under
    /// `output_column`. With `strict`, the first failed row raises a `RuntimeError` naming it; otherwise the
    /// failed rows are dropped from every column and each is logged.
    fn output<'py>(
        &self,
        batch: &Bound<'py, PyMapping>,
        decoded: Bound<'py, PyAny>,
        mut failures: Vec<Failure>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let py = batch.py();
        failures.sort();
        if let (true, Some((index, name, message))) = (self.strict, failures.first()) {
            let more = match failures.len() {
                1 => String::new(),
                n => format!(" (and {} more rows of this batch)", n - 1),
            };
            return Err(PyRuntimeError::new_err(format!(
                "{}: row {index} ({name}) failed to decode{more}: {message}",
                self.who
            )));
        }
        let np = py.import("numpy")?;
        let keep = (!failures.is_empty())
            .then(|| {
                let n = decoded.len().unwrap_or(0) + failures.len();
                let mask: Vec<bool> = (0..n).map(|i| failures.iter().all(|f| f.0 != i)).collect();
                np.call_method1("array", (mask,))
            })
            .transpose()?;
        if !failures.is_empty() {
            let logger = py.import("logging")?.call_method1("getLogger", (LOGGER,))?;
            for (index, name, message) in &failures {
                logger.call_method1("warning", ("%s: dropped row %d (%s): %s", self.who, *index, name, message))?;
            }
        }
        let result = PyDict::new(py);
        for item in batch.items()?.try_iter()? {
            let (name, values): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item?.extract()?;
            if !self.keep_input && name.extract::<&str>().is_ok_and(|n| n == self.column) {
                continue;
            }
            let values = match &keep {
                Some(keep) => np.call_method1("asarray", (values,))?.get_item(keep)?,
                None => values,
            };
            result.set_item(name, values)?;
        }
        result.set_item(&self.output_column, decoded)?;
        Ok(result)
    }
}

/// A Ray Data ``map_batches`` callable that decodes a column of images with spdl-rs.
///
/// Each batch's ``column`` (encoded bytes, as ``ray.data.read_binary_files`` makes, or paths readable on the
/// worker) is decoded and transformed by :py:func:`spdl_rs.io.load_image_batch`'s decoder in one call that
/// holds no GIL, into ``output_column``: a ``uint8`` (or, with ``normalize``, ``float32``) array
/// ``[N, H, W, C]`` (or ``[N, C, H, W]``). The other columns pass through; ``column`` is dropped unless
/// ``keep_input``.
///
/// As Ray tasks (an instance) or in an actor pool (the class, with ``fn_constructor_kwargs``):
///
/// .. code-block:: python
///
///     ds = ray.data.read_binary_files(paths, include_paths=True)
///     ds.map_batches(ImageBatchDecoder(224, 224), batch_size=32)
///     ds.map_batches(ImageBatchDecoder, fn_constructor_kwargs={"width": 224, "height": 224},
///                    batch_size=32, compute=ray.data.ActorPoolStrategy(size=4))
///
/// Ray reserves one CPU per task or actor by default; to decode a batch on more threads, give
/// ``num_threads=k`` here and ``num_cpus=k`` to ``map_batches``, so that Ray's accounting matches.
///
/// Args:
///     width, height: The output size of every image.
///     column: The input column: encoded images (``bytes``) or paths (``str``).
///     output_column: The column the decoded batch goes to.
///     keep_input: Keep ``column`` in the output (default: dropped, so that the encoded bytes are not carried
///         further through the object store).
///     layout, normalize, pixel_format, filter, transform, seed: As :py:func:`spdl_rs.io.load_image_batch`.
///     key_column: A column of integers (e.g. a row id) that seeds each row's crop with ``seed``: the same row
///         gets the same crop on every worker and in every run. Without it, ``random-resized-crop`` draws a
///         fresh random key per row (crops are then not reproducible).
///     strict: ``True``: a row that fails to decode fails the batch with a ``RuntimeError`` that names it (Ray
///         retries or fails the job, per its settings). ``False``: failed rows are dropped from the output and
///         each is logged (loggers ``spdl_rs.io`` and ``spdl_rs.ray``, on the worker).
///     num_threads: Decoding threads per batch.
///     name_column: A column that names each row in messages (default ``"path"``, as
///         ``read_binary_files(include_paths=True)`` makes), when the batch has it.
///
/// Raises:
///     ValueError: An invalid argument (checked here, on the driver, before Ray ships the callable).
#[pyclass(module = "spdl_rs._native.ray", frozen)]
pub(crate) struct ImageBatchDecoder {
    #[pyo3(get)]
    width: u32,
    #[pyo3(get)]
    height: u32,
    columns: Columns,
    /// The decoding options as given (for pickling).
    options: Py<PyDict>,
    spec: Arc<BatchSpec>,
    /// The empty output's shape and dtype.
    empty: (Vec<usize>, &'static str),
    random_keys: bool,
}

#[pymethods]
impl ImageBatchDecoder {
    #[new]
    #[pyo3(signature = (
        width, height, *, column="bytes", output_column="image", keep_input=false,
        layout="NHWC", normalize=None, pixel_format="rgb", filter="bilinear",
        transform="resize", seed=0, key_column=None, strict=true, num_threads=1,
        name_column=Some("path".to_owned()),
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        width: Int,
        height: Int,
        column: &str,
        output_column: &str,
        keep_input: bool,
        layout: &str,
        normalize: Option<Py<PyAny>>,
        pixel_format: &str,
        filter: &str,
        transform: &str,
        seed: u64,
        key_column: Option<String>,
        strict: bool,
        num_threads: i64,
        name_column: Option<String>,
    ) -> PyResult<Self> {
        let who = "ImageBatchDecoder";
        let (column, output_column) = (column.to_owned(), output_column.to_owned());
        let columns = Columns { who, column, output_column, keep_input, key_column, strict, name_column }.check()?;
        let options = PyDict::new(py);
        options.set_item("layout", layout)?;
        options.set_item("normalize", &normalize)?;
        options.set_item("pixel_format", pixel_format)?;
        options.set_item("filter", filter)?;
        options.set_item("transform", transform)?;
        options.set_item("seed", seed)?;
        options.set_item("num_threads", num_threads)?;
        let inner = options.copy()?;
        // Failures are reported here, by the row's name, which the decoder does not see when given bytes.
        inner.set_item("strict", false)?;
        let spec = BatchSpec::from_kwargs(py, who, &width, &height, Some(&inner), None)?;
        let (w, h) = (super::side("width", &width)?, super::side("height", &height)?);
        let c = usize::from(pixel_format_channels(pixel_format)?);
        let shape = if layout.eq_ignore_ascii_case("NCHW") {
            vec![0, c, h as usize, w as usize]
        } else {
            vec![0, h as usize, w as usize, c]
        };
        let dtype = if normalize.as_ref().is_some_and(|n| !n.is_none(py)) { "float32" } else { "uint8" };
        Ok(Self {
            width: w,
            height: h,
            columns,
            options: options.unbind(),
            spec: Arc::new(spec),
            empty: (shape, dtype),
            random_keys: transform == "random-resized-crop",
        })
    }

    fn __getnewargs_ex__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyDict>)> {
        let kwargs = self.columns.kwargs(py)?;
        kwargs.update(self.options.bind(py).as_mapping())?;
        Ok((PyTuple::new(py, [self.width, self.height])?, kwargs))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let transform = self
            .options
            .bind(py)
            .get_item("transform")?
            .map_or_else(|| Ok(String::new()), |t| t.repr().map(|r| r.to_string()))?;
        Ok(format!(
            "ImageBatchDecoder({}, {}, column={}, output_column={}, transform={transform})",
            self.width,
            self.height,
            PyString::new(py, &self.columns.column).repr()?,
            PyString::new(py, &self.columns.output_column).repr()?,
        ))
    }

    /// Decodes one batch (a dict of columns, Ray's ``batch_format="numpy"``); returns the output batch.
    ///
    /// Raises:
    ///     TypeError: The batch is not a dict of columns (use ``batch_format="numpy"``) or ``column`` holds
    ///         something other than bytes and paths.
    ///     KeyError: ``column`` (or ``key_column``) is not in the batch.
    ///     RuntimeError: With ``strict``, a row failed to decode; the message names it (by ``name_column``
    ///         when the batch has it, else by its path or its index).
    fn __call__<'py>(&self, batch: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
        let py = batch.py();
        let cols = &self.columns;
        let batch = cols.mapping(batch)?;
        let rows = cols.rows(batch)?;
        let mut srcs = Vec::with_capacity(rows.len());
        for (i, item) in rows.iter().enumerate() {
            let accepted = item.is_instance_of::<PyBytes>()
                || item.is_instance_of::<PyByteArray>()
                || item.is_instance_of::<PyMemoryView>()
                || item.is_instance_of::<PyString>();
            if !accepted {
                return Err(PyTypeError::new_err(format!(
                    "{}: row {i} of column {} is {}; expected encoded bytes or a path",
                    cols.who,
                    PyString::new(py, &cols.column).repr()?,
                    item.get_type().name()?
                )));
            }
            srcs.push(src_from_py(item, i)?);
        }
        let n = srcs.len();
        let keys = match cols.keys(batch)? {
            Some(keys) => Some(keys),
            None if self.random_keys => {
                let state = std::collections::hash_map::RandomState::new();
                Some((0..n).map(|i| state.hash_one(i) >> 1).collect())
            }
            None => None,
        };
        let np = py.import("numpy")?;
        if n == 0 {
            let (shape, dtype) = &self.empty;
            let images = np.call_method1("zeros", (PyTuple::new(py, shape)?, *dtype))?;
            return cols.output(batch, images, Vec::new());
        }
        let spec = Arc::clone(&self.spec);
        let (buffer, failed) = interruptible(py, move || spec.run(srcs, keys.as_deref()))?.map_err(super::io_err)?;
        let images = np.call_method1("asarray", (buffer_result(py, buffer, None)?,))?;
        let names = cols.names(batch)?;
        let mut failures = Vec::with_capacity(failed.len());
        for (index, item, message) in failed {
            let name = match &names {
                Some(names) => names.get_item(index)?.str()?.to_string(),
                None => item,
            };
            failures.push((index, name, message));
        }
        let kept = match failures.is_empty() {
            true => images,
            false => {
                let mask: Vec<bool> = (0..n).map(|i| failures.iter().all(|f| f.0 != i)).collect();
                images.get_item(np.call_method1("array", (mask,))?)?
            }
        };
        cols.output(batch, kept, failures)
    }
}

/// Channels per pixel of a pixel format name.
fn pixel_format_channels(name: &str) -> PyResult<u8> {
    Ok(pixel_format(name)?.channels())
}

/// The clip samplers a [`VideoClipDecoder`] takes (the ones that give every video the same number of clips).
#[cfg(feature = "ffmpeg")]
const CLIP_SAMPLERS: [&str; 4] = ["random_indices", "regular_indices", "random_timestamps", "regular_timestamps"];

/// A Ray Data ``map_batches`` callable that decodes clips from a column of videos with spdl-rs.
///
/// Each row's video (encoded bytes, as ``ray.data.read_binary_files`` makes, or a path readable on the worker)
/// gives ``num_clips`` clips of ``num_frames`` frames, placed by ``sampler`` and decoded as
/// :py:func:`spdl_rs.io.load_clips` does (each GOP once for every clip that needs it, without the GIL) into
/// ``output_column``: a ``uint8`` array ``[N, num_clips, num_frames, H, W, C]``.
///
/// .. code-block:: python
///
///     ds = ray.data.read_binary_files(video_paths, include_paths=True)
///     ds = ds.map_batches(VideoClipDecoder(4, 16, width=112, height=112, key_column="id"), batch_size=8)
///
/// Args:
///     num_clips, num_frames: Clips per video and frames per clip.
///     width, height: The output frame size (needed: every row must have the same shape).
///     sampler: ``"random_indices"`` (default), ``"regular_indices"``, ``"random_timestamps"`` or
///         ``"regular_timestamps"``.
///     stride: Frames between a clip's frames (``1``: consecutive).
///     seed: Seed of the random samplers (change it per epoch for new clips).
///     key_column: A column of non-negative integers (e.g. a row id) mixed into each row's seed: the same row
///         gets the same clips on every worker and in every run. Without it, every row uses ``seed`` alone.
///     policy: A clip past the end of a short video: ``"repeat_last"`` (default), ``"wrap"`` or ``"error"``.
///     pix_fmt: ``"rgb24"`` or ``"gray"``.
///     column, output_column, keep_input, strict, name_column: As :py:class:`ImageBatchDecoder`.
///     num_threads: Videos decoded at once per batch.
///
/// Raises:
///     ValueError: An invalid argument (checked here, on the driver).
#[cfg(feature = "ffmpeg")]
#[pyclass(module = "spdl_rs._native.ray", frozen)]
pub(crate) struct VideoClipDecoder {
    #[pyo3(get)]
    num_clips: usize,
    #[pyo3(get)]
    num_frames: usize,
    columns: Columns,
    options: Py<PyDict>,
    sampler: String,
    seed: u64,
    spec: super::clips::ClipSpec,
    threads: usize,
    /// One row's output shape: `[num_clips, num_frames, H, W, C]`.
    row_shape: [usize; 5],
}

#[cfg(feature = "ffmpeg")]
#[pymethods]
impl VideoClipDecoder {
    #[new]
    #[pyo3(signature = (
        num_clips, num_frames, *, width, height, sampler="random_indices", stride=1, seed=0,
        key_column=None, policy="repeat_last", pix_fmt="rgb24", column="bytes",
        output_column="clips", keep_input=false, strict=true, num_threads=1,
        name_column=Some("path".to_owned()),
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        num_clips: Int,
        num_frames: Int,
        width: Int,
        height: Int,
        sampler: &str,
        stride: i64,
        seed: u64,
        key_column: Option<String>,
        policy: &str,
        pix_fmt: &str,
        column: &str,
        output_column: &str,
        keep_input: bool,
        strict: bool,
        num_threads: i64,
        name_column: Option<String>,
    ) -> PyResult<Self> {
        use crate::args::{MAX_SIDE, MAX_THREADS, count};
        let who = "VideoClipDecoder";
        let (column, output_column) = (column.to_owned(), output_column.to_owned());
        let columns = Columns { who, column, output_column, keep_input, key_column, strict, name_column }.check()?;
        let num_clips = count("num_clips", &num_clips, 1, spdl_io::video::MAX_SAMPLED_CLIPS as u64)?;
        let num_frames = count("num_frames", &num_frames, 1, u32::MAX as u64)?;
        let (w, h) = (count("width", &width, 1, MAX_SIDE)?, count("height", &height, 1, MAX_SIDE)?);
        let stride = count("stride", &Int::from(i128::from(stride)), 1, u32::MAX as u64)?;
        let threads = count("num_threads", &Int::from(i128::from(num_threads)), 1, MAX_THREADS)?;
        if !CLIP_SAMPLERS.contains(&sampler) {
            return Err(PyValueError::new_err(format!("sampler must be one of {CLIP_SAMPLERS:?}, got {sampler:?}")));
        }
        if !["repeat_last", "wrap", "error"].contains(&policy) {
            return Err(PyValueError::new_err(format!(
                "policy must be \"repeat_last\", \"wrap\" or \"error\", got {policy:?}"
            )));
        }
        let channels = match pix_fmt {
            "rgb24" => 3,
            "gray" => 1,
            other => {
                return Err(PyValueError::new_err(format!("pix_fmt must be \"rgb24\" or \"gray\", got {other:?}")));
            }
        };
        let options = PyDict::new(py);
        options.set_item("width", w)?;
        options.set_item("height", h)?;
        options.set_item("stride", stride)?;
        options.set_item("policy", policy)?;
        options.set_item("pix_fmt", pix_fmt)?;
        let spec = super::clips::ClipArgs::from_kwargs(who, Some(&options))?.spec(py)?;
        options.set_item("sampler", sampler)?;
        options.set_item("seed", seed)?;
        options.set_item("num_threads", threads)?;
        Ok(Self {
            num_clips,
            num_frames,
            columns,
            options: options.unbind(),
            sampler: sampler.to_owned(),
            seed,
            spec,
            threads,
            row_shape: [num_clips, num_frames, h, w, channels],
        })
    }

    fn __getnewargs_ex__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyDict>)> {
        let kwargs = self.columns.kwargs(py)?;
        kwargs.update(self.options.bind(py).as_mapping())?;
        Ok((PyTuple::new(py, [self.num_clips, self.num_frames])?, kwargs))
    }

    fn __repr__(&self) -> String {
        let [clips, frames, h, w, _] = self.row_shape;
        format!("VideoClipDecoder({clips}, {frames}, width={w}, height={h}, sampler={:?})", self.sampler)
    }

    /// Decodes one batch (a dict of columns, ``batch_format="numpy"``); returns the output batch.
    ///
    /// Raises:
    ///     TypeError, KeyError: As :py:class:`ImageBatchDecoder`.
    ///     RuntimeError: With ``strict``, a row failed; the message names it.
    fn __call__<'py>(&self, batch: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
        use super::clips::{Starts, load_one, sampler};
        let py = batch.py();
        let cols = &self.columns;
        let batch = cols.mapping(batch)?;
        let rows = cols.rows(batch)?;
        let n = rows.len();
        let names_col = cols.names(batch)?;
        let mut names = Vec::with_capacity(n);
        for i in 0..n {
            names.push(match &names_col {
                Some(col) => col.get_item(i)?.str()?.to_string(),
                None => format!("row {i}"),
            });
        }
        let seeds: Vec<u64> = match cols.keys(batch)? {
            Some(keys) => {
                keys.iter().map(|&k| ((u128::from(self.seed) * 1_000_003 + u128::from(k)) % (1 << 63)) as u64).collect()
            }
            None => vec![self.seed; n],
        };
        let np = py.import("numpy")?;
        let mut jobs = Vec::with_capacity(n);
        for (i, item) in rows.iter().enumerate() {
            let item =
                if item.is_instance(&np.getattr("ndarray")?)? { item.call_method0("tobytes")? } else { item.clone() };
            let src = match src_from_py(&item, i)? {
                Src::Bytes(_, b) => Src::Bytes(names[i].clone(), b),
                path => path,
            };
            let starts = Starts::Sampled(sampler(&self.sampler, Some(self.num_clips), seeds[i], None)?);
            jobs.push((src, starts));
        }
        let (spec, num_frames, threads) = (self.spec, self.num_frames, self.threads.min(n.max(1)));
        let results = interruptible(py, move || {
            let next = std::sync::atomic::AtomicUsize::new(0);
            let slots: Vec<std::sync::Mutex<Option<spdl_io::Result<spdl_buffer::Buffer>>>> =
                (0..jobs.len()).map(|_| std::sync::Mutex::new(None)).collect();
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| {
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some((src, starts)) = jobs.get(i) else { break };
                            let out = load_one(src, starts, num_frames, &spec).map(|c| c.buffer);
                            if let Ok(mut slot) = slots[i].lock() {
                                *slot = Some(out);
                            }
                        }
                    });
                }
            });
            slots.into_iter().map(|s| s.into_inner().ok().flatten()).collect::<Vec<_>>()
        })?;
        let mut decoded = Vec::with_capacity(n);
        let mut failures = Vec::new();
        for (i, result) in results.into_iter().enumerate() {
            match result {
                Some(Ok(buffer)) if buffer.shape() == self.row_shape => {
                    decoded.push(np.call_method1("asarray", (buffer_result(py, buffer, None)?,))?);
                }
                Some(Ok(buffer)) => failures.push((
                    i,
                    names[i].clone(),
                    format!("decoded clips of shape {:?}, expected {:?}", buffer.shape(), self.row_shape),
                )),
                Some(Err(e)) => failures.push((i, names[i].clone(), spdl_report::error_chain(&e))),
                None => failures.push((i, names[i].clone(), "the decoding thread panicked".to_owned())),
            }
        }
        let out = if decoded.is_empty() {
            let mut shape = vec![0];
            shape.extend(self.row_shape);
            np.call_method1("zeros", (PyTuple::new(py, shape)?, "uint8"))?
        } else {
            np.call_method1("stack", (pyo3::types::PyList::new(py, decoded)?,))?
        };
        cols.output(batch, out, failures)
    }
}

/// The message of the `ImportError` raised where Ray Data is missing.
fn ray_missing(cause: &PyErr, py: Python<'_>) -> PyErr {
    let err = pyo3::exceptions::PyImportError::new_err(format!(
        "spdl_rs.ray needs Ray Data, which is not importable here ({}); install it with \
         `pip install \"ray[data]\"` (Ray publishes no wheels for free-threaded CPython)",
        cause.value(py)
    ));
    err.set_cause(py, Some(cause.clone_ref(py)));
    err
}

/// The ``ray`` module, imported on first use.
///
/// Raises:
///     ImportError: Ray (with Ray Data: ``pip install "ray[data]"``) is not installed in this interpreter.
#[pyfunction]
pub(crate) fn import_ray(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    let ray = py.import("ray").map_err(|e| ray_missing(&e, py))?;
    py.import("ray.data").map_err(|e| ray_missing(&e, py))?;
    Ok(ray)
}

/// What `load_state_dict` does with a state taken in the middle of an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MidEpoch {
    Error,
    Skip,
    Restart,
}

/// Where a [`RayDataSource`] stands.
#[derive(Debug, Default)]
struct Position {
    /// Epochs finished.
    epoch: u64,
    /// Items (batches or rows) yielded in the current epoch.
    position: u64,
    /// Items to drop at the start of the next epoch (a restored `"skip"` state).
    skip: u64,
    /// The iteration that owns the position; older ones end at their next item.
    generation: u64,
}

/// A Ray Data iterator as the source of an spdl_rs pipeline: each iteration of this object is one epoch of
/// ``iterator.iter_batches(...)`` (or ``iter_rows()``), read lazily.
///
/// ``iterator`` is a ``ray.data.DataIterator`` (``Dataset.iterator()``, one of ``Dataset.streaming_split(n)``,
/// or ``ray.train.get_dataset_shard(name)``) or a ``Dataset``. Back-pressure is kept end to end: the pipeline
/// pulls a batch only when its queue has room, Ray prefetches at most ``prefetch_batches`` ahead of that, and
/// Ray's streaming executor stops producing when its output is not consumed.
///
/// .. code-block:: python
///
///     shards = ds.streaming_split(world_size, equal=True)
///     source = RayDataSource(shards[rank], batch_size=32)
///     pipeline = (PipelineBuilder().add_source(source)
///                 .pipe(collate).pipe(to_cuda).add_sink(2).build(num_threads=2))
///
/// Checkpoints (:py:meth:`state_dict`): Ray's iterators cannot be resumed in the middle of an epoch, so a
/// position is exact only at an epoch boundary. A mid-epoch state is refused by :py:meth:`load_state_dict`
/// unless ``mid_epoch`` says what to do instead (see docs/scale-out.md).
///
/// Args:
///     iterator: A ``ray.data.DataIterator`` or ``ray.data.Dataset``.
///     batch_size: Rows per batch (``None``: Ray's blocks as they come); ignored with ``rows``.
///     batch_format: ``"numpy"`` (a dict of arrays), ``"pandas"``, ``"pyarrow"`` or ``"default"``.
///     rows: Yield rows (``iter_rows()``) instead of batches.
///     drop_last: Drop each epoch's last, incomplete batch.
///     prefetch_batches: Batches Ray reads ahead of the pipeline.
///     local_shuffle_buffer_size, local_shuffle_seed: Ray's local shuffle of ``iter_batches``.
///     mid_epoch: What :py:meth:`load_state_dict` does with a state taken in the middle of an epoch:
///         ``"error"`` (a ``ValueError``), ``"skip"`` (re-read the epoch and drop what was already yielded:
///         exact only when the dataset's order is deterministic, see docs/scale-out.md) or ``"restart"``
///         (re-read the epoch from its start: the rows already yielded come again).
#[pyclass(module = "spdl_rs._native.ray", frozen)]
pub(crate) struct RayDataSource {
    iterator: Py<PyAny>,
    rows: bool,
    /// `iter_batches`' keyword arguments.
    kwargs: Py<PyDict>,
    mid_epoch: MidEpoch,
    state: std::sync::Mutex<Position>,
}

impl RayDataSource {
    fn state(&self) -> std::sync::MutexGuard<'_, Position> {
        // A panic while the lock was held cannot leave the counters half-written: take them as they are.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[pymethods]
impl RayDataSource {
    #[new]
    #[pyo3(signature = (
        iterator, *, batch_size=Some(256), batch_format="numpy", rows=false, drop_last=false,
        prefetch_batches=1, local_shuffle_buffer_size=None, local_shuffle_seed=None, mid_epoch="error",
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        iterator: Bound<'_, PyAny>,
        batch_size: Option<i64>,
        batch_format: &str,
        rows: bool,
        drop_last: bool,
        prefetch_batches: i64,
        local_shuffle_buffer_size: Option<Py<PyAny>>,
        local_shuffle_seed: Option<Py<PyAny>>,
        mid_epoch: &str,
    ) -> PyResult<Self> {
        import_ray(py)?;
        if !(iterator.hasattr("iter_batches")? && iterator.hasattr("iter_rows")?) {
            return Err(PyTypeError::new_err(format!(
                "RayDataSource takes a ray.data.DataIterator or ray.data.Dataset, got {}",
                iterator.get_type().name()?
            )));
        }
        if let Some(b) = batch_size.filter(|&b| b < 1) {
            return Err(PyValueError::new_err(format!("batch_size must be a positive integer, got {b}")));
        }
        if prefetch_batches < 0 {
            return Err(PyValueError::new_err(format!(
                "prefetch_batches must be a non-negative integer, got {prefetch_batches}"
            )));
        }
        let mid_epoch = match mid_epoch {
            "error" => MidEpoch::Error,
            "skip" => MidEpoch::Skip,
            "restart" => MidEpoch::Restart,
            other => {
                return Err(PyValueError::new_err(format!(
                    "mid_epoch must be one of ['error', 'skip', 'restart'], got {other:?}"
                )));
            }
        };
        let kwargs = PyDict::new(py);
        kwargs.set_item("batch_size", batch_size)?;
        kwargs.set_item("batch_format", batch_format)?;
        kwargs.set_item("drop_last", drop_last)?;
        kwargs.set_item("prefetch_batches", prefetch_batches)?;
        kwargs.set_item("local_shuffle_buffer_size", local_shuffle_buffer_size)?;
        kwargs.set_item("local_shuffle_seed", local_shuffle_seed)?;
        Ok(Self {
            iterator: iterator.unbind(),
            rows,
            kwargs: kwargs.unbind(),
            mid_epoch,
            state: std::sync::Mutex::new(Position::default()),
        })
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let unit = match self.rows {
            true => "rows".to_owned(),
            false => format!(
                "batches of {}",
                self.kwargs.bind(py).get_item("batch_size")?.map_or_else(String::new, |b| b.to_string())
            ),
        };
        let s = self.state();
        Ok(format!("RayDataSource({unit}, epoch={}, position={})", s.epoch, s.position))
    }

    /// Epochs finished so far (the number of the epoch an iteration reads next, or reads now).
    #[getter]
    fn epoch(&self) -> u64 {
        self.state().epoch
    }

    /// Items (batches, or rows with ``rows=True``) yielded in the current epoch.
    #[getter]
    fn position(&self) -> u64 {
        self.state().position
    }

    /// Whether an epoch is enumerated again in the same order: what a whole-pipeline checkpoint needs to
    /// resume mid-epoch by skipping delivered positions. True only with ``mid_epoch="skip"`` (the user vouches
    /// for a deterministic order); otherwise a pipeline's ``state_dict()`` in the middle of an epoch is refused.
    #[getter]
    fn deterministic_epoch_order(&self) -> bool {
        self.mid_epoch == MidEpoch::Skip
    }

    /// One epoch of the iterator's items, from where a restored state says (see :py:meth:`load_state_dict`).
    ///
    /// A new iteration supersedes one left unfinished (a pipeline stopped mid-epoch): the old one ends at its
    /// next item, and the new one reads the epoch again from its start (the epoch counts once it is read to
    /// its end). The epoch starts at the first ``next()``.
    fn __iter__(slf: Bound<'_, Self>) -> RayEpoch {
        RayEpoch { source: slf.unbind(), run: None }
    }

    /// The source's position: ``{"epoch": epochs finished, "position": items yielded in the current epoch}``.
    ///
    /// It is the position of what this source handed the pipeline; a pipeline checkpoint maps it to what was
    /// delivered. Exact to restore at an epoch boundary (``position == 0``) only.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let s = self.state();
        d.set_item("epoch", s.epoch)?;
        d.set_item("position", s.position)?;
        Ok(d)
    }

    /// Restores a position from :py:meth:`state_dict`; the next iteration starts there.
    ///
    /// An iteration in progress ends at its next item.
    ///
    /// Raises:
    ///     ValueError: The state is malformed, or taken in the middle of an epoch with ``mid_epoch="error"``
    ///         (Ray's iterators cannot resume mid-epoch).
    fn load_state_dict(&self, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let malformed = || {
            let shown = state.repr().map_or_else(|_| "?".to_owned(), |r| r.to_string());
            PyValueError::new_err(format!(
                "RayDataSource: not a state of this source (expected 'epoch' and 'position'), got {shown}"
            ))
        };
        let field = |name: &str| -> PyResult<u64> {
            let value = state.get_item(name).map_err(|_| malformed())?;
            match value.is_instance_of::<pyo3::types::PyBool>() {
                false => value.extract::<u64>().ok(),
                true => None,
            }
            .ok_or_else(|| {
                let shown = value.repr().map_or_else(|_| "?".to_owned(), |r| r.to_string());
                PyValueError::new_err(format!(
                    "RayDataSource: state '{name}' must be a non-negative integer, got {shown}"
                ))
            })
        };
        let (epoch, position) = (field("epoch")?, field("position")?);
        if position > 0 && self.mid_epoch == MidEpoch::Error {
            return Err(PyValueError::new_err(format!(
                "RayDataSource: the state is in the middle of epoch {epoch} (after {position} items) and Ray's \
                 DataIterator cannot resume mid-epoch; checkpoint at an epoch boundary, or build the source with \
                 mid_epoch='skip' (exact only for a deterministic order) or mid_epoch='restart' (the epoch's first \
                 items come again)"
            )));
        }
        let mut s = self.state();
        s.generation += 1;
        s.epoch = epoch;
        s.position = 0;
        s.skip = if self.mid_epoch == MidEpoch::Skip { position } else { 0 };
        Ok(())
    }
}

/// One iteration of a [`RayDataSource`]: the Ray iterator of the epoch, opened at the first `next()`.
#[derive(Debug)]
struct EpochRun {
    items: Py<PyAny>,
    generation: u64,
    /// `false` once the iteration has ended (exhausted, superseded or closed).
    open: bool,
}

/// An iteration of :py:class:`RayDataSource` (one epoch). Not frozen: a second thread calling ``next()``
/// while one is in progress gets PyO3's "already borrowed" error, not a lock held across a Python call.
#[pyclass(module = "spdl_rs._native.ray")]
pub(crate) struct RayEpoch {
    source: Py<RayDataSource>,
    run: Option<EpochRun>,
}

impl RayEpoch {
    /// Opens the epoch: claims the source's position and skips what a restored state says.
    fn open(&self, py: Python<'_>) -> PyResult<EpochRun> {
        let source = self.source.get();
        let (generation, skip, epoch) = {
            let mut s = source.state();
            s.generation += 1;
            s.position = 0;
            (s.generation, std::mem::take(&mut s.skip), s.epoch)
        };
        let iterator = source.iterator.bind(py);
        let items = match source.rows {
            true => iterator.call_method0("iter_rows")?,
            false => iterator.call_method("iter_batches", (), Some(source.kwargs.bind(py)))?,
        }
        .try_iter()?;
        let mut items = items;
        let run = EpochRun { items: items.clone().into_any().unbind(), generation, open: true };
        for done in 0..skip {
            if items.next().transpose()?.is_none() {
                close(py, &run.items);
                return Err(PyValueError::new_err(format!(
                    "RayDataSource: the restored state skips {skip} items of epoch {epoch}, but the epoch has \
                     only {done} (the dataset changed since the checkpoint)"
                )));
            }
        }
        let mut s = source.state();
        if s.generation == generation {
            s.position = skip;
        }
        Ok(run)
    }
}

/// Closes a Ray iterator where it can be closed (a generator).
fn close(py: Python<'_>, items: &Py<PyAny>) {
    let items = items.bind(py);
    if let Ok(close) = items.getattr("close")
        && let Err(e) = close.call0()
    {
        e.write_unraisable(py, Some(items));
    }
}

#[pymethods]
impl RayEpoch {
    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        if self.run.is_none() {
            self.run = Some(self.open(py)?);
        }
        let Some(run) = self.run.as_mut().filter(|r| r.open) else { return Ok(None) };
        let source = self.source.get();
        let item = run.items.bind(py).call_method0("__next__");
        let item = match item {
            Ok(item) => item,
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyStopIteration>(py) => {
                run.open = false;
                let mut s = source.state();
                if s.generation == run.generation {
                    s.epoch += 1;
                    s.position = 0;
                }
                drop(s);
                close(py, &run.items);
                return Ok(None);
            }
            Err(e) => {
                run.open = false;
                close(py, &run.items);
                return Err(e);
            }
        };
        let mut s = source.state();
        if s.generation != run.generation {
            // Superseded by a newer iteration or a restored state.
            drop(s);
            run.open = false;
            close(py, &run.items);
            return Ok(None);
        }
        s.position += 1;
        Ok(Some(item.unbind()))
    }

    /// Ends the iteration and closes Ray's iterator (as a generator's ``close()``).
    fn close(&mut self, py: Python<'_>) {
        if let Some(run) = self.run.as_mut().filter(|r| r.open) {
            run.open = false;
            close(py, &run.items);
        }
    }
}
