//! The PyCapsules of DLPack export: the versioned `"dltensor_versioned"` (DLPack 1.1) or the legacy
//! `"dltensor"` capsule that `np.from_dlpack`, `torch.from_dlpack` and `jax.dlpack` take. Only the capsule glue
//! lives here; the DLPack structs, the managed tensors and their deleters are spdl-buffer's
//! ([`spdl_buffer::dlpack`], shared with spdl-cuda's device buffers). The consumer reads the memory in place;
//! the capsule owns one strong reference to the [`Buffer`] until the consumer's tensor is gone (its deleter
//! drops the reference, on any thread, without Python).

use std::ffi::{CStr, c_void};
use std::sync::Arc;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use spdl_buffer::Buffer;
use spdl_buffer::dlpack::{
    DLDeviceType, DLManagedTensor, DLManagedTensorVersioned, DlpackTensor, DlpackTensorVersioned,
};

/// `kDLCPU`.
pub(crate) const DEVICE_CPU: i32 = DLDeviceType::CPU.0;

const CAPSULE_LEGACY: &CStr = c"dltensor";
const CAPSULE_VERSIONED: &CStr = c"dltensor_versioned";

/// Capsule destructor: frees the tensor if no consumer took it (a consumer renames the capsule to
/// `used_dltensor[_versioned]` and becomes responsible for calling the deleter).
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by CPython with the GIL held on a live capsule object. The name checks tell which
    // struct the pointer is, `PyCapsule_IsValid` never raises, and a capsule still carrying its original name
    // owns its tensor, which is deleted once, here (dropping the owned tensor calls its deleter).
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE_LEGACY.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, CAPSULE_LEGACY.as_ptr()) as *mut DLManagedTensor;
            drop(DlpackTensor::from_raw(p));
        } else if ffi::PyCapsule_IsValid(capsule, CAPSULE_VERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, CAPSULE_VERSIONED.as_ptr()) as *mut DLManagedTensorVersioned;
            drop(DlpackTensorVersioned::from_raw(p));
        }
    }
}

/// A DLPack capsule for `buffer`: the versioned one (v1.1) when the consumer asked for `max_version >= 1`,
/// else the legacy one, as the Python array API standard says.
pub(crate) fn to_capsule(py: Python<'_>, buffer: &Arc<Buffer>, versioned: bool) -> PyResult<Py<PyAny>> {
    let export_err = |e: spdl_buffer::BufferError| PyBufferError::new_err(format!("DLPack export: {e}"));
    let tensor = if versioned {
        Managed::Versioned(DlpackTensorVersioned::from_shared_buffer(Arc::clone(buffer)).map_err(export_err)?)
    } else {
        Managed::Legacy(DlpackTensor::from_shared_buffer(Arc::clone(buffer)).map_err(export_err)?)
    };
    managed_to_capsule(py, tensor)
}

/// A managed tensor of either DLPack ABI, ready to go into a capsule.
pub(crate) enum Managed {
    /// `"dltensor"` (pre-1.0 consumers).
    Legacy(DlpackTensor),
    /// `"dltensor_versioned"` (DLPack 1.x).
    Versioned(DlpackTensorVersioned),
}

/// The capsule of a managed tensor (host or device memory); the capsule owns the tensor until a consumer takes
/// it.
pub(crate) fn managed_to_capsule(py: Python<'_>, tensor: Managed) -> PyResult<Py<PyAny>> {
    let (ptr, name, versioned): (*mut c_void, &CStr, bool) = match tensor {
        Managed::Versioned(t) => (t.into_raw().cast::<c_void>(), CAPSULE_VERSIONED, true),
        Managed::Legacy(t) => (t.into_raw().cast::<c_void>(), CAPSULE_LEGACY, false),
    };
    // SAFETY: `ptr` is a live managed tensor of the kind `name` says; the destructor frees it unless a consumer
    // renamed the capsule. On failure the capsule does not exist, so we free the tensor ourselves.
    unsafe {
        let capsule = ffi::PyCapsule_New(ptr, name.as_ptr(), Some(capsule_destructor));
        if capsule.is_null() {
            if versioned {
                drop(DlpackTensorVersioned::from_raw(ptr.cast::<DLManagedTensorVersioned>()));
            } else {
                drop(DlpackTensor::from_raw(ptr.cast::<DLManagedTensor>()));
            }
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, capsule).unbind())
    }
}
