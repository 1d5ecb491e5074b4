//! `spdl_rs.io.encode_image`/`save_image`'s native part: pixels to an image file (spdl-io's encoder), GIL
//! released.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use spdl_io::image::{EncodeColor, EncodeOptions, encode_image as encode_pixels};

use super::io_err;

/// Encodes ``data`` (``height`` rows of ``width`` pixels of ``color``: ``"rgb24"``, ``"rgba"``, ``"gray8"``,
/// ``"gray16"`` native-endian) in the format of ``path``'s extension and writes it there, GIL released.
#[pyfunction]
#[pyo3(signature = (path, data, width, height, color, *, quality=None, compression=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode_image_file(
    py: Python<'_>,
    path: PathBuf,
    data: &[u8],
    width: u32,
    height: u32,
    color: &str,
    quality: Option<u8>,
    compression: Option<u8>,
) -> PyResult<()> {
    let color = match color {
        "rgb24" => EncodeColor::Rgb8,
        "rgba" => EncodeColor::Rgba8,
        "gray8" => EncodeColor::Gray8,
        "gray16" => EncodeColor::Gray16,
        other => return Err(PyValueError::new_err(format!("unknown pixel layout {other:?}"))),
    };
    let opts = EncodeOptions { quality, compression };
    crate::lifecycle::detach(py, || {
        let bytes = encode_pixels(data, width, height, color, &path, &opts)?;
        std::fs::write(&path, bytes).map_err(|source| spdl_io::Error::Io { path: path.clone(), source })
    })
    .map_err(io_err)
}

/// The pixels of ``data`` in ``pix_fmt`` (SPDL's shapes): C-order bytes, width, height and layout. ``data`` is a
/// NumPy array, a CPU tensor (``.numpy()``) or any array-like (``numpy.asarray``).
fn pixels(data: &Bound<'_, PyAny>, pix_fmt: &str) -> PyResult<(Vec<u8>, u32, u32, EncodeColor)> {
    let py = data.py();
    let numpy = py.import("numpy")?;
    let mut data = data.clone();
    if data.hasattr("numpy")? && !data.hasattr("__array_interface__")? {
        if data.hasattr("cpu")? {
            data = data.call_method0("cpu")?;
        }
        data = data.call_method0("numpy")?;
    }
    let arr = numpy.call_method1("asarray", (data,))?;
    let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
    let dtype = arr.getattr("dtype")?;
    let itemsize: usize = dtype.getattr("itemsize")?.extract()?;
    let shape_err = |want: &str| -> PyResult<PyErr> {
        Ok(PyValueError::new_err(format!("The input shape must be {want}. Found: {}", arr.getattr("shape")?.str()?)))
    };
    let dtype_err = |want: &str| -> PyResult<PyErr> {
        Ok(PyValueError::new_err(format!("The input dtype must be {want}. Found: {}", dtype.str()?)))
    };
    let (color, channels, item) = match pix_fmt {
        "rgb24" | "bgr24" => (EncodeColor::Rgb8, Some(3), 1),
        "rgba" => (EncodeColor::Rgba8, Some(4), 1),
        "gray" | "gray8" => (EncodeColor::Gray8, None, 1),
        "gray16" | "gray16be" | "gray16le" => (EncodeColor::Gray16, None, 2),
        "yuv444p" => {
            return Err(PyValueError::new_err(
                "pix_fmt='yuv444p' is not supported by spdl_rs's image encoder; convert to rgb24 first",
            ));
        }
        other => return Err(PyValueError::new_err(format!("Unsupported pix_fmt: {other}"))),
    };
    match channels {
        Some(c) if shape.len() != 3 || shape[2] != c => return Err(shape_err(&format!("[H, W, C=={c}]"))?),
        None if shape.len() != 2 => return Err(shape_err("[H, W]")?),
        _ => {}
    }
    if itemsize != item {
        return Err(dtype_err(if item == 1 { "8bit" } else { "16-bit" })?);
    }
    let contiguous = numpy.call_method1("ascontiguousarray", (&arr,))?;
    let mut bytes = contiguous.call_method0("tobytes")?.cast_into::<PyBytes>()?.as_bytes().to_vec();
    match pix_fmt {
        "bgr24" => bytes.chunks_exact_mut(3).for_each(|px| px.swap(0, 2)),
        // FFmpeg's gray16be/gray16le name the byte order of the array's bytes (SPDL hands them to FFmpeg as they
        // are): read them so, into native 16-bit values. "gray16" is native order.
        "gray16be" => bytes.chunks_exact_mut(2).for_each(|v| {
            let n = u16::from_be_bytes([v[0], v[1]]).to_ne_bytes();
            v.copy_from_slice(&n);
        }),
        "gray16le" => bytes.chunks_exact_mut(2).for_each(|v| {
            let n = u16::from_le_bytes([v[0], v[1]]).to_ne_bytes();
            v.copy_from_slice(&n);
        }),
        _ => {}
    }
    let side = |v: usize| u32::try_from(v).map_err(|_| PyValueError::new_err(format!("image side {v} is too large")));
    Ok((bytes, side(shape[1])?, side(shape[0])?, color))
}

