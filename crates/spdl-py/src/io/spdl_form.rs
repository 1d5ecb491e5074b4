//! `spdl_rs.io.load_image`, `decode_image`, `load_image_batch`, `load_audio` and `load_video`: one function
//! each that takes both SPDL's form (``filter_desc``, ``demux_config``, ``decode_config``, ``device_config``,
//! ``storage``: demux, decode through an FFmpeg filter graph, convert, move to a device) and spdl_rs's own
//! keywords (decoded in Rust by `super::load_image` and the like). SPDL's spellings (``pix_fmt``,
//! ``timestamp=(start, end)``, encoded bytes to ``load_image``) are translated here, once.

use pyo3::exceptions::{PyException, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyList, PyMemoryView, PyString};

use crate::args::Int;
use crate::buffer::PyBuffer;

/// SPDL's default ``filter_desc`` of ``decode_packets`` (``rgb24`` pixels, ``fltp`` samples).
const FILTER_DESC_DEFAULT: &str = "__PLACEHOLDER__";

/// SPDL's configuration objects and where spdl_rs puts the same settings; ``None``, SPDL's "defaults", is
/// accepted.
const SPDL_CONFIGS: [(&str, &str); 4] = [
    ("demux_config", "the file's own container is detected from its bytes"),
    ("decode_config", "decoding runs with its own threads, see the function's keywords"),
    ("device_config", "move the result with torch.from_dlpack(...).cuda(non_blocking=True) or spdl-cuda"),
    ("storage", "the result owns its memory (numpy/DLPack views keep it alive)"),
];

/// SPDL's ``pix_fmt`` spellings and spdl_rs's pixel formats.
const PIX_FMTS: [(&str, &str); 5] =
    [("gray", "gray"), ("gray8", "gray"), ("rgb", "rgb"), ("rgb24", "rgb"), ("rgba", "rgba")];

const IMAGE_INSTEAD: &str = "size=(width, height), filter= and pix_fmt=";

/// SPDL's keywords of one call, as given (``**spdl``).
struct Spdl<'py> {
    func: &'static str,
    kwargs: Option<Bound<'py, PyDict>>,
}

impl<'py> Spdl<'py> {
    /// SPDL's keywords of `func`: any other keyword is a `TypeError`, as for a function that does not take it.
    fn new(py: Python<'py>, func: &'static str, kwargs: Option<&Bound<'py, PyDict>>) -> PyResult<Self> {
        let mut unknown = Vec::new();
        for key in kwargs.into_iter().flat_map(|d| d.keys()) {
            let key: String = key.extract()?;
            if key != "filter_desc" && !SPDL_CONFIGS.iter().any(|(k, _)| *k == key) {
                unknown.push(key);
            }
        }
        unknown.sort();
        if let Some(first) = unknown.first() {
            let shown = PyString::new(py, first).repr()?;
            return Err(PyTypeError::new_err(format!("{func}() got an unexpected keyword argument {shown}")));
        }
        Ok(Self { func, kwargs: kwargs.cloned() })
    }

    /// The value of `key`, `None` when not given or given as ``None``.
    fn get(&self, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(d) = &self.kwargs else { return Ok(None) };
        Ok(d.get_item(key)?.filter(|v| !v.is_none()))
    }

    fn given(&self, key: &str) -> PyResult<bool> {
        self.kwargs.as_ref().map_or(Ok(false), |d| d.contains(key))
    }

    /// Whether the call takes SPDL's composite form: ``filter_desc=`` given (``None`` included: the decoder's
    /// own format), or a ``demux_config``/``decode_config``. spdl_rs's own keywords (`own`: name and whether it
    /// was given) cannot be combined with it; SPDL's ``storage`` is refused.
    fn form(&self, own: &[(&str, bool)]) -> PyResult<bool> {
        let spdl =
            self.given("filter_desc")? || self.get("demux_config")?.is_some() || self.get("decode_config")?.is_some();
        if spdl {
            let mut given: Vec<&str> = own.iter().filter(|(_, on)| *on).map(|(k, _)| *k).collect();
            given.sort_unstable();
            if !given.is_empty() {
                return Err(PyValueError::new_err(format!(
                    "{}: SPDL's filter_desc/demux_config/decode_config cannot be combined with spdl_rs's {}; put the \
                     conversion into filter_desc (spdl_rs.io.get_filter_desc)",
                    self.func,
                    given.join(", ")
                )));
            }
        }
        if self.get("storage")?.is_some() {
            return Err(PyValueError::new_err(format!(
                "{}: SPDL's storage is not supported by spdl_rs ({})",
                self.func, SPDL_CONFIGS[3].1
            )));
        }
        Ok(spdl)
    }

