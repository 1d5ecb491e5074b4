//! Devices, streams, and the device buffers a stream's copies make (with their DLPack export).

use std::ffi::c_void;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use spdl_buffer::dlpack::{DLDevice, DlpackTensor};
use spdl_buffer::{Buffer, DType, Layout, PoolStats, SharedAllocator, system_allocator};

use crate::backend;
use crate::error::{Error, Result};
use crate::tracker::{CopyEvent, CopyTracker, HostHold, Pending, StagingBlock};

/// True if this build has CUDA support compiled in (the `cuda` feature).
pub const fn compiled_with_cuda() -> bool {
    cfg!(feature = "cuda")
}

/// True if a CUDA GPU can be used: the crate has the `cuda` feature, the driver library loads, and it reports at
/// least one device. Never panics; checked once per process.
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| matches!(backend::device_count(), Ok(n) if n > 0))
}

/// Number of CUDA devices. Errors: [`Error::NotCompiled`] without the `cuda` feature, [`Error::DriverNotFound`]
/// without a driver; `Ok(0)` when the driver sees no device.
pub fn device_count() -> Result<usize> {
    backend::device_count()
}

/// One CUDA device (its primary context). Cheap to clone.
///
/// # Example
/// ```
/// use spdl_cuda::{CudaDevice, Error};
///
/// match CudaDevice::open(0) {
///     Ok(dev) => println!("GPU 0: {}", dev.name()?),
///     // No GPU here (or a build without the `cuda` feature): a typed error, never a panic.
///     Err(e) if e.is_unavailable() => println!("no GPU: {e}"),
///     Err(e) => return Err(e),
/// }
/// # Ok::<(), Error>(())
/// ```
#[derive(Clone)]
pub struct CudaDevice {
    pub(crate) ctx: backend::Context,
}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice").field("index", &self.ctx.index()).finish()
    }
}

impl CudaDevice {
    /// Opens device `index`. Errors, all typed and none a panic: [`Error::NotCompiled`] (no `cuda` feature),
    /// [`Error::DriverNotFound`] (no libcuda), [`Error::DriverPanicked`] (a driver too old for the API),
    /// [`Error::NoDevice`], [`Error::DeviceOutOfRange`], or [`Error::Driver`].
    pub fn open(index: usize) -> Result<CudaDevice> {
        Ok(CudaDevice { ctx: backend::Context::open(index)? })
    }

    /// The device ordinal.
    pub fn index(&self) -> usize {
        self.ctx.index()
    }

    /// The device's marketing name (e.g. `"NVIDIA H100 80GB HBM3"`).
    pub fn name(&self) -> Result<String> {
        self.ctx.name()
    }

    /// Total device memory in bytes.
    pub fn total_memory(&self) -> Result<usize> {
        self.ctx.total_memory()
    }

    /// Compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        self.ctx.compute_capability()
    }

    /// Waits for all work on the device.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.synchronize()
    }

    /// Lets the device's default memory pool (which [`Stream::transfer`] allocates device buffers from, with
    /// `cuMemAllocAsync`) keep up to `bytes` of freed memory for reuse instead of returning it to the driver at
    /// every synchronisation. Only ever raises the threshold; a no-op on devices without memory pools. The pool
    /// is the device's default one, shared with other users of `cudaMallocAsync` in the process.
    pub fn retain_freed_memory(&self, bytes: u64) -> Result<()> {
        self.ctx.retain_freed_memory(bytes)
    }

    /// A new non-blocking stream with default [`StreamOptions`]: a dedicated copy stream, so copies overlap the
    /// compute running on other streams.
    pub fn new_stream(&self) -> Result<Stream> {
        self.new_stream_with(StreamOptions::default())
    }

    /// A new non-blocking stream.
    #[cfg_attr(not(feature = "cuda"), allow(unreachable_code, unused_variables))] // uninhabited stub types
    pub fn new_stream_with(&self, options: StreamOptions) -> Result<Stream> {
        let raw = self.ctx.new_stream()?;
        Ok(Stream {
            inner: Arc::new(StreamInner {
                tracker: CopyTracker::default(),
                issued: Mutex::new(Issued::default()),
                raw,
                device: self.clone(),
                options,
            }),
        })
    }
}

