//! DLPack v0.8 (`dlpack.h`, `DLPACK_VERSION 80`): the C structs, and zero-copy export of host
//! [`Buffer`]s and (with the `cuda` feature) [`crate::DeviceBuffer`]s as `DLManagedTensor`s that PyTorch, JAX,
//! CuPy and NumPy take without a copy.
//!
//! This module needs no CUDA: the Python facade uses it for `__dlpack__` on CPU buffers in every build.
//!
//! Ownership: [`DlpackTensor`] owns one `DLManagedTensor` whose `manager_ctx` keeps the exported memory alive.
//! Dropping the `DlpackTensor` calls the deleter; [`DlpackTensor::into_raw`] hands the pointer (and the duty to
//! call its deleter exactly once) to a consumer, e.g. inside a `"dltensor"` PyCapsule.
//!
//! # Example
//! ```
//! use spdl_buffer::{Buffer, DType, Layout, system_allocator};
//! use spdl_cuda::dlpack::{DLDataTypeCode, DLDeviceType, DlpackTensor};
//!
//! let buf = Buffer::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], Layout::Plain, &system_allocator())?;
//! let ptr = buf.as_ptr();
//! let t = DlpackTensor::from_buffer(buf)?;
//! let dl = t.tensor();
//! assert_eq!(dl.device.device_type, DLDeviceType::CPU);
//! assert_eq!((dl.dtype.code, dl.dtype.bits, dl.dtype.lanes), (DLDataTypeCode::FLOAT, 32, 1));
//! assert_eq!(t.shape(), &[2, 3]);
//! assert_eq!(t.strides(), &[3, 1]); // in elements, as DLPack counts them
//! assert_eq!(dl.data as *const u8, ptr); // the same memory: no copy
//! let raw = t.into_raw(); // e.g. into a PyCapsule named "dltensor"; the consumer calls the deleter
//! // SAFETY: `raw` came from `into_raw` and nobody else will delete it.
//! drop(unsafe { DlpackTensor::from_raw(raw) });
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use spdl_buffer::{Buffer, DType};

use crate::error::{Error, Result};

/// `DLPACK_VERSION` of the header these structs follow.
pub const DLPACK_VERSION: u32 = 80;
/// `DLPACK_ABI_VERSION` of the header these structs follow.
pub const DLPACK_ABI_VERSION: u32 = 1;

/// `DLDeviceType`: a C enum, kept as its integer so foreign values are never undefined behaviour.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLDeviceType(pub i32);

impl DLDeviceType {
    /// `kDLCPU`: host memory.
    pub const CPU: DLDeviceType = DLDeviceType(1);
    /// `kDLCUDA`: CUDA device memory.
    pub const CUDA: DLDeviceType = DLDeviceType(2);
    /// `kDLCUDAHost`: pinned host memory from `cudaMallocHost`.
    pub const CUDA_HOST: DLDeviceType = DLDeviceType(3);
    /// `kDLROCM`: ROCm device memory.
    pub const ROCM: DLDeviceType = DLDeviceType(10);
    /// `kDLCUDAManaged`: CUDA managed (unified) memory.
    pub const CUDA_MANAGED: DLDeviceType = DLDeviceType(13);
}

/// `DLDevice`: where the data lives.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLDevice {
    /// The kind of device.
    pub device_type: DLDeviceType,
    /// The device ordinal (0 for the CPU).
    pub device_id: i32,
}

impl DLDevice {
    /// The host.
    pub const CPU: DLDevice = DLDevice { device_type: DLDeviceType::CPU, device_id: 0 };

    /// CUDA device `ordinal`.
    pub fn cuda(ordinal: usize) -> DLDevice {
        DLDevice { device_type: DLDeviceType::CUDA, device_id: i32::try_from(ordinal).unwrap_or(i32::MAX) }
    }
}

/// `DLDataTypeCode` values (the `code` field of [`DLDataType`]).
#[derive(Debug, Clone, Copy)]
pub struct DLDataTypeCode;

impl DLDataTypeCode {
    /// `kDLInt`: signed integer.
    pub const INT: u8 = 0;
    /// `kDLUInt`: unsigned integer.
    pub const UINT: u8 = 1;
    /// `kDLFloat`: IEEE float.
    pub const FLOAT: u8 = 2;
    /// `kDLOpaqueHandle`.
    pub const OPAQUE_HANDLE: u8 = 3;
    /// `kDLBfloat`: bfloat16.
    pub const BFLOAT: u8 = 4;
    /// `kDLComplex`.
    pub const COMPLEX: u8 = 5;
    /// `kDLBool`.
    pub const BOOL: u8 = 6;
}

