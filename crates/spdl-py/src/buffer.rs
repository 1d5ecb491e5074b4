//! `spdl_rs.Buffer`: a Rust [`Buffer`] seen from Python without copies, through numpy's
//! `__array_interface__`, the buffer protocol (where the target Python's ABI has it) and DLPack.

use std::ffi::CStr;
use std::sync::Arc;

use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use spdl_buffer::{Buffer, DType, Layout, system_allocator};

use crate::dlpack;

/// An array in host memory made by spdl-rs (a decoded image, a batch, audio samples).
///
/// `numpy.asarray(buf)` and `buf.numpy()` view the memory in place; the array keeps the buffer alive.
/// `__dlpack__` hands it to `numpy.from_dlpack`, `torch.from_dlpack` or `jax.dlpack` in place as well.
#[pyclass(name = "Buffer", module = "spdl_rs", frozen)]
pub struct PyBuffer {
    inner: Arc<Buffer>,
    /// Shape and strides in the `Py_ssize_t` form the buffer protocol points into (unused where the target
    /// ABI has no buffer protocol: the abi3 build for Python 3.10).
    #[cfg_attr(all(Py_LIMITED_API, not(Py_3_11)), allow(dead_code))]
    shape: Vec<isize>,
    #[cfg_attr(all(Py_LIMITED_API, not(Py_3_11)), allow(dead_code))]
    strides: Vec<isize>,
}

impl std::fmt::Debug for PyBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl PyBuffer {
    /// Wraps a buffer for Python.
    pub fn new(buffer: Buffer) -> Self {
        Self::from_arc(Arc::new(buffer))
    }

    /// Wraps a shared buffer for Python.
    pub fn from_arc(inner: Arc<Buffer>) -> Self {
        let shape = inner.shape().iter().map(|&d| d as isize).collect();
        let strides = inner.strides_bytes().iter().map(|&s| s as isize).collect();
        Self { inner, shape, strides }
    }

    /// The Rust buffer.
    pub fn buffer(&self) -> &Arc<Buffer> {
        &self.inner
    }
}

/// Parses numpy's dtype names (`"uint8"`, `"float32"`, ...) and the short ones (`"u8"`, `"f32"`).
pub(crate) fn parse_dtype(name: &str) -> PyResult<DType> {
    Ok(match name {
        "uint8" | "u8" => DType::U8,
        "int8" | "i8" => DType::I8,
        "uint16" | "u16" => DType::U16,
        "int16" | "i16" => DType::I16,
        "uint32" | "u32" => DType::U32,
        "int32" | "i32" => DType::I32,
        "int64" | "i64" => DType::I64,
        "float32" | "f32" => DType::F32,
        "float64" | "f64" => DType::F64,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown dtype {other:?}; expected one of uint8, int8, uint16, int16, uint32, int32, int64, float32, float64"
            )));
        }
    })
}

/// numpy's name of a dtype (`"uint8"`, `"float32"`, ...).
pub(crate) fn numpy_name(dtype: DType) -> &'static str {
    match dtype {
        DType::U8 => "uint8",
        DType::I8 => "int8",
        DType::U16 => "uint16",
        DType::I16 => "int16",
        DType::U32 => "uint32",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::F32 => "float32",
        DType::F64 => "float64",
        _ => "void",
    }
}

/// numpy's type string (`__array_interface__["typestr"]`, and the CUDA array interface's).
pub(crate) fn typestr(dtype: DType) -> &'static str {
    #[cfg(target_endian = "little")]
    const E: &str = "<";
    #[cfg(target_endian = "big")]
    const E: &str = ">";
    match dtype {
        DType::U8 => "|u1",
        DType::I8 => "|i1",
        DType::U16 if E == "<" => "<u2",
        DType::I16 if E == "<" => "<i2",
        DType::U32 if E == "<" => "<u4",
        DType::I32 if E == "<" => "<i4",
        DType::I64 if E == "<" => "<i8",
        DType::F32 if E == "<" => "<f4",
        DType::F64 if E == "<" => "<f8",
        DType::U16 => ">u2",
        DType::I16 => ">i2",
        DType::U32 => ">u4",
        DType::I32 => ">i4",
        DType::I64 => ">i8",
        DType::F32 => ">f4",
        DType::F64 => ">f8",
        // DType is non-exhaustive: a new element type reads as raw bytes until it is mapped here.
        _ => "|V1",
    }
}

/// The buffer protocol's struct-module format character (native byte order).
#[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
fn format(dtype: DType) -> &'static CStr {
    match dtype {
        DType::U8 => c"B",
        DType::I8 => c"b",
        DType::U16 => c"H",
        DType::I16 => c"h",
        DType::U32 => c"I",
        DType::I32 => c"i",
        DType::I64 => c"q",
        DType::F32 => c"f",
        DType::F64 => c"d",
        _ => c"B",
    }
}

#[cfg(not(any(Py_3_11, not(Py_LIMITED_API))))]
#[allow(dead_code)]
fn format(_dtype: DType) -> &'static CStr {
    c"B"
}

