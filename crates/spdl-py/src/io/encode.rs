//! `spdl_rs.io.encode_image`/`save_image`'s native part: pixels to an image file (spdl-io's encoder), GIL
//! released.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use spdl_io::image::{EncodeColor, EncodeOptions, encode_image};

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
        let bytes = encode_image(data, width, height, color, &path, &opts)?;
        std::fs::write(&path, bytes).map_err(|source| spdl_io::Error::Io { path: path.clone(), source })
    })
    .map_err(io_err)
}
