//! The [`Transfer`] helper a pipeline uses: a device, its pinned pool and a dedicated copy stream.

use std::sync::Arc;

use spdl_buffer::{Buffer, PoolConfig, SharedAllocator};

use crate::device::{CudaDevice, DeviceBuffer, PageablePolicy, Stream, StreamOptions, TransferStats};
use crate::error::Result;
use crate::pinned::PinnedAllocator;

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

    /// Queues the copy of a shared buffer on the copy stream; see [`Stream::transfer_shared`].
    pub fn transfer_shared(&self, host: Arc<Buffer>) -> Result<DeviceBuffer> {
        self.stream.transfer_shared(host)
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