    /// For a function without SPDL's composite form: ``None`` (SPDL's default) is accepted for each keyword,
    /// anything else refused with the keywords that do the same work here (`instead`).
    fn refuse(&self, instead: &str, skip_device: bool) -> PyResult<()> {
        if self.get("filter_desc")?.is_some() {
            return Err(PyValueError::new_err(format!(
                "{}: filter_desc (an FFmpeg filter graph) is not taken here; use {instead} instead, or \
                 spdl_rs.io.load_image/load_audio/load_video, which take it",
                self.func
            )));
        }
        for (key, instead_of) in SPDL_CONFIGS {
            if !(skip_device && key == "device_config") && self.get(key)?.is_some() {
                return Err(PyValueError::new_err(format!(
                    "{}: SPDL's {key} is not supported by spdl_rs ({instead_of})",
                    self.func
                )));
            }
        }
        Ok(())
    }

    /// SPDL's config objects, each of its own type (``TypeError`` naming the keyword otherwise); in a build
    /// without FFmpeg, the ``ImportError`` of the demuxing objects.
    fn check_configs(&self, media: &Bound<'py, PyModule>) -> PyResult<()> {
        let py = media.py();
        let cuda = py.import("spdl_rs.io._cuda")?;
        let types = [
            ("demux_config", media.getattr("DemuxConfig")?, "spdl_rs.io.demux_config(...)"),
            ("decode_config", media.getattr("DecodeConfig")?, "spdl_rs.io.decode_config(...)"),
            ("device_config", cuda.getattr("CUDAConfig")?, "spdl_rs.io.cuda_config(...)"),
        ];
        for (key, cls, make) in types {
            if let Some(value) = self.get(key)?
                && !value.is_instance(&cls)?
            {
                return Err(PyTypeError::new_err(format!(
                    "{key} must be a {} ({make}), got {}",
                    cls.getattr("__name__")?,
                    value.get_type().name()?
                )));
            }
        }
        if let Some(fd) = self.get("filter_desc")?
            && !fd.is_instance_of::<PyString>()
        {
            return Err(PyTypeError::new_err(format!(
                "filter_desc must be a str or None, got {}",
                fd.get_type().name()?
            )));
        }
        Ok(())
    }

    /// ``filter_desc`` as given (``None`` included), SPDL's default when not given.
    fn filter_desc(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self.kwargs.as_ref().map(|d| d.get_item("filter_desc")).transpose()?.flatten() {
            Some(v) => Ok(v),
            None => Ok(PyString::new(py, FILTER_DESC_DEFAULT).into_any()),
        }
    }

    /// `buffer`, moved to SPDL's ``device_config`` when one is given.
    fn to_device(&self, buffer: Bound<'py, PyAny>) -> PyResult<Py<PyAny>> {
        let Some(device_config) = self.get("device_config")? else { return Ok(buffer.unbind()) };
        let py = buffer.py();
        let kwargs = PyDict::new(py);
        kwargs.set_item("device_config", device_config)?;
        Ok(py.import("spdl_rs.io._cuda")?.getattr("transfer_buffer")?.call((buffer,), Some(&kwargs))?.unbind())
    }

    /// SPDL's ``load_audio``/``load_video``/``load_image``: demux, decode with ``filter_desc`` (default:
    /// SPDL's conversion; ``None``: the decoder's format), convert, and move to ``device_config`` if given.
    fn load(
        &self,
        kind: &str,
        src: &Bound<'py, PyAny>,
        timestamp: Option<&Bound<'py, PyAny>>,
        name: Option<&str>,
    ) -> PyResult<Py<PyAny>> {
        let py = src.py();
        let media = py.import("spdl_rs.io._media")?;
        self.check_configs(&media)?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("demux_config", self.get("demux_config")?)?;
        kwargs.set_item("name", name)?;
        if kind != "image" {
            kwargs.set_item("timestamp", timestamp)?;
        }
        let packets = media.getattr(format!("demux_{kind}").as_str())?.call((src,), Some(&kwargs))?;
        let frames =
            media.getattr("decode_packets")?.call1((packets, self.filter_desc(py)?, self.get("decode_config")?))?;
        self.to_device(media.getattr("convert_frames")?.call1((frames,))?)
    }
}