#[pymethods]
impl PyBuffer {
    /// The extent of each axis.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.shape())
    }

    /// The element type as numpy names it (`"uint8"`, `"float32"`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        numpy_name(self.inner.dtype())
    }

    /// What the axes mean (`"NHWC"`, `"HWC"`, `"CT"`, ... or `""`).
    #[getter]
    fn layout(&self) -> &'static str {
        self.inner.layout().axes()
    }

    /// Size of the data in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }

    /// Number of axes.
    #[getter]
    fn ndim(&self) -> usize {
        self.inner.shape().len()
    }

    /// True if the memory is page-locked (CUDA pinned).
    #[getter]
    fn is_pinned(&self) -> bool {
        self.inner.is_pinned()
    }

    /// The address of the first byte (for checking that two views share memory).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.inner.as_ptr() as usize
    }

    /// Length of the first axis.
    fn __len__(&self) -> usize {
        self.inner.shape().first().copied().unwrap_or(0)
    }

    fn __repr__(&self) -> String {
        format!(
            "spdl_rs.Buffer(shape={:?}, dtype={}, layout={:?}, allocator={})",
            self.inner.shape(),
            self.dtype(),
            self.layout(),
            self.inner.allocator().name()
        )
    }

    /// numpy's array interface (version 3): lets `numpy.asarray` view the memory in place.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, self.inner.shape())?)?;
        d.set_item("typestr", typestr(self.inner.dtype()))?;
        // (address, read_only): writable, like the arrays of any other loader; no Rust code reads or writes
        // the bytes once the buffer is in Python.
        d.set_item("data", (self.inner.as_ptr() as usize, false))?;
        d.set_item("strides", py.None())?;
        d.set_item("version", 3)?;
        Ok(d)
    }

    /// The buffer as a numpy array sharing its memory (the array keeps the buffer alive).
    fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let np = slf.py().import("numpy")?;
        np.call_method1("asarray", (slf,))
    }

    /// DLPack export (Python array API): a capsule that `from_dlpack` consumers read in place.
    ///
    /// Only CPU memory is exported; `stream` must be `None`; `dl_device`, if given, must be `(1, 0)`;
    /// `copy=True` exports a fresh copy.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        if let Some(s) = stream
            && !s.is_none()
        {
            return Err(PyBufferError::new_err(format!("stream must be None for a CPU buffer, got {s}")));
        }
        if let Some(dev) = dl_device
            && dev != (dlpack::DEVICE_CPU, 0)
        {
            return Err(PyBufferError::new_err(format!(
                "spdl_rs.Buffer lives on the CPU (1, 0); cannot export to device {dev:?}"
            )));
        }
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        if copy == Some(true) {
            let copy = py
                .detach(|| self.inner.try_clone())
                .map_err(|e| PyBufferError::new_err(format!("copying the buffer for DLPack: {e}")))?;
            return dlpack::to_capsule(py, &Arc::new(copy), versioned);
        }
        dlpack::to_capsule(py, &self.inner, versioned)
    }

    /// DLPack device: `(kDLCPU, 0)`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (dlpack::DEVICE_CPU, 0)
    }

    /// Buffer protocol: a writable, C-contiguous view of the memory.
    #[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::os::raw::c_int,
    ) -> PyResult<()> {
        use pyo3::ffi;
        if view.is_null() {
            return Err(PyBufferError::new_err("the buffer protocol was called with a null view"));
        }
        let me = slf.get();
        let item = me.inner.dtype().size() as isize;
        // SAFETY: `view` is non-null and points at a Py_buffer that CPython lets us fill. `obj` takes a strong
        // reference to `slf`, so `buf`, `shape`, `strides` and `format` (which point into `slf` or at statics)
        // stay valid until the consumer releases the view.
        unsafe {
            (*view).buf = me.inner.as_ptr() as *mut std::ffi::c_void;
            (*view).len = me.inner.nbytes() as isize;
            (*view).readonly = 0;
            (*view).itemsize = item;
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                format(me.inner.dtype()).as_ptr() as *mut std::os::raw::c_char
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = me.shape.len() as std::os::raw::c_int;
            (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
                me.shape.as_ptr() as *mut isize
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                me.strides.as_ptr() as *mut isize
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
            (*view).obj = slf.into_any().into_ptr();
        }
        Ok(())
    }

    /// Buffer protocol release: nothing to free (the view points into the object it references).
    #[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}

    /// A zero-filled buffer from the system allocator.
    #[staticmethod]
    #[pyo3(signature = (shape, dtype="uint8"))]
    fn zeros(py: Python<'_>, shape: Vec<usize>, dtype: &str) -> PyResult<PyBuffer> {
        let dt = parse_dtype(dtype)?;
        let b = py
            .detach(|| Buffer::zeros(dt, &shape, Layout::Plain, &system_allocator()))
            .map_err(|e| PyValueError::new_err(format!("allocating a {dtype} buffer of shape {shape:?}: {e}")))?;
        Ok(PyBuffer::new(b))
    }

    /// A buffer holding a copy of `data` (raw bytes, native byte order) with the given shape and dtype.
    #[staticmethod]
    #[pyo3(signature = (data, shape, dtype="uint8"))]
    fn from_bytes(data: &[u8], shape: Vec<usize>, dtype: &str) -> PyResult<PyBuffer> {
        let dt = parse_dtype(dtype)?;
        let mut b = Buffer::zeros(dt, &shape, Layout::Plain, &system_allocator())
            .map_err(|e| PyValueError::new_err(format!("allocating a {dtype} buffer of shape {shape:?}: {e}")))?;
        if b.nbytes() != data.len() {
            return Err(PyValueError::new_err(format!(
                "{} bytes do not fill a {dtype} buffer of shape {shape:?} ({} bytes)",
                data.len(),
                b.nbytes()
            )));
        }
        b.as_bytes_mut().copy_from_slice(data);
        Ok(PyBuffer::new(b))
    }

    /// A deep copy (new memory from the same allocator).
    fn copy(&self, py: Python<'_>) -> PyResult<PyBuffer> {
        let b = py
            .detach(|| self.inner.try_clone())
            .map_err(|e| PyValueError::new_err(format!("copying the buffer: {e}")))?;
        Ok(PyBuffer::new(b))
    }
}