/// `DLDataType`: element type as (code, bits, lanes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLDataType {
    /// One of [`DLDataTypeCode`]'s values.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes per element (1 for scalars).
    pub lanes: u16,
}

/// The DLPack type of a [`DType`].
pub fn dl_dtype(dtype: DType) -> Result<DLDataType> {
    let (code, bits) = match dtype {
        DType::U8 => (DLDataTypeCode::UINT, 8),
        DType::I8 => (DLDataTypeCode::INT, 8),
        DType::U16 => (DLDataTypeCode::UINT, 16),
        DType::I16 => (DLDataTypeCode::INT, 16),
        DType::U32 => (DLDataTypeCode::UINT, 32),
        DType::I32 => (DLDataTypeCode::INT, 32),
        DType::I64 => (DLDataTypeCode::INT, 64),
        DType::F32 => (DLDataTypeCode::FLOAT, 32),
        DType::F64 => (DLDataTypeCode::FLOAT, 64),
        other => return Err(Error::UnsupportedDType { dtype: other }),
    };
    Ok(DLDataType { code, bits, lanes: 1 })
}

/// `DLTensor`: a view of an n-dimensional array. Plain C data: it owns nothing.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    /// Start of the data (device address for device memory).
    pub data: *mut c_void,
    /// Where the data lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements, or null for compact row-major.
    pub strides: *mut i64,
    /// Offset of the first element from `data`, in bytes.
    pub byte_offset: u64,
}

/// `DLManagedTensor`: a [`DLTensor`] plus the context that owns its memory and the function that releases it.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The array.
    pub dl_tensor: DLTensor,
    /// The producer's owner of the memory.
    pub manager_ctx: *mut c_void,
    /// Releases `manager_ctx` and the memory; called once by whoever holds the tensor last.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// The heap block behind every tensor this crate exports. `repr(C)` with the tensor first, so a
/// `*mut DLManagedTensor` of ours is also a `*mut Export`.
#[repr(C)]
struct Export {
    managed: DLManagedTensor,
    shape: Vec<i64>,
    strides: Vec<i64>,
    owner: Box<dyn Any + Send>,
}

unsafe extern "C" fn delete_export(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    // A panic must not unwind into C; dropping the owner (a buffer returning to its pool, device memory being
    // freed) does not panic by design, and if it did we would rather leak than abort the consumer.
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: `managed` is the first field of an `Export` made by `Box::into_raw` in `export` (its
        // `manager_ctx` points at the same block), and the DLPack contract has the deleter called once.
        drop(unsafe { Box::from_raw(managed.cast::<Export>()) });
    });
}

/// An owned, exported `DLManagedTensor`: the memory stays alive until the deleter runs.
pub struct DlpackTensor {
    ptr: NonNull<DLManagedTensor>,
}

// SAFETY: the tensor's owner is `Send` (required by `export`), the shape/strides arrays are owned by the same
// block, and the raw pointers are only addresses of memory the owner keeps alive.
unsafe impl Send for DlpackTensor {}

impl fmt::Debug for DlpackTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.tensor();
        f.debug_struct("DlpackTensor")
            .field("device", &t.device)
            .field("dtype", &t.dtype)
            .field("shape", &self.shape())
            .finish()
    }
}

/// Exports memory owned by `owner` (kept alive until the deleter runs).
pub(crate) fn export(
    owner: Box<dyn Any + Send>,
    data: *mut c_void,
    device: DLDevice,
    dtype: DType,
    shape: &[usize],
) -> Result<DlpackTensor> {
    let dl = dl_dtype(dtype)?;
    let too_large = || Error::ShapeTooLarge { shape: shape.to_vec() };
    let ndim = i32::try_from(shape.len()).map_err(|_| too_large())?;
    let shape_i64 =
        shape.iter().map(|&d| i64::try_from(d)).collect::<std::result::Result<Vec<_>, _>>().map_err(|_| too_large())?;
    // Row-major strides in elements; saturating is fine: a shape whose byte size fits in isize has none overflow.
    let mut strides = vec![1i64; shape.len()];
    let mut acc = 1i64;
    for (s, &d) in strides.iter_mut().zip(&shape_i64).rev() {
        *s = acc;
        acc = acc.saturating_mul(d);
    }
    let mut export = Box::new(Export {
        managed: DLManagedTensor {
            dl_tensor: DLTensor {
                data,
                device,
                ndim,
                dtype: dl,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_export),
        },
        shape: shape_i64,
        strides,
        owner,
    });
    // The Vecs' heap arrays do not move when the box does; the box itself never moves again.
    export.managed.dl_tensor.shape = export.shape.as_mut_ptr();
    export.managed.dl_tensor.strides = export.strides.as_mut_ptr();
    let raw = Box::into_raw(export);
    // SAFETY: `raw` is a valid, exclusively owned pointer from `Box::into_raw`.
    unsafe { (*raw).managed.manager_ctx = raw.cast::<c_void>() };
    let ptr = NonNull::new(raw.cast::<DLManagedTensor>()).ok_or_else(too_large)?;
    Ok(DlpackTensor { ptr })
}