/// spdl_rs's pixel format of `pixel_format` and SPDL's ``pix_fmt`` (which wins when given).
fn pixel_format_of<'py>(
    pixel_format: &Bound<'py, PyAny>,
    pix_fmt: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let Some(pix_fmt) = pix_fmt else { return Ok(pixel_format.clone()) };
    let found = pix_fmt.extract::<String>().ok().and_then(|p| PIX_FMTS.iter().find(|(k, _)| *k == p));
    match found {
        Some((_, ours)) => Ok(PyString::new(pix_fmt.py(), ours).into_any()),
        None => {
            let names: Vec<String> = PIX_FMTS.iter().map(|(k, _)| format!("'{k}'")).collect();
            Err(PyValueError::new_err(format!(
                "pix_fmt must be one of [{}], got {}",
                names.join(", "),
                pix_fmt.repr()?
            )))
        }
    }
}

/// ``start`` and ``duration`` of a window, each when given.
type Window<'py> = (Option<Bound<'py, PyAny>>, Option<Bound<'py, PyAny>>);

/// ``timestamp=(start, end)`` (SPDL) as ``start``/``duration``.
fn window<'py>(
    timestamp: Option<&Bound<'py, PyAny>>,
    start: Option<Bound<'py, PyAny>>,
    duration: Option<Bound<'py, PyAny>>,
) -> PyResult<Window<'py>> {
    let Some(t) = timestamp else { return Ok((start, duration)) };
    if start.is_some() || duration.is_some() {
        return Err(PyValueError::new_err("give either timestamp=(start, end) or start/duration, not both"));
    }
    let (begin, end) = bounds(t)?;
    if !(end > begin && begin >= 0.0) {
        return Err(PyValueError::new_err(format!(
            "timestamp must be (start, end) with 0 <= start < end, got {}",
            t.repr()?
        )));
    }
    let py = t.py();
    Ok((Some(begin.into_pyobject(py)?.into_any()), Some((end - begin).into_pyobject(py)?.into_any())))
}

/// ``(float(start), float(end))`` of a window.
fn bounds(t: &Bound<'_, PyAny>) -> PyResult<(f64, f64)> {
    let items = t.try_iter()?.collect::<PyResult<Vec<_>>>()?;
    match items.as_slice() {
        [a, b] => Ok((a.extract()?, b.extract()?)),
        _ => Err(PyValueError::new_err(format!("expected 2 values to unpack, got {}", items.len()))),
    }
}

/// An empty window (``(t, t)``, or end before start): SPDL's form, which decodes no frame.
fn empty(timestamp: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    let Some(t) = timestamp else { return Ok(false) };
    let (start, end) = bounds(t)?;
    Ok(end.partial_cmp(&start) != Some(std::cmp::Ordering::Greater))
}

fn truthy(v: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    v.map_or(Ok(false), |v| v.is_truthy())
}

fn differs(v: &Bound<'_, PyAny>, default: &str) -> PyResult<bool> {
    v.ne(default)
}

/// Whether `src` is encoded bytes (bytes-like, not a path).
fn is_bytes(src: &Bound<'_, PyAny>) -> PyResult<bool> {
    if src.is_instance_of::<PyBytes>() || src.is_instance_of::<PyByteArray>() || src.is_instance_of::<PyMemoryView>() {
        return Ok(true);
    }
    Ok(!src.is_instance_of::<PyString>() && !src.hasattr("__fspath__")? && src.hasattr("__buffer__")?)
}