/// How [`Stream::transfer`] copies a buffer whose memory is not page-locked.
#[derive(Clone, Default)]
pub enum PageablePolicy {
    /// Hand the pageable memory to the driver (`cuMemcpyHtoDAsync`), which stages it through its own pinned
    /// buffers and returns once it has read the source. Correct, about half the bandwidth of pinned memory.
    #[default]
    Driver,
    /// Copy into a block from this allocator (normally a [`crate::PinnedAllocator`]) first, then DMA
    /// asynchronously from there; the caller's buffer is freed right after the memcpy.
    Staged(SharedAllocator),
}

impl fmt::Debug for PageablePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PageablePolicy::Driver => f.write_str("Driver"),
            PageablePolicy::Staged(a) => f.debug_tuple("Staged").field(&a.name()).finish(),
        }
    }
}

/// Settings of a [`Stream`].
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// What to do with pageable host buffers.
    pub pageable: PageablePolicy,
    /// Record a timing event before each copy, so [`TransferStats::h2d_gbps`] reports the copy engine's
    /// bandwidth. Costs one event per copy. Default: on.
    pub timing: bool,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions { pageable: PageablePolicy::Driver, timing: true }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Issued {
    copies: u64,
    bytes: u64,
    pinned: u64,
    staged: u64,
    pageable: u64,
    enqueue_time: Duration,
}

/// A CUDA stream that host-to-device copies are queued on. Cheap to clone (clones share the stream).
///
/// Each [`Stream::transfer`] queues an asynchronous copy and returns at once; the host buffer is kept alive
/// until the copy's event completes and then released (to the pinned pool, if it came from one) at the next
/// transfer or [`Stream::synchronize`]. Dropping the last clone waits for the queued copies.
#[derive(Clone)]
pub struct Stream {
    inner: Arc<StreamInner>,
}

// Field order is drop order: wait for the copies (tracker) before releasing the stream.
struct StreamInner {
    tracker: CopyTracker<backend::Event>,
    issued: Mutex<Issued>,
    raw: backend::RawStream,
    device: CudaDevice,
    options: StreamOptions,
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("device", &self.inner.device.index())
            .field("options", &self.inner.options)
            .finish()
    }
}

impl Stream {
    /// The device the stream belongs to.
    pub fn device(&self) -> &CudaDevice {
        &self.inner.device
    }

    /// The settings.
    pub fn options(&self) -> &StreamOptions {
        &self.inner.options
    }

    /// The raw `CUstream` handle, for other libraries (e.g. `torch.cuda.ExternalStream(handle)`).
    pub fn handle(&self) -> usize {
        self.inner.raw.handle()
    }

    #[cfg(all(test, feature = "cuda"))]
    pub(crate) fn raw(&self) -> &backend::RawStream {
        &self.inner.raw
    }

    /// Queues an asynchronous copy of `host` to new device memory and returns at once; see [`transfer`].
    pub fn transfer(&self, host: Buffer) -> Result<DeviceBuffer> {
        self.transfer_source(HostSource::Owned(host))
    }

    /// Like [`Stream::transfer`], for a buffer the caller keeps sharing (Python objects hold their buffers
    /// through an [`Arc`]): one reference is held until the copy completes, so a pinned buffer is DMA'd in place
    /// with no host copy. The caller must not write the buffer until the copy is done (wait with
    /// [`DeviceBuffer::synchronize`]).
    pub fn transfer_shared(&self, host: Arc<Buffer>) -> Result<DeviceBuffer> {
        self.transfer_source(HostSource::Shared(host))
    }