impl DlpackTensor {
    /// Exports a host buffer without copying; the tensor owns the buffer (it returns to its allocator, e.g. the
    /// pinned pool, when the consumer deletes the tensor). The device is `kDLCPU` for pinned memory too, which
    /// every consumer accepts.
    pub fn from_buffer(buffer: Buffer) -> Result<DlpackTensor> {
        let data = buffer.as_ptr().cast_mut().cast::<c_void>();
        let (dtype, shape) = (buffer.dtype(), buffer.shape().to_vec());
        export(Box::new(buffer), data, DLDevice::CPU, dtype, &shape)
    }

    /// Exports a shared host buffer without copying (e.g. one a Python object also holds, for repeated
    /// `__dlpack__` calls). The consumer may write through the tensor; as with the buffer protocol, the caller
    /// decides whether that is allowed.
    pub fn from_shared_buffer(buffer: Arc<Buffer>) -> Result<DlpackTensor> {
        let data = buffer.as_ptr().cast_mut().cast::<c_void>();
        let (dtype, shape) = (buffer.dtype(), buffer.shape().to_vec());
        export(Box::new(buffer), data, DLDevice::CPU, dtype, &shape)
    }

    /// The exported array.
    pub fn tensor(&self) -> &DLTensor {
        // SAFETY: `ptr` points at a live `DLManagedTensor` that we own until `into_raw` or drop.
        unsafe { &self.ptr.as_ref().dl_tensor }
    }

    /// Where the data lives (what `__dlpack_device__` returns).
    pub fn device(&self) -> DLDevice {
        self.tensor().device
    }

    /// The extents.
    pub fn shape(&self) -> &[i64] {
        let t = self.tensor();
        if t.ndim <= 0 || t.shape.is_null() {
            return &[];
        }
        // SAFETY: `shape` points at `ndim` i64s owned by the same live block (ours, or a producer's).
        unsafe { std::slice::from_raw_parts(t.shape, t.ndim as usize) }
    }

    /// The strides in elements (empty if the producer left them null, meaning row-major).
    pub fn strides(&self) -> &[i64] {
        let t = self.tensor();
        if t.ndim <= 0 || t.strides.is_null() {
            return &[];
        }
        // SAFETY: as in `shape`.
        unsafe { std::slice::from_raw_parts(t.strides, t.ndim as usize) }
    }

    /// Gives up ownership: the returned pointer's deleter must be called exactly once by its new owner.
    pub fn into_raw(self) -> *mut DLManagedTensor {
        let ptr = self.ptr.as_ptr();
        std::mem::forget(self);
        ptr
    }

    /// Takes ownership of a `DLManagedTensor` (ours or another producer's); dropping the result calls its
    /// deleter. Returns `None` for a null pointer.
    ///
    /// # Safety
    /// `ptr` must point at a valid `DLManagedTensor` that nobody else will delete or use after this.
    pub unsafe fn from_raw(ptr: *mut DLManagedTensor) -> Option<DlpackTensor> {
        NonNull::new(ptr).map(|ptr| DlpackTensor { ptr })
    }
}