/// A dict of `items`.
fn dict<'py>(py: Python<'py>, items: &[(&str, Option<&Bound<'py, PyAny>>)]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in items {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// Decodes one image into an HWC ``uint8`` :py:class:`spdl_rs.Buffer` (GIL released).
///
/// Args:
///     src: A path or, as in SPDL, the encoded bytes.
///     size: ``(width, height)`` to resize to, or ``None`` for the original size.
///     pixel_format: ``"rgb"``, ``"rgba"`` or ``"gray"``.
///     filter: The resize filter (``"bilinear"``, ``"nearest"``, ``"box"``, ``"hamming"``, ``"bicubic"``).
///     exif_orientation: Apply the EXIF orientation.
///     name: The name of ``src`` in error messages when it is bytes.
///     pix_fmt: SPDL's spelling of ``pixel_format`` (``"rgb24"``, ``"rgba"``, ``"gray"``).
///     filter_desc, demux_config, decode_config, device_config: SPDL's form. Given any of them (``filter_desc``
///         given at all, ``None`` included), the call runs as SPDL's: demux, decode through the FFmpeg filter
///         graph (``None``: the decoder's own format), :py:func:`convert_frames`, and a transfer to the
///         device. spdl_rs's own keywords cannot be combined with it. ``storage``: ``None`` only.
#[pyfunction]
#[pyo3(signature = (
    src, *, size=None, pixel_format="rgb", filter="bilinear", exif_orientation=false, name="<bytes>", pix_fmt=None,
    **spdl
), text_signature = "(src, *, size=None, pixel_format='rgb', filter='bilinear', exif_orientation=False, \
    name='<bytes>', pix_fmt=None, **spdl)")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_image<'py>(
    py: Python<'py>,
    src: &Bound<'py, PyAny>,
    size: Option<&Bound<'py, PyAny>>,
    pixel_format: &str,
    filter: &str,
    exif_orientation: bool,
    name: &str,
    pix_fmt: Option<&Bound<'py, PyAny>>,
    spdl: Option<&Bound<'py, PyDict>>,
) -> PyResult<Py<PyAny>> {
    let spdl = Spdl::new(py, "load_image", spdl)?;
    let own = [
        ("size", truthy(size)?),
        ("pix_fmt", truthy(pix_fmt)?),
        ("exif_orientation", exif_orientation),
        ("pixel_format", pixel_format != "rgb"),
        ("filter", filter != "bilinear"),
    ];
    let spdl_name = (name != "<bytes>").then_some(name);
    if spdl.form(&own)? || spdl.get("device_config")?.is_some() {
        return spdl.load("image", src, None, spdl_name);
    }
    let options = image_options(py, size, pixel_format, filter, exif_orientation, pix_fmt)?;
    let buffer: PyBuffer = if is_bytes(src)? {
        super::decode_image(py, src, name, Some(&options))?
    } else {
        super::load_image(py, src.extract()?, Some(&options))?
    };
    Ok(Py::new(py, buffer)?.into_any())
}

/// The options of one image's decode.
fn image_options<'py>(
    py: Python<'py>,
    size: Option<&Bound<'py, PyAny>>,
    pixel_format: &str,
    filter: &str,
    exif_orientation: bool,
    pix_fmt: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let pf = pixel_format_of(&PyString::new(py, pixel_format).into_any(), pix_fmt)?;
    let (filter, exif) =
        (PyString::new(py, filter).into_any(), PyBool::new(py, exif_orientation).to_owned().into_any());
    dict(
        py,
        &[("size", size), ("pixel_format", Some(&pf)), ("filter", Some(&filter)), ("exif_orientation", Some(&exif))],
    )
}

/// `value` as a Python `str`.
fn or_str<'py>(py: Python<'py>, value: &str) -> Bound<'py, PyAny> {
    PyString::new(py, value).into_any()
}

/// Decodes one encoded image (JPEG, PNG, WebP, GIF, BMP, TIFF; bytes or a buffer) into an HWC ``uint8``
/// :py:class:`spdl_rs.Buffer` (GIL released). Arguments as :py:func:`load_image`.
#[pyfunction]
#[pyo3(signature = (
    data, *, size=None, pixel_format="rgb", filter="bilinear", exif_orientation=false, name="<bytes>", pix_fmt=None,
    **spdl
), text_signature = "(data, *, size=None, pixel_format='rgb', filter='bilinear', exif_orientation=False, \
    name='<bytes>', pix_fmt=None, **spdl)")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_image<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    size: Option<&Bound<'py, PyAny>>,
    pixel_format: &str,
    filter: &str,
    exif_orientation: bool,
    name: &str,
    pix_fmt: Option<&Bound<'py, PyAny>>,
    spdl: Option<&Bound<'py, PyDict>>,
) -> PyResult<PyBuffer> {
    Spdl::new(py, "decode_image", spdl)?.refuse(IMAGE_INSTEAD, false)?;
    let options = image_options(py, size, pixel_format, filter, exif_orientation, pix_fmt)?;
    super::decode_image(py, data, name, Some(&options))
}