    #[cfg_attr(not(feature = "cuda"), allow(unreachable_code, unused_variables))] // uninhabited stub types
    fn transfer_source(&self, host: HostSource) -> Result<DeviceBuffer> {
        let t0 = Instant::now();
        let inner = &*self.inner;
        // Give back the host memory of copies that finished since the last call (never blocks).
        inner.tracker.reap()?;
        let raw = &inner.raw;
        let src = host.buffer();
        let nbytes = src.nbytes();
        let (dtype, shape, layout, pinned) = (src.dtype(), src.shape().to_vec(), src.layout(), src.is_pinned());
        let mem = raw.alloc(nbytes)?;
        let start = if inner.options.timing && nbytes > 0 { Some(raw.record()?) } else { None };

        let mut kind = Kind::Empty;
        let hold = if nbytes == 0 {
            host.into_hold()
        } else if pinned {
            // SAFETY: `mem` holds `nbytes` bytes and is freed stream-ordered after this copy; `host` is parked
            // in the tracker below until the copy's event completes.
            unsafe { raw.copy_htod(mem.ptr(), host.buffer().as_bytes())? };
            kind = Kind::Pinned;
            host.into_hold()
        } else {
            match &inner.options.pageable {
                PageablePolicy::Staged(alloc) => {
                    let staging = StagingBlock::copy_of(host.buffer().as_bytes(), alloc)?;
                    drop(host); // copied: the caller's pageable buffer can go now
                    // SAFETY: as above, with the staging block parked instead of `host`.
                    unsafe { raw.copy_htod(mem.ptr(), staging.as_bytes())? };
                    kind = Kind::Staged;
                    HostHold::Staging(staging)
                }
                PageablePolicy::Driver => {
                    // SAFETY: as above; the driver reads pageable memory before returning, and we keep it anyway
                    // (on systems where the GPU reads pageable memory directly, that matters).
                    unsafe { raw.copy_htod(mem.ptr(), host.buffer().as_bytes())? };
                    kind = Kind::Pageable;
                    host.into_hold()
                }
            }
        };

        let done = match raw.record() {
            Ok(e) => Arc::new(e),
            Err(e) => {
                // The copy is queued but cannot be tracked: wait for the device, or, if even that fails, leak
                // the host memory rather than free what the copy may still read.
                if raw.context().synchronize().is_err() {
                    std::mem::forget(hold);
                }
                return Err(e);
            }
        };
        inner.tracker.push(Pending { start, done: done.clone(), bytes: nbytes as u64, hold });
        {
            let mut s = inner.issued.lock().unwrap_or_else(PoisonError::into_inner);
            s.copies += 1;
            s.bytes += nbytes as u64;
            match kind {
                Kind::Pinned => s.pinned += 1,
                Kind::Staged => s.staged += 1,
                Kind::Pageable => s.pageable += 1,
                Kind::Empty => {}
            }
            s.enqueue_time += t0.elapsed();
        }
        Ok(DeviceBuffer::new(mem, done, dtype, shape, layout, nbytes, inner.device.clone()))
    }

    /// Makes this stream wait (on the device; the host does not block) until `buffer`'s copy is done, and
    /// records this stream as a user of the buffer so its memory is freed only after this stream's work queued
    /// so far. Call it on the compute stream before launching work that reads the buffer.
    pub fn wait_for(&self, buffer: &DeviceBuffer) -> Result<()> {
        let (left, right) = (self.device().index(), buffer.device_index());
        if left != right {
            return Err(Error::DeviceMismatch { what: "stream waiting for a device buffer", left, right });
        }
        self.inner.raw.wait(buffer.ready_event())?;
        buffer.mem().add_user(&self.inner.raw);
        Ok(())
    }

    /// Blocks (without spinning) until every copy queued on this stream is done, then releases their host
    /// memory.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.raw.synchronize()?;
        self.inner.tracker.drain()
    }

    /// Releases the host memory of the copies that have completed (without blocking); returns how many.
    pub fn release_completed(&self) -> Result<usize> {
        self.inner.tracker.reap()
    }

    /// Counters of the copies queued on this stream (no pool stats; see [`crate::Transfer::stats`]).
    pub fn stats(&self) -> TransferStats {
        let issued = *self.inner.issued.lock().unwrap_or_else(PoisonError::into_inner);
        let done = self.inner.tracker.completed();
        let (in_flight, in_flight_bytes) = self.inner.tracker.in_flight();
        TransferStats {
            copies: issued.copies,
            bytes: issued.bytes,
            pinned_copies: issued.pinned,
            staged_copies: issued.staged,
            pageable_copies: issued.pageable,
            completed_copies: done.copies,
            completed_bytes: done.bytes,
            in_flight,
            in_flight_bytes,
            device_time: done.device_time,
            timed_bytes: done.timed_bytes,
            enqueue_time: issued.enqueue_time,
            leaked_host_blocks: done.leaked,
            pool: None,
        }
    }
}