/// Encodes pixels and writes the file, GIL released.
fn write_image(
    py: Python<'_>,
    path: PathBuf,
    (data, width, height, color): (Vec<u8>, u32, u32, EncodeColor),
    opts: EncodeOptions,
) -> PyResult<()> {
    crate::lifecycle::detach(py, || {
        let bytes = encode_pixels(&data, width, height, color, &path, &opts)?;
        std::fs::write(&path, bytes).map_err(|source| spdl_io::Error::Io { path: path.clone(), source })
    })
    .map_err(io_err)
}

/// Writes an image array to ``path`` (SPDL's ``encode_image``), in the format of its extension (``.jpg``/
/// ``.jpeg``, ``.png``, ``.webp`` (lossless), ``.bmp``, ``.tiff``, ``.gif``); encoded in Rust, no FFmpeg needed.
///
/// Args:
///     path: The output file.
///     data: ``uint8`` pixels: ``[H, W, 3]`` (``"rgb24"``, ``"bgr24"``), ``[H, W, 4]`` (``"rgba"``),
///         ``[H, W]`` (``"gray8"``/``"gray"``); 16-bit ``[H, W]`` for ``"gray16"`` (PNG, TIFF). A NumPy array,
///         a CPU tensor, or any array-like.
///     pix_fmt: See ``data``.
///     encode_config: SPDL's encoder configuration; only ``None`` is accepted (resize before encoding).
#[pyfunction]
#[pyo3(signature = (path, data, pix_fmt="rgb24", *, encode_config=None))]
pub(crate) fn encode_image(
    py: Python<'_>,
    path: PathBuf,
    data: &Bound<'_, PyAny>,
    pix_fmt: &str,
    encode_config: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    if encode_config.is_some_and(|c| !c.is_none()) {
        return Err(PyValueError::new_err(
            "encode_image: encode_config is not supported by spdl_rs (resize the array first)",
        ));
    }
    write_image(py, path, pixels(data, pix_fmt)?, EncodeOptions { quality: None, compression: None })
}

/// Writes an image array to ``path`` (SPDL's ``save_image``), in the format of its extension.
///
/// Args:
///     path: The output file.
///     data, pix_fmt: As :py:func:`encode_image`.
///     compression_level: PNG compression, ``0`` (fastest) to ``9`` (smallest); ``-1``: the default.
///     qscale: JPEG quality as FFmpeg's ``qscale``, ``1`` (best) to ``31`` (worst); ``-1``: quality 90.
///     bit_rate, gop_size, max_b_frames, colorspace, color_primaries, color_trc: video encoder settings
///         that an image file does not use; only their defaults are accepted.
#[pyfunction]
#[pyo3(signature = (
    path, data, pix_fmt="rgb24", *, bit_rate=-1, compression_level=-1, qscale=-1, gop_size=-1, max_b_frames=-1,
    colorspace=None, color_primaries=None, color_trc=None
))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn save_image(
    py: Python<'_>,
    path: PathBuf,
    data: &Bound<'_, PyAny>,
    pix_fmt: &str,
    bit_rate: i64,
    compression_level: i64,
    qscale: i64,
    gop_size: i64,
    max_b_frames: i64,
    colorspace: Option<String>,
    color_primaries: Option<String>,
    color_trc: Option<String>,
) -> PyResult<()> {
    let unsupported =
        |key: &str| PyValueError::new_err(format!("save_image: {key} is not supported by spdl_rs's image encoder"));
    for (key, value) in [("bit_rate", bit_rate), ("gop_size", gop_size), ("max_b_frames", max_b_frames)] {
        if value != -1 {
            return Err(unsupported(key));
        }
    }
    for (key, text) in [("colorspace", &colorspace), ("color_primaries", &color_primaries), ("color_trc", &color_trc)] {
        if text.is_some() {
            return Err(unsupported(key));
        }
    }
    let quality = match qscale {
        -1 => None,
        1..=31 => Some((100.0 - (qscale - 1) as f64 * 99.0 / 30.0).round_ties_even().clamp(1.0, 100.0) as u8),
        _ => return Err(PyValueError::new_err(format!("save_image: qscale must be in [1, 31], got {qscale}"))),
    };
    let compression = match compression_level {
        -1 => None,
        0..=9 => Some(compression_level as u8),
        _ => {
            return Err(PyValueError::new_err(format!(
                "save_image: compression_level must be in [0, 9], got {compression_level}"
            )));
        }
    };
    write_image(py, path, pixels(data, pix_fmt)?, EncodeOptions { quality, compression })
}
