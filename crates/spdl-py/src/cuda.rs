//! `spdl_rs.io`'s host/device memory (feature `cuda`): SPDL's `CUDAConfig`, `CPUStorage` and `CUDABuffer`, and
//! the native halves of `cpu_storage`, `transfer_buffer` and `transfer_buffer_cpu`, on spdl-cuda (its pinned
//! pool and copy stream; the CUDA driver is loaded at run time, so this builds and imports without CUDA).
//!
//! Each device is opened once per process, on first use, into a [`Transfer`]: a pinned caching pool (which
//! `cpu_storage(pin_memory=True)` allocates from) and a dedicated copy stream. `transfer_buffer` queues the copy
//! of a shared `spdl_rs.Buffer` on that stream (pinned buffers are DMA'd in place, pageable ones are staged
//! through the pool) and waits for it with the GIL released, as SPDL's returns only once the copy is done; the
//! device memory is then ready for any stream. No GPU (no driver, no device, an index beyond the devices) is
//! `CUDAUnavailableError`, raised by the call that needs the GPU, never at import.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::exceptions::{PyBufferError, PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use spdl_buffer::dlpack::{DLDevice, DLDeviceType, DlpackTensor, DlpackTensorVersioned};
use spdl_buffer::{Buffer, Layout, SharedAllocator, system_allocator};
use spdl_cuda::{DeviceBuffer, Error as CudaError, Transfer, TransferConfig};

use crate::buffer::{PyBuffer, numpy_name, parse_dtype, typestr};
use crate::dlpack::{Managed, managed_to_capsule};

pyo3::create_exception!(
    spdl_rs.io,
    CUDAUnavailableError,
    PyRuntimeError,
    "No usable CUDA GPU: spdl_rs was built without the `cuda` feature, the CUDA driver library (libcuda) is not \
     installed, the driver reports no device, or the device index is beyond the devices. Raised by the call that \
     needs the GPU (never at import)."
);

/// The devices opened so far (each once per process: its pinned pool and copy stream).
static DEVICES: Mutex<Option<HashMap<usize, Arc<Transfer>>>> = Mutex::new(None);
/// The fork generation the first device was opened in (`u64::MAX`: none yet).
static DEVICES_MADE_IN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// CUDA does not survive `fork`: a child of a process that opened a device cannot use CUDA (its contexts,
/// pinned pool and copy stream belong to the parent), so every call that needs the GPU raises a
/// `RuntimeError` there instead of hanging in the driver, before `DEVICES` (which a parent thread may have
/// held at the fork) is touched.
fn fork_guard() -> PyResult<()> {
    let made_in = DEVICES_MADE_IN.load(std::sync::atomic::Ordering::Acquire);
    if made_in != u64::MAX && crate::lifecycle::made_before_fork(made_in) {
        return Err(PyRuntimeError::new_err(
            "CUDA was opened in the parent process before a fork and cannot be used in the child: \
             start workers with the 'spawn' or 'forkserver' method",
        ));
    }
    Ok(())
}

/// The [`Transfer`] of device `index`, opened on first use. Failures are not cached: a later call retries.
fn device(index: usize) -> Result<Arc<Transfer>, CudaError> {
    let mut devices = DEVICES.lock().unwrap_or_else(PoisonError::into_inner);
    let map = devices.get_or_insert_with(HashMap::new);
    if let Some(t) = map.get(&index) {
        return Ok(Arc::clone(t));
    }
    // Timing events would cost one event per copy for figures nobody reads here.
    let config = TransferConfig { device: index, timing: false, ..TransferConfig::default() };
    let t = Arc::new(Transfer::new(&config)?);
    map.insert(index, Arc::clone(&t));
    let _ = DEVICES_MADE_IN.compare_exchange(
        u64::MAX,
        crate::lifecycle::generation(),
        std::sync::atomic::Ordering::AcqRel,
        std::sync::atomic::Ordering::Acquire,
    );
    Ok(t)
}

/// An spdl-cuda error as a Python exception: no usable GPU is [`CUDAUnavailableError`], host memory that could
/// not be had is `MemoryError`, anything else (a driver call that failed) `RuntimeError`. `what` names the call.
fn to_py(what: &str, e: CudaError) -> PyErr {
    let message = format!("{what}: {}", spdl_report::error_chain(&e));
    if e.is_unavailable() {
        CUDAUnavailableError::new_err(message)
    } else if matches!(e, CudaError::HostAlloc { .. }) {
        PyMemoryError::new_err(message)
    } else {
        PyRuntimeError::new_err(message)
    }
}

