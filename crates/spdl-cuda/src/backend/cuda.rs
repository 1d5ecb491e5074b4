//! The real backend: the CUDA driver API through cudarc, with `libcuda` loaded at run time.
//!
//! Every driver call goes through [`guard`]: cudarc's dynamic loading panics when the library or one of its
//! symbols is missing (an old driver), and a data loader must turn that into an error, not a crash.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use cudarc::driver::sys::{self, CUevent_flags};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError as CuError, result};

use crate::error::{DriverError, Error, Result};
use crate::tracker::CopyEvent;

fn convert(e: CuError) -> DriverError {
    // `{:?}` of the enum is its symbolic name and needs no driver call; the description does.
    let name = format!("{:?}", e.0);
    let description = e.error_string().ok().and_then(|s| s.to_str().ok()).unwrap_or_default().to_owned();
    DriverError { code: e.0 as u32, name, description }
}

/// Runs one driver operation, turning its error into [`Error::Driver`] and a panic into [`Error::DriverPanicked`].
fn guard<T>(op: &'static str, device: i64, f: impl FnOnce() -> Result<T, CuError>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Error::Driver { op, device, source: convert(e) }),
        Err(payload) => Err(Error::DriverPanicked { op, cause: spdl_report::panic_message(payload.as_ref()) }),
    }
}

/// True if the driver library can be loaded (checked once per process).
pub(crate) fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // SAFETY: this only dlopen()s the driver library by its well-known names (running its initialisers,
        // which is what using CUDA at all requires); no symbol is called.
        catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
    })
}

/// Number of CUDA devices; `Ok(0)` when the driver is there but sees none.
pub(crate) fn device_count() -> Result<usize> {
    if !driver_present() {
        return Err(Error::DriverNotFound);
    }
    match guard("cuDeviceGetCount", -1, || {
        result::init()?;
        result::device::get_count()
    }) {
        Ok(n) => Ok(usize::try_from(n).unwrap_or(0)),
        Err(Error::Driver { source, .. }) if source.code == DriverError::NO_DEVICE => Ok(0),
        Err(e) => Err(e),
    }
}

/// A retained primary context on one device.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    ctx: Arc<CudaContext>,
    index: usize,
}

impl Context {
    pub(crate) fn open(index: usize) -> Result<Context> {
        let count = device_count()?;
        if count == 0 {
            return Err(Error::NoDevice);
        }
        if index >= count {
            return Err(Error::DeviceOutOfRange { index, count });
        }
        let ctx = guard("cuDevicePrimaryCtxRetain", index as i64, || CudaContext::new(index))?;
        Ok(Context { ctx, index })
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }

    fn dev(&self) -> i64 {
        self.index as i64
    }

    pub(crate) fn name(&self) -> Result<String> {
        guard("cuDeviceGetName", self.dev(), || self.ctx.name())
    }

    pub(crate) fn total_memory(&self) -> Result<usize> {
        guard("cuDeviceTotalMem", self.dev(), || self.ctx.total_mem())
    }

    pub(crate) fn compute_capability(&self) -> Result<(i32, i32)> {
        guard("cuDeviceGetAttribute", self.dev(), || self.ctx.compute_capability())
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        guard("cuCtxSynchronize", self.dev(), || self.ctx.synchronize())
    }

    /// Lets the device's default memory pool (behind `cuMemAllocAsync`) keep up to `bytes` of freed memory
    /// instead of unmapping it at every synchronisation, so steady-state batch allocations are cheap. Only
    /// raises the threshold; a no-op on devices without memory pools.
    pub(crate) fn retain_freed_memory(&self, bytes: u64) -> Result<()> {
        if !self.ctx.has_async_alloc() {
            return Ok(());
        }
        guard("cuMemPoolSetAttribute", self.dev(), || {
            self.ctx.bind_to_thread()?;
            let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
            // SAFETY: FFI calls on this context's device; the release threshold is a `cuuint64_t`, and both
            // pointers are to live local u64s.
            unsafe {
                let pool = result::device::get_default_mem_pool(self.ctx.cu_device())?;
                let mut current: u64 = 0;
                result::mem_pool::get_attribute(pool, attr, (&raw mut current).cast())?;
                if current < bytes {
                    let mut value = bytes;
                    result::mem_pool::set_attribute(pool, attr, (&raw mut value).cast())?;
                }
            }
            Ok(())
        })
    }

    pub(crate) fn new_stream(&self) -> Result<RawStream> {
        let s = guard("cuStreamCreate", self.dev(), || self.ctx.new_stream())?;
        Ok(RawStream { s, ctx: self.clone() })
    }