/// Decodes a batch of images (paths or encoded bytes) resized to ``width`` x ``height`` into one contiguous
/// :py:class:`spdl_rs.Buffer` of shape ``[N, H, W, C]`` (or ``[N, C, H, W]``), in parallel, GIL released.
/// Each image is written straight into its slot of the batch.
///
/// Args:
///     srcs: Paths or encoded bytes.
///     width, height: The output size of every image. Either ``None``: SPDL's form (below) at the images' own
///         size in that dimension.
///     layout: ``"NHWC"`` or ``"NCHW"``.
///     normalize: ``None`` (``uint8`` output), ``"imagenet"``, ``"unit"`` or ``(mean, std)`` (``float32``
///         output, ``(x / 255 - mean) / std``).
///     pixel_format: ``"rgb"``, ``"rgba"`` or ``"gray"`` (``pix_fmt``: SPDL's spelling).
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
///     filter_desc, demux_config, decode_config, device_config: SPDL's form, also taken where ``width`` or
///         ``height`` is ``None``: each image decoded through the FFmpeg filter graph (default: scaled, in
///         ``pix_fmt``), failed images logged and left out (``strict``: any failure raises), the rest converted
///         into one buffer (their shapes must agree). ``storage``: ``None`` only.
#[pyfunction]
#[pyo3(signature = (
    srcs, width=None, height=None, *, layout="NHWC", normalize=None, pixel_format="rgb", filter="bilinear",
    strict=true, num_threads=None, return_info=false, transform="resize", seed=Int::from(0), keys=None, pix_fmt=None,
    **spdl
), text_signature = "(srcs, width=None, height=None, *, layout='NHWC', normalize=None, pixel_format='rgb', \
    filter='bilinear', strict=True, num_threads=None, return_info=False, transform='resize', seed=0, keys=None, \
    pix_fmt=None, **spdl)")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_image_batch<'py>(
    py: Python<'py>,
    srcs: &Bound<'py, PyAny>,
    width: Option<Int>,
    height: Option<Int>,
    layout: &str,
    normalize: Option<&Bound<'py, PyAny>>,
    pixel_format: &str,
    filter: &str,
    strict: bool,
    num_threads: Option<&Bound<'py, PyAny>>,
    return_info: bool,
    transform: &str,
    seed: Int,
    keys: Option<&Bound<'py, PyAny>>,
    pix_fmt: Option<&Bound<'py, PyAny>>,
    spdl: Option<&Bound<'py, PyDict>>,
) -> PyResult<Py<PyAny>> {
    let spdl = Spdl::new(py, "load_image_batch", spdl)?;
    let (layout, pf) = (or_str(py, layout), or_str(py, pixel_format));
    let (filter, transform) = (or_str(py, filter), or_str(py, transform));
    let seed = seed.value().into_pyobject(py)?.into_any();
    let own = [
        ("layout", differs(&layout, "NHWC")?),
        ("normalize", truthy(normalize)?),
        ("pixel_format", differs(&pf, "rgb")?),
        ("filter", differs(&filter, "bilinear")?),
        ("num_threads", truthy(num_threads)?),
        ("return_info", return_info),
        ("transform", differs(&transform, "resize")?),
        ("seed", seed.is_truthy()?),
        ("keys", truthy(keys)?),
    ];
    let (Some(w), Some(h), false) = (&width, &height, spdl.form(&own)?) else {
        if width.is_none() && height.is_none() && own.iter().any(|(_, on)| *on) {
            return Err(PyValueError::new_err("load_image_batch: width and height are needed with spdl_rs's keywords"));
        }
        return load_image_batch_spdl(srcs, width.as_ref(), height.as_ref(), pix_fmt, strict, &spdl);
    };
    spdl.refuse("width=, height=, filter= and pix_fmt=", false)?;
    let strict = PyBool::new(py, strict).to_owned().into_any();
    let options = dict(
        py,
        &[
            ("layout", Some(&layout)),
            ("normalize", normalize),
            ("pixel_format", Some(&pixel_format_of(&pf, pix_fmt)?)),
            ("filter", Some(&filter)),
            ("strict", Some(&strict)),
            ("num_threads", num_threads),
            ("transform", Some(&transform)),
            ("seed", Some(&seed)),
        ],
    )?;
    let keys = keys.filter(|k| !k.is_none()).map(|k| k.extract::<Vec<u64>>()).transpose()?;
    super::load_image_batch(py, srcs, w.clone(), h.clone(), return_info, keys, Some(&options))
}

