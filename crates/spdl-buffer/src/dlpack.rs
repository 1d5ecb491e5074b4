//! DLPack (`dlpack.h` v1.1): the C structs, and zero-copy export of memory as managed tensors in both ABIs a
//! consumer may ask for: [`DlpackTensorVersioned`] (`DLManagedTensorVersioned`, DLPack ≥ 1.0, the PyCapsule
//! `"dltensor_versioned"`) and [`DlpackTensor`] (the legacy `DLManagedTensor` of DLPack 0.x, the PyCapsule
//! `"dltensor"`). PyTorch, JAX, CuPy and NumPy read either in place.
//!
//! This is the one DLPack implementation of spdl-rs: `spdl-py` builds its `__dlpack__` capsules of host buffers
//! from it (the capsule glue stays in `spdl-py`), and `spdl-cuda` exports its device buffers through
//! [`DlpackTensor::from_owner`]. It needs nothing but `std` (feature `dlpack`).
//!
//! Ownership: a tensor owns one heap block holding the managed struct, its shape and strides, and the owner of
//! the exported memory (a [`Buffer`], an `Arc<Buffer>`, a device buffer). Dropping the tensor calls the
//! deleter; `into_raw` hands the pointer (and the duty to call its deleter exactly once) to a consumer, e.g.
//! inside a PyCapsule. The deleter may run on any thread and never unwinds into C.
//!
//! # Example
//! ```
//! use spdl_buffer::dlpack::{DLDataTypeCode, DLDeviceType, DlpackTensor, DlpackTensorVersioned};
//! use spdl_buffer::{Buffer, Layout, system_allocator};
//! use std::sync::Arc;
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
//!
//! // The versioned ABI, for a buffer shared with other owners (e.g. a Python object).
//! let shared = Arc::new(Buffer::from_slice(&[7u8; 12], &[3, 4], Layout::Plain, &system_allocator())?);
//! let v = DlpackTensorVersioned::from_shared_buffer(shared.clone())?;
//! assert_eq!((v.version().major, v.version().minor), (1, 1));
//! assert_eq!(v.flags(), 0);
//! assert_eq!(Arc::strong_count(&shared), 2); // the tensor holds one reference until its deleter runs
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::{Buffer, BufferError, DType};

/// `DLPACK_MAJOR_VERSION` of the header these structs follow (and of every versioned tensor exported here).
pub const DLPACK_MAJOR_VERSION: u32 = 1;
/// `DLPACK_MINOR_VERSION` of the header these structs follow.
pub const DLPACK_MINOR_VERSION: u32 = 1;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write through the versioned tensor.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the producer copied the data for this export.
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;

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

/// The DLPack type of a [`DType`]: every dtype has one.
pub const fn dl_dtype(dtype: DType) -> DLDataType {
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
    };
    DLDataType { code, bits, lanes: 1 }
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

/// `DLManagedTensor` (the legacy ABI, capsule `"dltensor"`): a [`DLTensor`] plus the context that owns its
/// memory and the function that releases it.
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

/// `DLPackVersion`: the version of the ABI a versioned tensor follows.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLPackVersion {
    /// Major version; a consumer rejects a major version it does not know.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// `DLManagedTensorVersioned` (DLPack ≥ 1.0, capsule `"dltensor_versioned"`): a version, flags, and the
/// legacy struct's fields in another order.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The ABI version.
    pub version: DLPackVersion,
    /// The producer's owner of the memory.
    pub manager_ctx: *mut c_void,
    /// Releases `manager_ctx` and the memory; called once by whoever holds the tensor last.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*` bits.
    pub flags: u64,
    /// The array.
    pub dl_tensor: DLTensor,
}

/// The two managed structs, for the code both share. Private: the public types are concrete.
trait Managed: Sized {
    /// A struct around `dl_tensor` whose deleter frees an [`Export`] of `Self`; `manager_ctx` is set later.
    fn new(dl_tensor: DLTensor) -> Self;
    fn dl_tensor(&self) -> &DLTensor;
    fn dl_tensor_mut(&mut self) -> &mut DLTensor;
    fn set_manager_ctx(&mut self, ctx: *mut c_void);
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)>;
}