fn non_negative(name: &str, value: i64) -> PyResult<usize> {
    usize::try_from(value).map_err(|_| PyValueError::new_err(format!("{name} must be >= 0, got {value}")))
}

/// Which CUDA device `transfer_buffer` copies to, and SPDL's stream and allocator settings.
///
/// Made by :py:func:`spdl_rs.io.cuda_config` (or this constructor, with the same arguments). Constructing one
/// needs no GPU: the device is opened by the first call that uses it.
#[pyclass(name = "CUDAConfig", module = "spdl_rs.io", frozen)]
#[derive(Debug)]
pub struct CudaConfig {
    device_index: usize,
    stream: usize,
    allocator: Option<(Py<PyAny>, Py<PyAny>)>,
}

#[pymethods]
impl CudaConfig {
    #[new]
    #[pyo3(signature = (device_index, stream = 2, allocator = None))]
    fn new(device_index: i64, stream: i64, allocator: Option<Bound<'_, PyAny>>) -> PyResult<CudaConfig> {
        let device_index = non_negative("device_index", device_index)?;
        let stream = non_negative("stream", stream)?;
        let allocator = match allocator {
            None => None,
            Some(pair) if pair.is_none() => None,
            Some(pair) => {
                let bad = || {
                    PyTypeError::new_err(format!(
                        "allocator must be a pair (allocate, delete) of callables: allocate(size, device_index, \
                         stream) -> address and delete(address); got {}",
                        pair.repr().map(|r| r.to_string()).unwrap_or_else(|_| "an unprintable object".into())
                    ))
                };
                let tuple = pair.cast::<PyTuple>().map_err(|_| bad())?;
                if tuple.len() != 2 {
                    return Err(bad());
                }
                let (alloc, delete) = (tuple.get_item(0)?, tuple.get_item(1)?);
                if !alloc.is_callable() || !delete.is_callable() {
                    return Err(bad());
                }
                Some((alloc.unbind(), delete.unbind()))
            }
        };
        Ok(CudaConfig { device_index, stream, allocator })
    }

    /// The CUDA device ordinal.
    #[getter]
    fn device_index(&self) -> usize {
        self.device_index
    }

    /// The ``uintptr_t`` of the CUDA stream SPDL would copy on (``2``: the per-thread default stream). spdl_rs
    /// copies on the device's dedicated copy stream and waits for the copy, so the data is ready on every stream.
    #[getter]
    fn stream(&self) -> usize {
        self.stream
    }

    /// The ``(allocate, delete)`` pair given, or ``None``.
    #[getter]
    fn allocator<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        self.allocator.as_ref().map(|(a, d)| PyTuple::new(py, [a.bind(py), d.bind(py)])).transpose()
    }

    fn __repr__(&self) -> String {
        format!(
            "CUDAConfig(device_index={}, stream={:#x}, allocator={})",
            self.device_index,
            self.stream,
            if self.allocator.is_some() { "(...)" } else { "None" }
        )
    }
}

/// A block of host memory from :py:func:`spdl_rs.io.cpu_storage`: page-locked (spdl-cuda's pinned pool) or
/// ordinary. :py:attr:`buffer` views it as a writable 1-D ``uint8`` :py:class:`spdl_rs.Buffer`; a pinned one
/// goes to the GPU by DMA with no host copy (``transfer_buffer(storage.buffer, ...)``). The memory returns to
/// the pool when the storage and every view of it are gone.
#[pyclass(name = "CPUStorage", module = "spdl_rs.io", frozen)]
#[derive(Debug)]
pub struct CpuStorage {
    inner: Arc<Buffer>,
}

#[pymethods]
impl CpuStorage {
    /// Size in bytes.
    #[getter]
    fn size(&self) -> usize {
        self.inner.nbytes()
    }

    /// True if the memory is page-locked.
    #[getter]
    fn pinned(&self) -> bool {
        self.inner.is_pinned()
    }

    /// The memory as a writable 1-D ``uint8`` :py:class:`spdl_rs.Buffer` (shared, not copied).
    #[getter]
    fn buffer(&self) -> PyBuffer {
        PyBuffer::from_arc(Arc::clone(&self.inner))
    }

    fn __repr__(&self) -> String {
        let pinned = if self.inner.is_pinned() { "True" } else { "False" };
        format!("CPUStorage(size={}, pinned={pinned})", self.inner.nbytes())
    }
}