    /// Wraps a stream some other library owns (e.g. PyTorch's current stream, for DLPack).
    ///
    /// # Safety
    /// `handle` must be a valid `CUstream` of this context (or `1`/`2`, the legacy and per-thread default streams)
    /// that outlives every use of the returned value.
    pub(crate) unsafe fn borrow_stream(&self, handle: usize) -> RawStream {
        // SAFETY: forwarded to the caller.
        let s = unsafe { self.ctx.wrap_borrowed_stream(handle as sys::CUstream) };
        RawStream { s, ctx: self.clone() }
    }

    /// Page-locked host memory, usable by every context (`CU_MEMHOSTALLOC_PORTABLE`).
    pub(crate) fn alloc_host(&self, size: usize) -> Result<NonNull<u8>> {
        let ptr = guard("cuMemHostAlloc", self.dev(), || {
            self.ctx.bind_to_thread()?;
            // SAFETY: FFI call; the memory it returns is uninitialised, and we only hand it out as raw bytes.
            unsafe { result::malloc_host(size, sys::CU_MEMHOSTALLOC_PORTABLE) }
        })?;
        NonNull::new(ptr.cast::<u8>()).ok_or(Error::Driver {
            op: "cuMemHostAlloc",
            device: self.dev(),
            source: DriverError {
                code: 2,
                name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
                description: "the driver returned a null pointer".into(),
            },
        })
    }

    /// # Safety
    /// `ptr` came from [`Self::alloc_host`] on this context, is freed once, and no copy still reads it.
    pub(crate) unsafe fn free_host(&self, ptr: NonNull<u8>) -> Result<()> {
        guard("cuMemFreeHost", self.dev(), || {
            self.ctx.bind_to_thread()?;
            // SAFETY: forwarded to the caller.
            unsafe { result::free_host(ptr.as_ptr().cast()) }
        })
    }
}

/// A stream (owned, or borrowed from another library).
#[derive(Debug, Clone)]
pub(crate) struct RawStream {
    s: Arc<CudaStream>,
    ctx: Context,
}

impl RawStream {
    pub(crate) fn context(&self) -> &Context {
        &self.ctx
    }

    fn dev(&self) -> i64 {
        self.ctx.dev()
    }

    /// The `CUstream` handle, for interop (e.g. `torch.cuda.ExternalStream`).
    pub(crate) fn handle(&self) -> usize {
        self.s.cu_stream() as usize
    }

    pub(crate) fn same_as(&self, other: &RawStream) -> bool {
        self.handle() == other.handle() && self.ctx.index == other.ctx.index
    }

    /// Records an event the host can wait on without spinning (timing enabled).
    pub(crate) fn record(&self) -> Result<Event> {
        let e =
            guard("cuEventRecord", self.dev(), || self.s.record_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC)))?;
        Ok(Event { e, device: self.dev() })
    }

    /// Records an event only other streams wait on (no timing: the cheapest kind).
    pub(crate) fn record_for_streams(&self) -> Result<Event> {
        let e = guard("cuEventRecord", self.dev(), || self.s.record_event(None))?;
        Ok(Event { e, device: self.dev() })
    }

    /// Makes this stream wait (on the device, not the host) for `event`.
    pub(crate) fn wait(&self, event: &Event) -> Result<()> {
        guard("cuStreamWaitEvent", self.dev(), || self.s.wait(&event.e))
    }

    /// Blocks the host until all work queued so far is done, yielding the CPU instead of spinning.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.record()?.wait()
    }

    /// Device memory, stream-ordered on this stream where the device supports memory pools.
    pub(crate) fn alloc(&self, bytes: usize) -> Result<DeviceMem> {
        let async_alloc = self.ctx.ctx.has_async_alloc();
        let ptr = if bytes == 0 {
            0
        } else {
            guard("cuMemAlloc", self.dev(), || {
                self.ctx.ctx.bind_to_thread()?;
                // SAFETY: FFI calls on a live stream of a bound context; the memory is uninitialised device memory
                // that only copies write before anyone reads it.
                unsafe {
                    if async_alloc {
                        result::malloc_async(self.s.cu_stream(), bytes)
                    } else {
                        result::malloc_sync(bytes)
                    }
                }
            })?
        };
        Ok(DeviceMem { ptr, bytes, stream: self.clone(), async_alloc, users: Mutex::new(Vec::new()) })
    }

    /// Queues a host-to-device copy.
    ///
    /// # Safety
    /// `dst` points at `src.len()` bytes of device memory of this context that stays allocated until the copy
    /// completes, and `src` stays valid and unchanged until then (for pageable memory the driver reads it before
    /// returning, but callers keep it anyway).
    pub(crate) unsafe fn copy_htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        guard("cuMemcpyHtoDAsync", self.dev(), || {
            self.ctx.ctx.bind_to_thread()?;
            // SAFETY: forwarded to the caller.
            unsafe { result::memcpy_htod_async(dst, src, self.s.cu_stream()) }
        })
    }

    /// Copies device memory into `dst` and waits for it.
    ///
    /// # Safety
    /// `src` points at `dst.len()` readable bytes of device memory of this context.
    pub(crate) unsafe fn copy_dtoh_blocking(&self, dst: &mut [u8], src: u64) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        guard("cuMemcpyDtoHAsync", self.dev(), || {
            self.ctx.ctx.bind_to_thread()?;
            // SAFETY: forwarded to the caller; we wait below before `dst` can be touched again.
            unsafe { result::memcpy_dtoh_async(dst, src, self.s.cu_stream()) }
        })?;
        self.synchronize()
    }

    /// Queues `cuMemsetD8Async` (a kernel): the "compute" of the overlap tests.
    ///
    /// # Safety
    /// `dst` points at `bytes` writable bytes of device memory of this context.
    #[cfg(test)]
    pub(crate) unsafe fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        guard("cuMemsetD8Async", self.dev(), || {
            self.ctx.ctx.bind_to_thread()?;
            // SAFETY: forwarded to the caller.
            unsafe { result::memset_d8_async(dst, value, bytes, self.s.cu_stream()) }
        })
    }
}