impl Managed for DLManagedTensor {
    fn new(dl_tensor: DLTensor) -> Self {
        DLManagedTensor { dl_tensor, manager_ctx: std::ptr::null_mut(), deleter: Some(delete_export::<Self>) }
    }
    fn dl_tensor(&self) -> &DLTensor {
        &self.dl_tensor
    }
    fn dl_tensor_mut(&mut self) -> &mut DLTensor {
        &mut self.dl_tensor
    }
    fn set_manager_ctx(&mut self, ctx: *mut c_void) {
        self.manager_ctx = ctx;
    }
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
        self.deleter
    }
}

impl Managed for DLManagedTensorVersioned {
    fn new(dl_tensor: DLTensor) -> Self {
        DLManagedTensorVersioned {
            version: DLPackVersion { major: DLPACK_MAJOR_VERSION, minor: DLPACK_MINOR_VERSION },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_export::<Self>),
            flags: 0,
            dl_tensor,
        }
    }
    fn dl_tensor(&self) -> &DLTensor {
        &self.dl_tensor
    }
    fn dl_tensor_mut(&mut self) -> &mut DLTensor {
        &mut self.dl_tensor
    }
    fn set_manager_ctx(&mut self, ctx: *mut c_void) {
        self.manager_ctx = ctx;
    }
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
        self.deleter
    }
}

/// The heap block behind every tensor this module exports. `repr(C)` with the managed struct first, so a
/// `*mut M` of ours is also a `*mut Export<M>`.
#[repr(C)]
struct Export<M> {
    managed: M,
    shape: Vec<i64>,
    strides: Vec<i64>,
    owner: Box<dyn Any + Send>,
}

unsafe extern "C" fn delete_export<M>(managed: *mut M) {
    if managed.is_null() {
        return;
    }
    // A panic must not unwind into C; dropping the owner (a buffer returning to its pool, device memory being
    // freed) does not panic by design, and if it did we would rather leak than abort the consumer.
    let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `managed` is the first field of an `Export<M>` made by `Box::into_raw` in `export` (its
        // `manager_ctx` points at the same block), and the DLPack contract has the deleter called once.
        drop(unsafe { Box::from_raw(managed.cast::<Export<M>>()) });
    }));
}

/// Exports memory owned by `owner` (kept alive until the deleter runs) as a row-major array.
fn export<M: Managed>(
    owner: Box<dyn Any + Send>,
    data: *mut c_void,
    device: DLDevice,
    dtype: DType,
    shape: &[usize],
) -> Result<Owned<M>, BufferError> {
    let too_large = || BufferError::SizeOverflow { shape: shape.to_vec() };
    let ndim = i32::try_from(shape.len()).map_err(|_| too_large())?;
    let shape_i64 = shape.iter().map(|&d| i64::try_from(d)).collect::<Result<Vec<_>, _>>().map_err(|_| too_large())?;
    // Row-major strides in elements; saturating is fine: a shape whose byte size fits in isize has none overflow.
    let mut strides = vec![1i64; shape.len()];
    let mut acc = 1i64;
    for (s, &d) in strides.iter_mut().zip(&shape_i64).rev() {
        *s = acc;
        acc = acc.saturating_mul(d);
    }
    let mut export = Box::new(Export {
        managed: M::new(DLTensor {
            data,
            device,
            ndim,
            dtype: dl_dtype(dtype),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }),
        shape: shape_i64,
        strides,
        owner,
    });
    // The Vecs' heap arrays do not move when the box does; the box itself never moves again.
    let (shape_ptr, strides_ptr) = (export.shape.as_mut_ptr(), export.strides.as_mut_ptr());
    let dl = export.managed.dl_tensor_mut();
    dl.shape = shape_ptr;
    dl.strides = strides_ptr;
    let raw = Box::into_raw(export);
    // SAFETY: `raw` is a valid, exclusively owned pointer from `Box::into_raw`.
    unsafe { (*raw).managed.set_manager_ctx(raw.cast::<c_void>()) };
    let ptr = NonNull::new(raw.cast::<M>()).ok_or_else(too_large)?;
    Ok(Owned { ptr })
}