/// An array in CUDA device memory, made by :py:func:`spdl_rs.io.transfer_buffer`.
///
/// It implements ``__cuda_array_interface__`` (version 3) and DLPack (``__dlpack__``, ``__dlpack_device__``),
/// so ``torch.as_tensor(buf, device="cuda")``, ``torch.from_dlpack(buf)``, CuPy and Numba take it without a
/// copy; the consumer keeps the device memory alive. The copy that filled it is complete before
/// ``transfer_buffer`` returns, so no stream needs to wait for it.
#[pyclass(name = "CUDABuffer", module = "spdl_rs.io", frozen)]
#[derive(Debug)]
pub struct CudaBuffer {
    inner: Arc<DeviceBuffer>,
}

#[pymethods]
impl CudaBuffer {
    /// The CUDA device ordinal.
    #[getter]
    fn device_index(&self) -> usize {
        self.inner.device_index()
    }

    /// The extent of each axis.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.shape())
    }

    /// The element type as numpy names it.
    #[getter]
    fn dtype(&self) -> &'static str {
        numpy_name(self.inner.dtype())
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }

    /// The CUDA array interface (version 3): shape, typestr, ``(device pointer, read_only)``, C-contiguous
    /// (``strides`` is ``None``) and ``stream`` ``None`` (the copy is complete: no synchronisation needed).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, self.inner.shape())?)?;
        d.set_item("typestr", typestr(self.inner.dtype()))?;
        d.set_item("data", (self.inner.device_ptr(), false))?;
        d.set_item("strides", py.None())?;
        d.set_item("stream", py.None())?;
        d.set_item("version", 3)?;
        Ok(d)
    }

    /// DLPack export (``kDLCUDA``, this device) without a copy; the capsule keeps the device memory alive.
    /// ``stream`` may be any stream handle (the copy is already complete); ``copy=True`` is refused.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        // The copy that filled the buffer completed before `transfer_buffer` returned, so every stream, the
        // consumer's included, may read it: nothing to order. `stream` is still type-checked.
        if let Some(s) = stream
            && !s.is_none()
        {
            s.extract::<i64>()
                .map_err(|_| PyTypeError::new_err(format!("stream must be an int (a CUDA stream handle), got {s}")))?;
        }
        let here = self.__dlpack_device__();
        if let Some(dev) = dl_device
            && dev != here
        {
            return Err(PyBufferError::new_err(format!(
                "this CUDABuffer lives on device {here:?}; cannot export to device {dev:?} without a copy"
            )));
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "CUDABuffer.__dlpack__(copy=True) is not supported: export without a copy and copy with the consumer",
            ));
        }
        let owner = Box::new(Arc::clone(&self.inner));
        let data = self.inner.device_ptr() as usize as *mut std::ffi::c_void;
        let device = DLDevice::cuda(self.inner.device_index());
        let (dtype, shape) = (self.inner.dtype(), self.inner.shape());
        let export_err = |e: spdl_buffer::BufferError| PyBufferError::new_err(format!("DLPack export: {e}"));
        // SAFETY: `data` is the device address of a compact row-major array of `shape` `dtype`s on `device`,
        // owned by the `DeviceBuffer` that `owner` keeps alive until the tensor's deleter drops it.
        let tensor = unsafe {
            if max_version.is_some_and(|(major, _)| major >= 1) {
                Managed::Versioned(
                    DlpackTensorVersioned::from_owner(owner, data, device, dtype, shape).map_err(export_err)?,
                )
            } else {
                Managed::Legacy(DlpackTensor::from_owner(owner, data, device, dtype, shape).map_err(export_err)?)
            }
        };
        managed_to_capsule(py, tensor)
    }

    /// DLPack device: ``(kDLCUDA, device_index)``.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (DLDeviceType::CUDA.0, self.inner.device_index() as i32)
    }

    fn __repr__(&self) -> String {
        format!(
            "CUDABuffer(device_index={}, shape={:?}, dtype={})",
            self.inner.device_index(),
            self.inner.shape(),
            numpy_name(self.inner.dtype())
        )
    }
}

/// The number of CUDA devices the driver reports; 0 without the driver (or a build without CUDA support).
#[pyfunction]
pub(crate) fn cuda_device_count(py: Python<'_>) -> usize {
    crate::lifecycle::detach(py, || spdl_cuda::device_count().unwrap_or(0))
}

/// Opens device `device_index` (its pinned pool and copy stream) if it is not open yet; raises
/// `CUDAUnavailableError` when it cannot be used.
#[pyfunction]
pub(crate) fn cuda_open(py: Python<'_>, device_index: i64) -> PyResult<()> {
    fork_guard()?;
    let index = non_negative("device_index", device_index)?;
    crate::lifecycle::detach(py, || device(index))
        .map(drop)
        .map_err(|e| to_py(&format!("opening CUDA device {index}"), e))
}

