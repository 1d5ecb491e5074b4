//! Device buffers, transfer statistics, and the [`Transfer`] helper a pipeline uses.

use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use spdl_buffer::{Buffer, DType, Layout, SharedAllocator, system_allocator};

use crate::backend;
use crate::device::{CudaDevice, PageablePolicy, Stream, StreamOptions};
use crate::dlpack::{DLDevice, DlpackTensor, export};
use crate::error::{Error, Result};
use crate::pinned::PinnedAllocator;
use crate::pool::{PoolConfig, PoolStats};
use crate::tracker::CopyEvent;

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
        export(Box::new(self), data, device, dtype, &shape)
    }
}

/// Counters of host-to-device copies (of one [`Stream`], or of a [`Transfer`] with its pool).
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
    /// The pinned pool's counters, when the stats come from a [`Transfer`].
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

/// Settings of a [`Transfer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferConfig {
    /// Device ordinal. Default 0.
    pub device: usize,
    /// The pinned pool's settings.
    pub pool: PoolConfig,
    /// Stage pageable buffers through the pinned pool ([`PageablePolicy::Staged`]) rather than handing them to
    /// the driver. Default: true.
    pub stage_pageable: bool,
    /// Time each copy with events (for [`TransferStats::h2d_gbps`]). Default: true.
    pub timing: bool,
    /// Freed device memory the device's default pool may keep for the next batches
    /// ([`CudaDevice::retain_freed_memory`]); 0 leaves the pool's setting alone. Default: 1 GiB.
    pub retain_device_bytes: u64,
}

impl Default for TransferConfig {
    fn default() -> Self {
        TransferConfig {
            device: 0,
            pool: PoolConfig::default(),
            stage_pageable: true,
            timing: true,
            retain_device_bytes: 1 << 30,
        }
    }
}

/// What a pipeline needs for its device stage: a device, a pinned pool for batch buffers, and a dedicated copy
/// stream with byte and time counters.
///
/// Decoders build each batch in [`Transfer::allocator`] (page-locked memory, recycled), the transfer stage
/// calls [`Transfer::transfer`], and [`Transfer::stats`] reports H2D GB/s and the pool's hit rate.
///
/// # Example
/// ```
/// use spdl_buffer::{Buffer, DType, Layout};
/// use spdl_cuda::{Transfer, TransferConfig};
///
/// // `None` on a machine without a GPU (or without the `cuda` feature): fall back to CPU.
/// if let Some(gpu) = Transfer::open_if_available(&TransferConfig::default())? {
///     let batch = Buffer::zeros(DType::U8, &[32, 224, 224, 3], Layout::Nhwc, &gpu.allocator())?;
///     let on_device = gpu.transfer(batch)?; // returns at once; the copy runs on the copy stream
///     on_device.synchronize()?;
///     println!("{:?} GB/s", gpu.stats().h2d_gbps());
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Transfer {
    device: CudaDevice,
    pinned: Arc<PinnedAllocator>,
    stream: Stream,
}

impl Transfer {
    /// Opens the device, creates its pinned pool and copy stream.
    pub fn new(config: &TransferConfig) -> Result<Transfer> {
        let device = CudaDevice::open(config.device)?;
        if config.retain_device_bytes > 0 {
            device.retain_freed_memory(config.retain_device_bytes)?;
        }
        let pinned = PinnedAllocator::new(&device, config.pool.clone());
        let pageable = if config.stage_pageable {
            PageablePolicy::Staged(pinned.clone() as SharedAllocator)
        } else {
            PageablePolicy::Driver
        };
        let stream = device.new_stream_with(StreamOptions { pageable, timing: config.timing })?;
        Ok(Transfer { device, pinned, stream })
    }

    /// Like [`Transfer::new`], but `Ok(None)` when no GPU can be used here (no `cuda` feature, no driver, no
    /// device) so callers can fall back to CPU; other failures are still errors.
    pub fn open_if_available(config: &TransferConfig) -> Result<Option<Transfer>> {
        match Transfer::new(config) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.is_unavailable() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The pinned pool as a [`spdl_buffer::HostAllocator`] handle: build batches here.
    pub fn allocator(&self) -> SharedAllocator {
        self.pinned.clone()
    }

    /// The pinned pool.
    pub fn pinned(&self) -> &Arc<PinnedAllocator> {
        &self.pinned
    }

    /// The copy stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The device.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// Queues the copy of `host` on the copy stream; see [`crate::transfer`].
    pub fn transfer(&self, host: Buffer) -> Result<DeviceBuffer> {
        self.stream.transfer(host)
    }

    /// Waits for every queued copy and releases its host memory.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize()
    }

    /// Copy counters with the pinned pool's stats.
    pub fn stats(&self) -> TransferStats {
        TransferStats { pool: Some(self.pinned.stats()), ..self.stream.stats() }
    }
}