/// An owned managed tensor (ours or another producer's): calls its deleter on drop.
struct Owned<M: Managed> {
    ptr: NonNull<M>,
}

impl<M: Managed> Owned<M> {
    fn managed(&self) -> &M {
        // SAFETY: `ptr` points at a live managed struct that we own until `into_raw` or drop.
        unsafe { self.ptr.as_ref() }
    }

    fn tensor(&self) -> &DLTensor {
        self.managed().dl_tensor()
    }

    fn shape(&self) -> &[i64] {
        let t = self.tensor();
        if t.ndim <= 0 || t.shape.is_null() {
            return &[];
        }
        // SAFETY: `shape` points at `ndim` i64s owned by the same live block (ours, or a producer's).
        unsafe { std::slice::from_raw_parts(t.shape, t.ndim as usize) }
    }

    fn strides(&self) -> &[i64] {
        let t = self.tensor();
        if t.ndim <= 0 || t.strides.is_null() {
            return &[];
        }
        // SAFETY: as in `shape`.
        unsafe { std::slice::from_raw_parts(t.strides, t.ndim as usize) }
    }

    fn into_raw(self) -> *mut M {
        let ptr = self.ptr.as_ptr();
        std::mem::forget(self);
        ptr
    }
}

impl<M: Managed> Drop for Owned<M> {
    fn drop(&mut self) {
        let ptr = self.ptr.as_ptr();
        if let Some(deleter) = self.managed().deleter() {
            // SAFETY: we own the tensor; its deleter is called exactly once, here.
            unsafe { deleter(ptr) };
        }
    }
}

macro_rules! managed_tensor {
    ($(#[$doc:meta])* $name:ident, $managed:ty, $capsule:literal) => {
        $(#[$doc])*
        pub struct $name {
            inner: Owned<$managed>,
        }

        // SAFETY: the tensor's owner is `Send` (required by `from_owner`), the shape/strides arrays are owned by
        // the same block, and the raw pointers are only addresses of memory the owner keeps alive.
        unsafe impl Send for $name {}

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let t = self.tensor();
                f.debug_struct(stringify!($name))
                    .field("device", &t.device)
                    .field("dtype", &t.dtype)
                    .field("shape", &self.shape())
                    .finish()
            }
        }

        impl $name {
            /// Exports a host buffer without copying; the tensor owns the buffer (it returns to its allocator,
            /// e.g. a pinned pool, when the consumer deletes the tensor). The device is `kDLCPU` for pinned
            /// memory too, which every consumer accepts.
            pub fn from_buffer(buffer: Buffer) -> Result<Self, BufferError> {
                let data = buffer.as_ptr().cast_mut().cast::<c_void>();
                let (dtype, shape) = (buffer.dtype(), buffer.shape().to_vec());
                // SAFETY: `data` is the buffer's row-major array of `shape` `dtype`s, and the buffer moves into
                // the tensor, which keeps it (and its heap block, which does not move) alive.
                unsafe { Self::from_owner(Box::new(buffer), data, DLDevice::CPU, dtype, &shape) }
            }

            /// Exports a shared host buffer without copying (e.g. one a Python object also holds, for repeated
            /// `__dlpack__` calls); the tensor holds one strong reference. The consumer may write through the
            /// tensor; as with the buffer protocol, the caller decides whether that is allowed.
            pub fn from_shared_buffer(buffer: Arc<Buffer>) -> Result<Self, BufferError> {
                let data = buffer.as_ptr().cast_mut().cast::<c_void>();
                let (dtype, shape) = (buffer.dtype(), buffer.shape().to_vec());
                // SAFETY: as in `from_buffer`, with a strong reference keeping the buffer alive.
                unsafe { Self::from_owner(Box::new(buffer), data, DLDevice::CPU, dtype, &shape) }
            }

            /// Exports a compact row-major array of `shape` elements of `dtype` at `data` on `device`, kept
            /// alive by `owner` until the deleter drops it (on any thread). For producers of other memory
            /// (device buffers). Fails only for a shape DLPack cannot express
            /// ([`BufferError::SizeOverflow`]).
            ///
            /// # Safety
            /// `data` must address such an array on `device`, valid until `owner` is dropped.
            pub unsafe fn from_owner(
                owner: Box<dyn Any + Send>,
                data: *mut c_void,
                device: DLDevice,
                dtype: DType,
                shape: &[usize],
            ) -> Result<Self, BufferError> {
                Ok($name { inner: export(owner, data, device, dtype, shape)? })
            }

            /// The exported array.
            pub fn tensor(&self) -> &DLTensor {
                self.inner.tensor()
            }

            /// Where the data lives (what `__dlpack_device__` returns).
            pub fn device(&self) -> DLDevice {
                self.tensor().device
            }

            /// The extents.
            pub fn shape(&self) -> &[i64] {
                self.inner.shape()
            }

            /// The strides in elements (empty if the producer left them null, meaning row-major).
            pub fn strides(&self) -> &[i64] {
                self.inner.strides()
            }

            #[doc = concat!("Gives up ownership (e.g. into a PyCapsule named `\"", $capsule, "\"`): the returned")]
            /// pointer's deleter must be called exactly once by its new owner.
            pub fn into_raw(self) -> *mut $managed {
                self.inner.into_raw()
            }

            /// Takes ownership of a managed tensor (ours or another producer's); dropping the result calls its
            /// deleter. Returns `None` for a null pointer.
            ///
            /// # Safety
            /// `ptr` must point at a valid managed tensor that nobody else will delete or use after this.
            pub unsafe fn from_raw(ptr: *mut $managed) -> Option<Self> {
                NonNull::new(ptr).map(|ptr| $name { inner: Owned { ptr } })
            }
        }
    };
}

