//! DLPack export of host buffers: the C structs of the DLPack ABI (v0.8 "dltensor" and v1.x
//! "dltensor_versioned") and the PyCapsules that carry them to `np.from_dlpack`, `torch.from_dlpack` and
//! `jax.dlpack`. The consumer reads the memory in place; the capsule owns one strong reference to the
//! [`Buffer`] until the consumer's tensor is gone (its deleter drops the reference, on any thread, without
//! Python).

use std::ffi::{CStr, c_void};
use std::sync::Arc;

use pyo3::ffi;
use pyo3::prelude::*;
use spdl_buffer::{Buffer, DType};

/// `kDLCPU`.
pub(crate) const DEVICE_CPU: i32 = 1;

const CAPSULE_LEGACY: &CStr = c"dltensor";
const CAPSULE_VERSIONED: &CStr = c"dltensor_versioned";
/// `DLPACK_MAJOR_VERSION` / `DLPACK_MINOR_VERSION` of the header these structs follow.
const DLPACK_VERSION: (u32, u32) = (1, 1);

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
#[derive(Debug)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
#[derive(Debug)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
#[derive(Debug)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
#[derive(Debug)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// What the managed tensor points into; freed by the deleter. The `Arc` keeps the memory alive.
struct Context {
    _buffer: Arc<Buffer>,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

fn dl_dtype(dtype: DType) -> DLDataType {
    // kDLInt = 0, kDLUInt = 1, kDLFloat = 2.
    let code = if dtype.is_float() {
        2
    } else if dtype.is_signed() {
        0
    } else {
        1
    };
    DLDataType { code, bits: (dtype.size() * 8) as u8, lanes: 1 }
}

/// Boxes a context for `buffer` and fills a `DLTensor` that points into it.
fn tensor_for(buffer: &Arc<Buffer>) -> (Box<Context>, DLTensor) {
    let shape: Vec<i64> = buffer.shape().iter().map(|&d| d as i64).collect();
    let item = buffer.dtype().size();
    let strides: Vec<i64> = buffer.strides_bytes().iter().map(|&s| (s / item) as i64).collect();
    let mut ctx = Box::new(Context { _buffer: Arc::clone(buffer), shape, strides });
    let tensor = DLTensor {
        // The consumer may write through this pointer (DLPack has no read-only flag before v1 and the
        // versioned capsule does not set it): nothing in Rust holds a reference to the bytes any more.
        data: buffer.as_ptr() as *mut c_void,
        device: DLDevice { device_type: DEVICE_CPU, device_id: 0 },
        ndim: ctx.shape.len() as i32,
        dtype: dl_dtype(buffer.dtype()),
        shape: ctx.shape.as_mut_ptr(),
        strides: ctx.strides.as_mut_ptr(),
        byte_offset: 0,
    };
    (ctx, tensor)
}

unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: `managed` and its context were made by `Box::into_raw` in `to_capsule` and the DLPack
    // protocol calls the deleter exactly once.
    unsafe {
        let managed = Box::from_raw(managed);
        drop(Box::from_raw(managed.manager_ctx as *mut Context));
    }
}

unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if managed.is_null() {
        return;
    }
    // SAFETY: as in `delete_legacy`.
    unsafe {
        let managed = Box::from_raw(managed);
        drop(Box::from_raw(managed.manager_ctx as *mut Context));
    }
}

/// Capsule destructor: frees the tensor if no consumer took it (a consumer renames the capsule to
/// `used_dltensor[_versioned]` and becomes responsible for calling the deleter).
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by CPython with the GIL held on a live capsule object. The name checks tell which
    // struct the pointer is, and `PyCapsule_IsValid` never raises.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE_LEGACY.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, CAPSULE_LEGACY.as_ptr()) as *mut DLManagedTensor;
            delete_legacy(p);
        } else if ffi::PyCapsule_IsValid(capsule, CAPSULE_VERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, CAPSULE_VERSIONED.as_ptr()) as *mut DLManagedTensorVersioned;
            delete_versioned(p);
        }
    }
}

/// A DLPack capsule for `buffer`: the versioned one (v1.x) when the consumer asked for `max_version >= 1`,
/// else the legacy one, as the Python array API standard says.
pub(crate) fn to_capsule(py: Python<'_>, buffer: &Arc<Buffer>, versioned: bool) -> PyResult<Py<PyAny>> {
    let (ctx, dl_tensor) = tensor_for(buffer);
    let ctx = Box::into_raw(ctx) as *mut c_void;
    let (ptr, name): (*mut c_void, &CStr) = if versioned {
        let managed = Box::new(DLManagedTensorVersioned {
            version: DLPackVersion { major: DLPACK_VERSION.0, minor: DLPACK_VERSION.1 },
            manager_ctx: ctx,
            deleter: Some(delete_versioned),
            flags: 0,
            dl_tensor,
        });
        (Box::into_raw(managed) as *mut c_void, CAPSULE_VERSIONED)
    } else {
        let managed = Box::new(DLManagedTensor { dl_tensor, manager_ctx: ctx, deleter: Some(delete_legacy) });
        (Box::into_raw(managed) as *mut c_void, CAPSULE_LEGACY)
    };
    // SAFETY: `ptr` is a live heap struct of the kind `name` says; the destructor frees it unless a consumer
    // renamed the capsule. On failure the capsule does not exist, so we free the struct ourselves.
    unsafe {
        let capsule = ffi::PyCapsule_New(ptr, name.as_ptr(), Some(capsule_destructor));
        if capsule.is_null() {
            if versioned {
                delete_versioned(ptr as *mut DLManagedTensorVersioned);
            } else {
                delete_legacy(ptr as *mut DLManagedTensor);
            }
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, capsule).unbind())
    }
}

// The ABI sizes on 64-bit targets, checked at compile time.
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(std::mem::size_of::<DLTensor>() == 48);
    assert!(std::mem::size_of::<DLManagedTensor>() == 64);
    assert!(std::mem::size_of::<DLManagedTensorVersioned>() == 80);
};