impl Drop for DlpackTensor {
    fn drop(&mut self) {
        let ptr = self.ptr.as_ptr();
        // SAFETY: we own the tensor; its deleter (if any) is called exactly once, here.
        unsafe {
            if let Some(deleter) = (*ptr).deleter {
                deleter(ptr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{HeapBackend, PinnedPool, PoolConfig};
    use spdl_buffer::{Layout, SharedAllocator, system_allocator};
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn struct_layout_matches_the_c_header_on_64_bit() {
        assert_eq!(size_of::<DLDevice>(), 8);
        assert_eq!(size_of::<DLDataType>(), 4);
        assert_eq!(offset_of!(DLTensor, data), 0);
        assert_eq!(offset_of!(DLTensor, device), 8);
        assert_eq!(offset_of!(DLTensor, ndim), 16);
        assert_eq!(offset_of!(DLTensor, dtype), 20);
        assert_eq!(offset_of!(DLTensor, shape), 24);
        assert_eq!(offset_of!(DLTensor, strides), 32);
        assert_eq!(offset_of!(DLTensor, byte_offset), 40);
        assert_eq!(size_of::<DLTensor>(), 48);
        assert_eq!(offset_of!(DLManagedTensor, manager_ctx), 48);
        assert_eq!(offset_of!(DLManagedTensor, deleter), 56);
        assert_eq!(size_of::<DLManagedTensor>(), 64);
        assert_eq!(align_of::<DLManagedTensor>(), 8);
    }

    #[test]
    fn every_dtype_maps() {
        let cases = [
            (DType::U8, 1, 8),
            (DType::I8, 0, 8),
            (DType::U16, 1, 16),
            (DType::I16, 0, 16),
            (DType::U32, 1, 32),
            (DType::I32, 0, 32),
            (DType::I64, 0, 64),
            (DType::F32, 2, 32),
            (DType::F64, 2, 64),
        ];
        for (dt, code, bits) in cases {
            let d = dl_dtype(dt).unwrap();
            assert_eq!((d.code, d.bits, d.lanes), (code, bits, 1), "{dt}");
            assert_eq!(usize::from(d.bits) / 8, dt.size());
        }
    }

    #[test]
    fn export_shares_memory_and_deleter_returns_it_to_its_pool() {
        let pool = Arc::new(PinnedPool::new(HeapBackend, PoolConfig::default()));
        let alloc: SharedAllocator = pool.clone();
        let mut buf = Buffer::zeros(DType::I16, &[2, 3, 4], Layout::Plain, &alloc).unwrap();
        buf.as_mut_slice::<i16>().unwrap().iter_mut().enumerate().for_each(|(i, v)| *v = i as i16);
        let t = DlpackTensor::from_buffer(buf).unwrap();
        assert_eq!(pool.stats().blocks_in_use, 1);
        let dl = t.tensor();
        assert_eq!(dl.ndim, 3);
        assert_eq!(t.shape(), &[2, 3, 4]);
        assert_eq!(t.strides(), &[12, 4, 1]);
        assert_eq!(dl.byte_offset, 0);
        assert_eq!(t.device(), DLDevice::CPU);
        // Read element [1, 2, 3] through the raw DLPack view, as a consumer would.
        let idx = 12 + 2 * 4 + 3;
        // SAFETY: in bounds of the 24 i16 the buffer holds, which the tensor keeps alive.
        let v = unsafe { *(dl.data as *const i16).add(idx) };
        assert_eq!(v, idx as i16);

        // Through the raw C path: the consumer calls the deleter.
        let raw = t.into_raw();
        assert_eq!(pool.stats().blocks_in_use, 1, "into_raw does not free");
        // SAFETY: `raw` is ours, deleted once.
        unsafe {
            assert_eq!((*raw).manager_ctx, raw.cast::<c_void>());
            ((*raw).deleter.unwrap())(raw);
        }
        assert_eq!(pool.stats().blocks_in_use, 0, "the deleter returned the block to the pool");
    }

    #[test]
    fn shared_buffers_and_empty_shapes() {
        let buf = Arc::new(Buffer::zeros(DType::F64, &[0, 5], Layout::Plain, &system_allocator()).unwrap());
        let a = DlpackTensor::from_shared_buffer(buf.clone()).unwrap();
        let b = DlpackTensor::from_shared_buffer(buf.clone()).unwrap();
        assert_eq!(Arc::strong_count(&buf), 3);
        assert_eq!(a.shape(), &[0, 5]);
        drop((a, b));
        assert_eq!(Arc::strong_count(&buf), 1);

        let scalar = Buffer::zeros(DType::U8, &[], Layout::Plain, &system_allocator()).unwrap();
        let s = DlpackTensor::from_buffer(scalar).unwrap();
        assert_eq!(s.tensor().ndim, 0);
        assert!(s.shape().is_empty());
        // SAFETY: null is rejected, not dereferenced.
        assert!(unsafe { DlpackTensor::from_raw(std::ptr::null_mut()) }.is_none());
    }
}