managed_tensor!(
    /// An owned, exported `DLManagedTensor` (the legacy ABI of DLPack 0.x, which every consumer still takes):
    /// the memory stays alive until the deleter runs.
    DlpackTensor,
    DLManagedTensor,
    "dltensor"
);

managed_tensor!(
    /// An owned, exported `DLManagedTensorVersioned` (DLPack 1.1, flags 0: writable, not a copy): the memory
    /// stays alive until the deleter runs.
    DlpackTensorVersioned,
    DLManagedTensorVersioned,
    "dltensor_versioned"
);

impl DlpackTensorVersioned {
    /// The ABI version the tensor declares.
    pub fn version(&self) -> DLPackVersion {
        self.inner.managed().version
    }

    /// The `DLPACK_FLAG_BITMASK_*` bits.
    pub fn flags(&self) -> u64 {
        self.inner.managed().flags
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CachingPool, HeapBackend, Layout, PoolConfig, SharedAllocator, system_allocator};
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
        assert_eq!(size_of::<DLPackVersion>(), 8);
        assert_eq!(offset_of!(DLManagedTensorVersioned, version), 0);
        assert_eq!(offset_of!(DLManagedTensorVersioned, manager_ctx), 8);
        assert_eq!(offset_of!(DLManagedTensorVersioned, deleter), 16);
        assert_eq!(offset_of!(DLManagedTensorVersioned, flags), 24);
        assert_eq!(offset_of!(DLManagedTensorVersioned, dl_tensor), 32);
        assert_eq!(size_of::<DLManagedTensorVersioned>(), 80);
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
            let d = dl_dtype(dt);
            assert_eq!((d.code, d.bits, d.lanes), (code, bits, 1), "{dt}");
            assert_eq!(usize::from(d.bits) / 8, dt.size());
            // The rule the Python facade used before this module was shared: float, signed int, unsigned int.
            let rule = if dt.is_float() {
                2
            } else if dt.is_signed() {
                0
            } else {
                1
            };
            assert_eq!(d.code, rule, "{dt}");
        }
    }

    #[test]
    fn export_shares_memory_and_deleter_returns_it_to_its_pool() {
        let pool = Arc::new(CachingPool::new(HeapBackend, PoolConfig::default()));
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
    fn versioned_export_matches_the_legacy_one() {
        let pool = Arc::new(CachingPool::new(HeapBackend, PoolConfig::default()));
        let alloc: SharedAllocator = pool.clone();
        let data: Vec<f64> = (0..30).map(f64::from).collect();
        let buf = Arc::new(Buffer::from_slice(&data, &[2, 3, 5], Layout::Plain, &alloc).unwrap());
        let legacy = DlpackTensor::from_shared_buffer(buf.clone()).unwrap();
        let versioned = DlpackTensorVersioned::from_shared_buffer(buf.clone()).unwrap();
        assert_eq!(Arc::strong_count(&buf), 3);
        assert_eq!(versioned.version(), DLPackVersion { major: 1, minor: 1 });
        assert_eq!(versioned.flags(), 0, "writable, not a copy");
        assert_eq!(versioned.shape(), legacy.shape());
        assert_eq!(versioned.strides(), &[15, 5, 1]);
        assert_eq!(versioned.tensor().data, legacy.tensor().data);
        assert_eq!(versioned.tensor().dtype, dl_dtype(DType::F64));
        assert_eq!(versioned.device(), DLDevice::CPU);
        let raw = versioned.into_raw();
        // SAFETY: `raw` is ours and live.
        unsafe {
            assert_eq!((*raw).manager_ctx, raw.cast::<c_void>());
            assert_eq!((*raw).dl_tensor.ndim, 3);
        }
        // SAFETY: `raw` came from `into_raw`; dropping it calls the deleter once.
        drop(unsafe { DlpackTensorVersioned::from_raw(raw) });
        drop(legacy);
        assert_eq!(Arc::strong_count(&buf), 1, "each deleter dropped its reference");
        drop(buf);
        assert_eq!(pool.stats().blocks_in_use, 0);
    }

    #[test]
    fn deleters_run_on_other_threads() {
        let buf = Arc::new(Buffer::zeros(DType::U8, &[64], Layout::Plain, &system_allocator()).unwrap());
        let t = DlpackTensorVersioned::from_shared_buffer(buf.clone()).unwrap();
        let raw = t.into_raw() as usize;
        std::thread::spawn(move || {
            let raw = std::ptr::with_exposed_provenance_mut::<DLManagedTensorVersioned>(raw);
            // SAFETY: the only owner of `raw`, deleted once.
            unsafe { ((*raw).deleter.unwrap())(raw) };
        })
        .join()
        .unwrap();
        assert_eq!(Arc::strong_count(&buf), 1);
    }

    #[test]
    fn foreign_tensors_use_their_own_deleter() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static DELETED: AtomicUsize = AtomicUsize::new(0);
        unsafe extern "C" fn count(_: *mut DLManagedTensor) {
            DELETED.fetch_add(1, Ordering::SeqCst);
        }
        let mut shape = [4i64];
        let mut foreign = DLManagedTensor {
            dl_tensor: DLTensor {
                data: std::ptr::null_mut(),
                device: DLDevice::cuda(1),
                ndim: 1,
                dtype: dl_dtype(DType::U8),
                shape: shape.as_mut_ptr(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(count),
        };
        // SAFETY: `foreign` outlives the wrapper and is deleted (counted) once.
        let t = unsafe { DlpackTensor::from_raw(&mut foreign) }.unwrap();
        assert_eq!(t.shape(), &[4]);
        assert!(t.strides().is_empty(), "null strides mean row-major");
        assert_eq!(t.device(), DLDevice { device_type: DLDeviceType::CUDA, device_id: 1 });
        drop(t);
        assert_eq!(DELETED.load(Ordering::SeqCst), 1);
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
        // SAFETY: as above.
        assert!(unsafe { DlpackTensorVersioned::from_raw(std::ptr::null_mut()) }.is_none());
    }

    #[test]
    fn shapes_dlpack_cannot_express_are_errors() {
        let huge = [usize::MAX, 1];
        // SAFETY: the export fails before anything could read `data`.
        let err =
            unsafe { DlpackTensor::from_owner(Box::new(()), std::ptr::null_mut(), DLDevice::CPU, DType::U8, &huge) }
                .unwrap_err();
        assert_eq!(err, BufferError::SizeOverflow { shape: huge.to_vec() });
    }
}