/// SPDL's ``load_image_batch``: each image demuxed and decoded through the filter graph (default: scaled to
/// ``width`` x ``height`` where given, in ``pix_fmt``), the failures logged and left out (``strict``: any
/// failure raises), then one ``convert_frames`` of the rest (their shapes must agree).
fn load_image_batch_spdl<'py>(
    srcs: &Bound<'py, PyAny>,
    width: Option<&Int>,
    height: Option<&Int>,
    pix_fmt: Option<&Bound<'py, PyAny>>,
    strict: bool,
    spdl: &Spdl<'py>,
) -> PyResult<Py<PyAny>> {
    let py = srcs.py();
    if !srcs.is_truthy()? {
        return Err(PyValueError::new_err("`srcs` must not be empty."));
    }
    let media = py.import("spdl_rs.io._media")?;
    spdl.check_configs(&media)?;
    let mut filter_desc = spdl.filter_desc(py)?;
    if filter_desc.eq(FILTER_DESC_DEFAULT)? {
        let pix_fmt = match pix_fmt {
            Some(p) if p.is_truthy()? => p.extract::<String>()?,
            _ => "rgb24".to_owned(),
        };
        let int = |v: Option<&Int>| v.map(|v| v.value().into_pyobject(py)).transpose();
        let (w, h) = (int(width)?, int(height)?);
        let desc = super::filter_desc::get_video_filter_desc(
            None,
            None,
            w.as_ref().map(|w| w.as_any()),
            h.as_ref().map(|h| h.as_any()),
            "bicubic".to_owned(),
            Some("pad".to_owned()),
            None,
            None,
            Some(pix_fmt),
            None,
            None,
            None,
        )?;
        filter_desc = desc.into_pyobject(py)?.into_any();
    }
    let demux_kwargs = dict(py, &[("demux_config", spdl.get("demux_config")?.as_ref())])?;
    let (demux, decode) = (media.getattr("demux_image")?, media.getattr("decode_packets")?);
    let decode_config = spdl.get("decode_config")?;
    let frames = PyList::empty(py);
    let logger = py.import("logging")?.call_method1("getLogger", ("spdl_rs.io",))?;
    let mut total = 0usize;
    for src in srcs.try_iter()? {
        let src = src?;
        total += 1;
        let decoded = demux
            .call((&src,), Some(&demux_kwargs))
            .and_then(|packets| decode.call1((packets, &filter_desc, &decode_config)));
        match decoded {
            Ok(f) => frames.append(f)?,
            Err(err) if err.is_instance_of::<PyException>(py) => {
                let what = if src.is_instance_of::<PyBytes>()
                    || src.is_instance_of::<PyByteArray>()
                    || src.is_instance_of::<PyMemoryView>()
                {
                    format!("bytes object at {}", src.as_ptr() as usize)
                } else {
                    src.repr()?.to_string()
                };
                logger.call_method1("error", ("Failed to decode an image from %s: %s.", what, err.value(py)))?;
            }
            Err(err) => return Err(err),
        }
    }
    if strict && frames.len() != total {
        return Err(PyRuntimeError::new_err(format!(
            "Failed to load some images ({} of {total}; logged).",
            total - frames.len()
        )));
    }
    if frames.is_empty() {
        return Err(PyRuntimeError::new_err("Failed to load all the images."));
    }
    spdl.to_device(media.getattr("convert_frames")?.call1((frames,))?)
}