/// `cpu_storage(size, pin_memory)`: `size` bytes, zeroed, from device 0's pinned pool or the system allocator.
#[pyfunction]
#[pyo3(signature = (size, pin_memory = true))]
pub(crate) fn cuda_cpu_storage(py: Python<'_>, size: crate::args::Int, pin_memory: bool) -> PyResult<CpuStorage> {
    if pin_memory {
        fork_guard()?;
    }
    if size.value() <= 0 {
        // SPDL's words.
        return Err(PyValueError::new_err(format!("`size` must be greater than 0. (got {})", size.value())));
    }
    let size = crate::args::size_bytes("size", &size, 1, crate::args::MAX_BYTES)? as usize;
    let buffer = crate::lifecycle::detach(py, || -> PyResult<Buffer> {
        let alloc: SharedAllocator = if pin_memory {
            // Pinned blocks are portable (`CU_MEMHOSTALLOC_PORTABLE`): device 0's context serves every device.
            device(0).map_err(|e| to_py("cpu_storage(pin_memory=True)", e))?.allocator()
        } else {
            system_allocator()
        };
        Buffer::zeros(spdl_buffer::DType::U8, &[size], Layout::Plain, &alloc).map_err(|e| {
            PyMemoryError::new_err(format!(
                "cpu_storage: could not allocate {size} bytes of {} memory: {e}",
                if pin_memory { "page-locked" } else { "host" }
            ))
        })
    })?;
    Ok(CpuStorage { inner: Arc::new(buffer) })
}

/// A zeroed `spdl_rs.Buffer` of `shape` and `dtype` in the pinned pool of device `device_index`: where
/// `transfer_buffer` puts arrays it does not own, so their copy to the device is a DMA.
#[pyfunction]
pub(crate) fn cuda_pinned_buffer(
    py: Python<'_>,
    shape: Vec<usize>,
    dtype: &str,
    device_index: i64,
) -> PyResult<PyBuffer> {
    fork_guard()?;
    let dt = parse_dtype(dtype)?;
    let index = non_negative("device_index", device_index)?;
    let b = crate::lifecycle::detach(py, || -> PyResult<Buffer> {
        let t = device(index).map_err(|e| to_py("transfer_buffer", e))?;
        Buffer::zeros(dt, &shape, Layout::Plain, &t.allocator()).map_err(|e| {
            PyMemoryError::new_err(format!("transfer_buffer: pinning a {dtype} buffer of shape {shape:?}: {e}"))
        })
    })?;
    Ok(PyBuffer::new(b))
}

/// `transfer_buffer(buffer, *, device_config)` for an `spdl_rs.Buffer`: copies it to the device on its copy
/// stream and waits for the copy (GIL released).
#[pyfunction]
#[pyo3(signature = (buffer, *, device_config))]
pub(crate) fn cuda_transfer_buffer(
    py: Python<'_>,
    buffer: PyRef<'_, PyBuffer>,
    device_config: PyRef<'_, CudaConfig>,
) -> PyResult<CudaBuffer> {
    fork_guard()?;
    if device_config.allocator.is_some() {
        return Err(PyValueError::new_err(
            "transfer_buffer: cuda_config(allocator=...) is not supported by spdl_rs: device memory comes from the \
             device's stream-ordered pool (cuMemAllocAsync); pass allocator=None",
        ));
    }
    let index = device_config.device_index;
    let host = Arc::clone(buffer.buffer());
    let inner = crate::lifecycle::detach(py, || -> Result<DeviceBuffer, CudaError> {
        let t = device(index)?;
        let on_device = t.transfer_shared(host)?;
        on_device.synchronize()?;
        // The copy is done: give the host buffer (and any staging block) back now, not at the next copy.
        t.stream().release_completed()?;
        Ok(on_device)
    });
    let inner = inner.map_err(|e| to_py(&format!("transfer_buffer to CUDA device {index}"), e))?;
    Ok(CudaBuffer { inner: Arc::new(inner) })
}

/// `transfer_buffer_cpu(buffer)`: copies a `CUDABuffer` back into a new host `spdl_rs.Buffer` (GIL released).
#[pyfunction]
pub(crate) fn cuda_transfer_buffer_cpu(py: Python<'_>, buffer: PyRef<'_, CudaBuffer>) -> PyResult<PyBuffer> {
    fork_guard()?;
    let inner = Arc::clone(&buffer.inner);
    let host = py
        .detach(|| inner.to_host())
        .map_err(|e| to_py(&format!("transfer_buffer_cpu from CUDA device {}", inner.device_index()), e))?;
    Ok(PyBuffer::new(host))
}
