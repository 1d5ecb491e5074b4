//! `spdl_rs.build_info()`'s native half: what this build has (version, features, the JPEG decoder) and what
//! it found at run time (FFmpeg's libraries, a CUDA driver).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// The cargo features this module was built with.
fn features() -> Vec<&'static str> {
    let all = [
        ("io", cfg!(feature = "io")),
        ("ffmpeg", cfg!(feature = "ffmpeg")),
        ("turbojpeg", cfg!(feature = "turbojpeg")),
        ("source", cfg!(feature = "source")),
        ("http", cfg!(feature = "http")),
        ("s3", cfg!(feature = "s3")),
        ("loader", cfg!(feature = "loader")),
        ("cuda", cfg!(feature = "cuda")),
        ("abi3", cfg!(feature = "abi3")),
    ];
    all.into_iter().filter(|(_, on)| *on).map(|(name, _)| name).collect()
}

/// What this process found of FFmpeg (loading a backend on first use): `available`, `major`, `libraries`
/// (library → version), `backend` (the file loaded), `backends` and `found` (FFmpeg majors), `error`.
#[pyfunction]
pub(crate) fn _ffmpeg_status(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    #[cfg(feature = "ffmpeg")]
    {
        let s = crate::lifecycle::detach(py, spdl_io::media::ffmpeg_status);
        d.set_item("available", s.available)?;
        d.set_item("major", s.major)?;
        let libs = PyDict::new(py);
        for (lib, version) in &s.libraries {
            libs.set_item(lib, version)?;
        }
        d.set_item("libraries", libs)?;
        d.set_item("backend", s.backend)?;
        d.set_item("backends", PyList::new(py, &s.backends)?)?;
        d.set_item("found", PyList::new(py, &s.found)?)?;
        d.set_item("error", s.error)?;
    }
    #[cfg(not(feature = "ffmpeg"))]
    {
        d.set_item("available", false)?;
        d.set_item("major", py.None())?;
        d.set_item("libraries", PyDict::new(py))?;
        d.set_item("backend", py.None())?;
        d.set_item("backends", PyList::empty(py))?;
        d.set_item("found", PyList::empty(py))?;
        d.set_item("error", "spdl_rs was built without the `ffmpeg` feature")?;
    }
    Ok(d)
}

/// The native half of `spdl_rs.build_info()`: `version`, `features`, `jpeg`, `ffmpeg` (as
/// `_ffmpeg_status`), `cuda` (`{"built": bool, "devices": int}`).
#[pyfunction]
pub(crate) fn _build_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("version", env!("CARGO_PKG_VERSION"))?;
    d.set_item("features", PyList::new(py, features())?)?;
    #[cfg(feature = "io")]
    d.set_item("jpeg", spdl_io::image::jpeg_decoder())?;
    #[cfg(not(feature = "io"))]
    d.set_item("jpeg", py.None())?;
    d.set_item("ffmpeg", _ffmpeg_status(py)?)?;
    let cuda = PyDict::new(py);
    cuda.set_item("built", cfg!(feature = "cuda"))?;
    #[cfg(feature = "cuda")]
    cuda.set_item("devices", crate::lifecycle::detach(py, || spdl_cuda::device_count().unwrap_or(0)))?;
    #[cfg(not(feature = "cuda"))]
    cuda.set_item("devices", 0)?;
    d.set_item("cuda", cuda)?;
    Ok(d)
}

/// The result of an FFmpeg query (GIL released), or the clear error of a machine without FFmpeg.
#[cfg(feature = "ffmpeg")]
fn ffmpeg<T: Send>(py: Python<'_>, f: impl Send + FnOnce() -> spdl_io::Result<T>) -> PyResult<T> {
    crate::lifecycle::detach(py, f).map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(spdl_report::error_chain(&e)))
}

/// The error of a build without FFmpeg.
#[cfg(not(feature = "ffmpeg"))]
fn ffmpeg<T>(_py: Python<'_>, _f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    Err(pyo3::exceptions::PyRuntimeError::new_err("spdl_rs was built without the `ffmpeg` feature"))
}

/// The names of the FFmpeg filters available (loads FFmpeg).
#[pyfunction]
pub(crate) fn _ffmpeg_filters(py: Python<'_>) -> PyResult<Vec<String>> {
    #[cfg(feature = "ffmpeg")]
    let f = spdl_io::media::ffmpeg_filters;
    #[cfg(not(feature = "ffmpeg"))]
    let f = || Ok(Vec::new());
    ffmpeg(py, f)
}

/// FFmpeg's log level (loads FFmpeg).
#[pyfunction]
pub(crate) fn _ffmpeg_log_level(py: Python<'_>) -> PyResult<i32> {
    #[cfg(feature = "ffmpeg")]
    let f = spdl_io::media::ffmpeg_log_level;
    #[cfg(not(feature = "ffmpeg"))]
    let f = || Ok(0);
    ffmpeg(py, f)
}

/// Sets FFmpeg's log level (loads FFmpeg).
#[pyfunction]
pub(crate) fn _set_ffmpeg_log_level(py: Python<'_>, level: i32) -> PyResult<()> {
    #[cfg(feature = "ffmpeg")]
    let f = move || spdl_io::media::set_ffmpeg_log_level(level);
    #[cfg(not(feature = "ffmpeg"))]
    let f = move || {
        let _ = level;
        Ok(())
    };
    ffmpeg(py, f)
}