/// Decodes one audio clip into a :py:class:`spdl_rs.Buffer` (GIL released, no copy): ``[C, T]``
/// (``layout="channels_first"``) or ``[T, C]`` (``"interleaved"``), ``float32`` in ``[-1, 1]`` or ``int16``.
///
/// WAV, FLAC, MP3, Ogg Vorbis, AAC (ADTS, MP4/M4A) and MKV/WebM audio decode in Rust (symphonia); in a build
/// with video support FFmpeg reads the rest (audio tracks of videos, Opus, ...).
///
/// Args:
///     src: A path (``str`` or ``os.PathLike``) or encoded bytes (``bytes``, ``bytearray``, ``memoryview``).
///     timestamp: SPDL's ``(start, end)`` in seconds, instead of ``start``/``duration``.
///     start: Window start in seconds (the decoder seeks to it when the container allows).
///     duration: Window length in seconds (``None``: to the end).
///     sample_rate: Output rate in Hz (``None``: the source's).
///     channels: ``None`` (all, in order), ``"mono"`` (mean of all channels) or a list of source channel
///         indices (repeats allowed, e.g. ``[0, 0]``).
///     dtype: ``"float32"`` or ``"int16"``.
///     layout: ``"channels_first"`` or ``"interleaved"``.
///     num_samples: Pad with zeros or truncate to exactly this many samples per channel.
///     backend: ``"auto"``, ``"symphonia"`` or ``"ffmpeg"`` (video builds only).
///     limits: Overrides of the decoding bounds (``max_samples``, ``max_packets``, ``max_channels``,
///         ``max_sample_rate``, ``max_bad_packets``).
///     name: The name of ``src`` in error messages when it is bytes (its extension is a format hint).
///     return_info: Also return a dict: ``sample_rate``, ``num_samples`` (samples decoded, before padding),
///         ``start`` (seconds), ``codec``, ``container``, ``source_sample_rate``, ``source_channels``.
///     filter_desc, demux_config, decode_config, device_config: SPDL's form. Given any of them (``filter_desc``
///         given at all, ``None`` included), the call runs as SPDL's: demux, decode through the FFmpeg filter
///         graph (``None``: the decoder's own format), :py:func:`convert_frames`, and a transfer to the
///         device. spdl_rs's own keywords cannot be combined with it. ``storage``: ``None`` only.
///
/// Raises:
///     OSError: The file cannot be read.
///     ValueError: Invalid options (e.g. a channel the file does not have).
///     RuntimeError: The input is empty, corrupt, in an unknown format or over a limit; the message names it.
#[pyfunction]
#[pyo3(signature = (
    src, timestamp=None, *, start=None, duration=None, sample_rate=None, channels=None, dtype="float32",
    layout="channels_first", num_samples=None, backend="auto", limits=None, name=None, return_info=false, **spdl
), text_signature = "(src, timestamp=None, *, start=None, duration=None, sample_rate=None, channels=None, \
    dtype='float32', layout='channels_first', num_samples=None, backend='auto', limits=None, name=None, \
    return_info=False, **spdl)")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_audio<'py>(
    py: Python<'py>,
    src: &Bound<'py, PyAny>,
    timestamp: Option<&Bound<'py, PyAny>>,
    start: Option<Bound<'py, PyAny>>,
    duration: Option<Bound<'py, PyAny>>,
    sample_rate: Option<&Bound<'py, PyAny>>,
    channels: Option<&Bound<'py, PyAny>>,
    dtype: &str,
    layout: &str,
    num_samples: Option<&Bound<'py, PyAny>>,
    backend: &str,
    limits: Option<&Bound<'py, PyAny>>,
    name: Option<&str>,
    return_info: bool,
    spdl: Option<&Bound<'py, PyDict>>,
) -> PyResult<Py<PyAny>> {
    let spdl = Spdl::new(py, "load_audio", spdl)?;
    let (dtype, layout, backend) = (or_str(py, dtype), or_str(py, layout), or_str(py, backend));
    let own = [
        ("start", start.is_some()),
        ("duration", duration.is_some()),
        ("sample_rate", truthy(sample_rate)?),
        ("channels", truthy(channels)?),
        ("dtype", differs(&dtype, "float32")?),
        ("layout", differs(&layout, "channels_first")?),
        ("num_samples", truthy(num_samples)?),
        ("backend", differs(&backend, "auto")?),
        ("limits", truthy(limits)?),
        ("return_info", return_info),
    ];
    if spdl.form(&own)? || spdl.get("device_config")?.is_some() || empty(timestamp)? {
        return spdl.load("audio", src, timestamp, name);
    }
    let (start, duration) = window(timestamp, start, duration)?;
    let options = dict(
        py,
        &[
            ("start", start.as_ref()),
            ("duration", duration.as_ref()),
            ("sample_rate", sample_rate),
            ("channels", channels),
            ("dtype", Some(&dtype)),
            ("layout", Some(&layout)),
            ("num_samples", num_samples),
            ("backend", Some(&backend)),
            ("limits", limits),
        ],
    )?;
    super::audio::load_audio(py, src, name, return_info, Some(&options))
}