/// A recorded event.
#[derive(Debug)]
pub(crate) struct Event {
    e: CudaEvent,
    device: i64,
}

impl CopyEvent for Event {
    fn query(&self) -> Result<bool> {
        // Bound first: the caller may be any thread (a pipeline worker), with no current context.
        guard("cuEventQuery", self.device, || {
            self.e.context().bind_to_thread()?;
            self.e.try_is_complete()
        })
    }

    fn wait(&self) -> Result<()> {
        guard("cuEventSynchronize", self.device, || self.e.synchronize())
    }

    fn elapsed_since(&self, start: &Self) -> Result<Duration> {
        let ms = guard("cuEventElapsedTime", self.device, || start.e.elapsed_ms(&self.e))?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }
}

/// Device memory owned by a [`crate::DeviceBuffer`]. Freed on drop, stream-ordered after every stream that
/// used it (recorded with [`Self::add_user`]), so a consumer's queued kernels never read freed memory.
#[derive(Debug)]
pub(crate) struct DeviceMem {
    ptr: u64,
    bytes: usize,
    stream: RawStream,
    async_alloc: bool,
    users: Mutex<Vec<RawStream>>,
}

impl DeviceMem {
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    pub(crate) fn stream(&self) -> &RawStream {
        &self.stream
    }

    /// Registers a stream that was made to wait for this memory's contents and may read it.
    pub(crate) fn add_user(&self, s: &RawStream) {
        if s.same_as(&self.stream) {
            return;
        }
        let mut users = self.users.lock().unwrap_or_else(PoisonError::into_inner);
        if !users.iter().any(|u| u.same_as(s)) {
            users.push(s.clone());
        }
    }

    pub(crate) fn users(&self) -> Vec<RawStream> {
        self.users.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn free(&mut self) -> Result<()> {
        let users = std::mem::take(self.users.get_mut().unwrap_or_else(PoisonError::into_inner));
        if self.async_alloc {
            // Free on the first consumer's stream after every other consumer: the copy stream is never made to
            // wait for compute, so the next batch's copy is not held up by this one's kernels.
            let free_on = users.first().unwrap_or(&self.stream);
            for u in users.iter().skip(1) {
                free_on.wait(&u.record_for_streams()?)?;
            }
            guard("cuMemFreeAsync", self.stream.dev(), || {
                self.stream.ctx.ctx.bind_to_thread()?;
                // SAFETY: allocated by cuMemAllocAsync, freed once, ordered after the copy (same stream or the
                // consumer waited for its event) and after every registered consumer.
                unsafe { result::free_async(self.ptr, free_on.s.cu_stream()) }
            })
        } else {
            self.stream.synchronize()?;
            for u in &users {
                u.synchronize()?;
            }
            guard("cuMemFree", self.stream.dev(), || {
                self.stream.ctx.ctx.bind_to_thread()?;
                // SAFETY: allocated by cuMemAlloc, freed once, after every stream that used it went idle.
                unsafe { result::free_sync(self.ptr) }
            })
        }
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        if self.ptr == 0 || self.bytes == 0 {
            return;
        }
        // A failed free has nowhere to be reported from a destructor: the memory is leaked (never freed twice or
        // early), and a context that broke will report its error on the next call that can return one.
        let _ = self.free();
    }
}