/// The host side of a copy: a buffer the stream takes, or a shared one it holds a reference to.
enum HostSource {
    Owned(Buffer),
    Shared(Arc<Buffer>),
}

impl HostSource {
    fn buffer(&self) -> &Buffer {
        match self {
            HostSource::Owned(b) => b,
            HostSource::Shared(b) => b,
        }
    }

    fn into_hold(self) -> HostHold {
        match self {
            HostSource::Owned(b) => HostHold::Source(b),
            HostSource::Shared(b) => HostHold::Shared(b),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Empty,
    Pinned,
    Staged,
    Pageable,
}

/// An array in device memory, made by [`crate::transfer`]: dtype, shape and layout of its host source, and
/// the event that marks its copy done. Freed when dropped, after the work of every stream that used it
/// (see [`Stream::wait_for`]).
pub struct DeviceBuffer {
    mem: backend::DeviceMem,
    ready: Arc<backend::Event>,
    dtype: DType,
    shape: Vec<usize>,
    layout: Layout,
    nbytes: usize,
    device: CudaDevice,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.device.index())
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("layout", &self.layout)
            .field("nbytes", &self.nbytes)
            .finish()
    }
}

impl DeviceBuffer {
    pub(crate) fn new(
        mem: backend::DeviceMem,
        ready: Arc<backend::Event>,
        dtype: DType,
        shape: Vec<usize>,
        layout: Layout,
        nbytes: usize,
        device: CudaDevice,
    ) -> DeviceBuffer {
        DeviceBuffer { mem, ready, dtype, shape, layout, nbytes, device }
    }

    pub(crate) fn mem(&self) -> &backend::DeviceMem {
        &self.mem
    }

    pub(crate) fn ready_event(&self) -> &backend::Event {
        &self.ready
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Extent of each axis.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// What the axes mean.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Size in bytes.
    pub fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.nbytes / self.dtype.size()
    }

    /// True if the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.nbytes == 0
    }

    /// The device ordinal.
    pub fn device_index(&self) -> usize {
        self.device.index()
    }

    /// The device address (`CUdeviceptr`); 0 for an empty buffer. Reading it from a stream is valid only after
    /// that stream has waited for the copy ([`Stream::wait_for`]).
    pub fn device_ptr(&self) -> u64 {
        self.mem.ptr()
    }

    /// True once the copy has completed (never blocks).
    pub fn is_ready(&self) -> Result<bool> {
        self.ready.query()
    }

    /// Blocks (without spinning) until the copy has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.ready.wait()
    }

    /// Copies the data back into a new host buffer (system memory) and waits for it: for checks and debugging,
    /// not the hot path (it runs on the copy stream, after every stream that used the buffer).
    pub fn to_host(&self) -> Result<Buffer> {
        let mut out = Buffer::zeros(self.dtype, &self.shape, self.layout, &system_allocator())
            .map_err(|source| Error::HostAlloc { purpose: "device-to-host copy", bytes: self.nbytes, source })?;
        let s = self.mem.stream();
        for user in self.mem.users() {
            s.wait(&user.record()?)?;
        }
        // SAFETY: the memory holds `nbytes` bytes and lives as long as `self`; stream order puts this copy after
        // the host-to-device copy (same stream) and after the users' work (waited above).
        unsafe { s.copy_dtoh_blocking(out.as_bytes_mut(), self.mem.ptr())? };
        Ok(out)
    }

    /// Exports the buffer through DLPack (`kDLCUDA`, this device) without a copy; the tensor owns the buffer.
    ///
    /// With `Some(consumer)`, the consumer's stream is made to wait for the copy (no host block) and is recorded
    /// as a user; with `None`, this blocks until the copy is done, so any stream may read it.
    pub fn into_dlpack(self, consumer: Option<&Stream>) -> Result<DlpackTensor> {
        match consumer {
            Some(s) => s.wait_for(&self)?,
            None => self.synchronize()?,
        }
        self.export()
    }

    /// Like [`Self::into_dlpack`], for a consumer stream given as a raw `CUstream` handle, as Python's
    /// `__dlpack__(stream=...)` passes it (`1` is the legacy default stream, `2` the per-thread default stream).
    ///
    /// # Safety
    /// `handle` must be a valid stream of this buffer's device that outlives the exported tensor (streams of
    /// PyTorch's pool and the default streams do).
    #[cfg_attr(not(feature = "cuda"), allow(unreachable_code, unused_variables))] // uninhabited stub types
    pub unsafe fn into_dlpack_for_stream_handle(self, handle: usize) -> Result<DlpackTensor> {
        // SAFETY: forwarded to the caller.
        let consumer = unsafe { self.device.ctx.borrow_stream(handle) };
        consumer.wait(&self.ready)?;
        self.mem.add_user(&consumer);
        self.export()
    }

    fn export(self) -> Result<DlpackTensor> {
        let data = self.mem.ptr() as usize as *mut c_void;
        let device = DLDevice::cuda(self.device.index());
        let (dtype, shape) = (self.dtype, self.shape.clone());
        // SAFETY: `data` is the device address of this buffer: a compact row-major array of `shape` `dtype`s on
        // `device`, freed only when the buffer (which the tensor owns from here on) is dropped.
        unsafe { DlpackTensor::from_owner(Box::new(self), data, device, dtype, &shape) }
            .map_err(|_| Error::ShapeTooLarge { shape })
    }
}