/// Demuxes and decodes a video (a path or encoded bytes) into a ``uint8`` :py:class:`spdl_rs.Buffer`
/// ``[N, H, W, C]`` (GIL released, no copy). FFmpeg seeks to the keyframe before ``start``; frames that are
/// not selected are decoded but never converted.
///
/// Args:
///     src: A path (``str`` or ``os.PathLike``) or encoded bytes.
///     timestamp: SPDL's ``(start, end)`` in seconds, instead of ``start``/``duration``.
///     start: Window start in seconds (presentation time).
///     duration: Window length in seconds (``None``: to the end).
///     fps: Output frame rate: at each tick the frame on screen then (frames repeat above the source rate).
///     every_k: Every k-th frame of the window.
///     num_frames: Exactly this many frames, spread uniformly over the window (repeats if it has fewer).
///         At most one of ``fps``, ``every_k``, ``num_frames``; none: every frame.
///     width, height: Output size (both or neither; neither keeps the coded size).
///     pix_fmt: ``"rgb24"`` (``C = 3``) or ``"gray"`` (``C = 1``).
///     filter: Scaling filter: ``"bicubic"``, ``"bilinear"``, ``"nearest"`` or ``"area"``.
///     threads: Decoder threads (``0``: FFmpeg picks one per core).
///     limits: Overrides of the bounds (``max_packets``, ``max_packet_bytes``, ``max_frames``, ``max_pixels``,
///         ``max_output_bytes``, ``max_bad_packets``).
///     name: The name of ``src`` in error messages when it is bytes.
///     return_info: Also return a dict: ``pts`` (seconds, per frame), ``frame_rate``, ``codec``, ``item``.
///     filter_desc, demux_config, decode_config, device_config: SPDL's form. Given any of them (``filter_desc``
///         given at all, ``None`` included), the call runs as SPDL's: demux, decode through the FFmpeg filter
///         graph (``None``: the decoder's own format), :py:func:`convert_frames`, and a transfer to the
///         device. spdl_rs's own keywords cannot be combined with it. ``storage``: ``None`` only.
///
/// Raises:
///     OSError: The file cannot be read.
///     ValueError: Invalid options.
///     RuntimeError: The input is corrupt, has no video stream or is over a limit; the message names it.
#[cfg(feature = "ffmpeg")]
#[pyfunction]
#[pyo3(signature = (
    src, timestamp=None, *, start=None, duration=None, fps=None, every_k=None, num_frames=None, width=None,
    height=None, pix_fmt="rgb24", filter="bicubic", threads=Int::from(1), limits=None, name=None, return_info=false,
    **spdl
), text_signature = "(src, timestamp=None, *, start=None, duration=None, fps=None, every_k=None, \
    num_frames=None, width=None, height=None, pix_fmt='rgb24', filter='bicubic', threads=1, limits=None, \
    name=None, return_info=False, **spdl)")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_video<'py>(
    py: Python<'py>,
    src: &Bound<'py, PyAny>,
    timestamp: Option<&Bound<'py, PyAny>>,
    start: Option<Bound<'py, PyAny>>,
    duration: Option<Bound<'py, PyAny>>,
    fps: Option<&Bound<'py, PyAny>>,
    every_k: Option<&Bound<'py, PyAny>>,
    num_frames: Option<&Bound<'py, PyAny>>,
    width: Option<&Bound<'py, PyAny>>,
    height: Option<&Bound<'py, PyAny>>,
    pix_fmt: &str,
    filter: &str,
    threads: Int,
    limits: Option<&Bound<'py, PyAny>>,
    name: Option<&str>,
    return_info: bool,
    spdl: Option<&Bound<'py, PyDict>>,
) -> PyResult<Py<PyAny>> {
    let spdl = Spdl::new(py, "load_video", spdl)?;
    let (pix_fmt, filter) = (or_str(py, pix_fmt), or_str(py, filter));
    let threads = threads.value().into_pyobject(py)?.into_any();
    let own = [
        ("start", start.is_some()),
        ("duration", duration.is_some()),
        ("fps", truthy(fps)?),
        ("every_k", truthy(every_k)?),
        ("num_frames", truthy(num_frames)?),
        ("width", truthy(width)?),
        ("height", truthy(height)?),
        ("pix_fmt", differs(&pix_fmt, "rgb24")?),
        ("filter", differs(&filter, "bicubic")?),
        ("threads", threads.ne(1)?),
        ("limits", truthy(limits)?),
        ("return_info", return_info),
    ];
    if spdl.form(&own)? || spdl.get("device_config")?.is_some() || empty(timestamp)? {
        return spdl.load("video", src, timestamp, name);
    }
    let (start, duration) = window(timestamp, start, duration)?;
    let options = dict(
        py,
        &[
            ("start", start.as_ref()),
            ("duration", duration.as_ref()),
            ("fps", fps),
            ("every_k", every_k),
            ("num_frames", num_frames),
            ("width", width),
            ("height", height),
            ("pix_fmt", Some(&pix_fmt)),
            ("filter", Some(&filter)),
            ("threads", Some(&threads)),
            ("limits", limits),
        ],
    )?;
    super::video::load_video(py, src, name, return_info, Some(&options))
}