/// Counters of host-to-device copies (of one [`Stream`], or of a [`crate::Transfer`] with its pool).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TransferStats {
    /// Copies queued.
    pub copies: u64,
    /// Bytes queued.
    pub bytes: u64,
    /// Copies DMA'd straight from pinned memory.
    pub pinned_copies: u64,
    /// Pageable copies staged through a pinned block.
    pub staged_copies: u64,
    /// Pageable copies handed to the driver.
    pub pageable_copies: u64,
    /// Copies seen complete (their host memory released).
    pub completed_copies: u64,
    /// Bytes of the completed copies.
    pub completed_bytes: u64,
    /// Copies queued and not yet seen complete.
    pub in_flight: usize,
    /// Bytes of those.
    pub in_flight_bytes: u64,
    /// Copy-engine time of the completed, timed copies (from events around each copy).
    pub device_time: Duration,
    /// Bytes of the completed, timed copies.
    pub timed_bytes: u64,
    /// Host time spent inside `transfer` calls (allocation, staging memcpy, driver calls).
    pub enqueue_time: Duration,
    /// Host blocks never released because their copy could not be confirmed complete (a failed device).
    pub leaked_host_blocks: u64,
    /// The pinned pool's counters, when the stats come from a [`crate::Transfer`].
    pub pool: Option<PoolStats>,
}

impl TransferStats {
    /// Host-to-device bandwidth of the completed timed copies in GB/s (10⁹ bytes per second of copy-engine
    /// time); `None` before any timed copy completed.
    pub fn h2d_gbps(&self) -> Option<f64> {
        let secs = self.device_time.as_secs_f64();
        (secs > 0.0).then(|| self.timed_bytes as f64 / secs / 1e9)
    }
}

/// Queues an asynchronous host-to-device copy of `host` on `stream` and returns at once.
///
/// The returned [`DeviceBuffer`] keeps the dtype, shape and layout, and carries the copy's completion event:
/// make a compute stream wait for it with [`Stream::wait_for`] (no host block), or block with
/// [`DeviceBuffer::synchronize`]. `host` is taken by value and kept alive until the copy completes, then
/// released, so a pinned batch buffer returns to its pool as soon as the DMA is done, while the device buffer
/// lives on. Pinned buffers (e.g. from [`crate::PinnedAllocator`]) are DMA'd directly; pageable ones follow the
/// stream's [`PageablePolicy`] (slower, never wrong).
///
/// Queue the next batch's transfer before running the model on the current one, and the copy overlaps the
/// compute.
pub fn transfer(host: Buffer, stream: &Stream) -> Result<DeviceBuffer> {
    stream.transfer(host)
}
