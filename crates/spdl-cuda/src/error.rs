use std::fmt;

use spdl_buffer::{BufferError, DType};

/// A failed CUDA driver call: the `CUresult` code, its name and the driver's description.
///
/// This type exists with and without the `cuda` feature, so [`Error`] has the same shape in every build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverError {
    /// The numeric `CUresult` (e.g. 100 for `CUDA_ERROR_NO_DEVICE`).
    pub code: u32,
    /// The symbolic name (e.g. `"CUDA_ERROR_NO_DEVICE"`).
    pub name: String,
    /// The driver's description, when it could give one.
    pub description: String,
}

impl DriverError {
    /// `CUDA_ERROR_NO_DEVICE`.
    pub const NO_DEVICE: u32 = 100;
    /// `CUDA_ERROR_INVALID_DEVICE`.
    pub const INVALID_DEVICE: u32 = 101;
    /// `CUDA_ERROR_NOT_READY` (an event or stream query whose work is still running).
    pub const NOT_READY: u32 = 600;
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.description.is_empty() {
            write!(f, "{} ({})", self.name, self.code)
        } else {
            write!(f, "{} ({}): {}", self.name, self.code, self.description)
        }
    }
}

impl std::error::Error for DriverError {}

/// Everything that can go wrong in spdl-cuda. Each variant names the operation, device or item involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The crate was built without the `cuda` feature.
    #[error("spdl-cuda was built without the `cuda` feature; rebuild with `--features cuda` to use a GPU")]
    NotCompiled,

    /// The CUDA driver library (`libcuda.so` / `nvcuda.dll`) could not be loaded.
    #[error("the CUDA driver library (libcuda) was not found on this machine; is an NVIDIA driver installed?")]
    DriverNotFound,

    /// The driver library loaded but a call into it panicked (typically a symbol missing from an old driver).
    #[error("the CUDA driver failed during `{op}` (the driver may be too old for CUDA 12.8 APIs): {cause}")]
    DriverPanicked {
        /// The operation that was running.
        op: &'static str,
        /// The panic message.
        cause: String,
    },

    /// The driver loaded but reports no CUDA device.
    #[error("the CUDA driver reports no device")]
    NoDevice,

    /// A device index beyond the number of devices.
    #[error("CUDA device {index} does not exist: the driver reports {count} device(s)")]
    DeviceOutOfRange {
        /// The index that was asked for.
        index: usize,
        /// How many devices there are.
        count: usize,
    },

    /// A driver call returned an error.
    #[error("CUDA driver call `{op}` failed on device {device}")]
    Driver {
        /// The operation (e.g. `"cuMemcpyHtoDAsync"`).
        op: &'static str,
        /// The device ordinal (or `-1` where no device was involved yet).
        device: i64,
        /// The driver's error.
        #[source]
        source: DriverError,
    },

    /// Host memory for a transfer (a pinned staging block) could not be allocated.
    #[error("could not allocate {bytes} bytes of host memory for `{purpose}`")]
    HostAlloc {
        /// What the memory was for (e.g. `"pageable staging"`).
        purpose: &'static str,
        /// Requested size in bytes.
        bytes: usize,
        /// The allocator's error.
        #[source]
        source: BufferError,
    },

    /// A buffer dtype that DLPack export does not know.
    #[error("dtype {dtype} has no DLPack equivalent")]
    UnsupportedDType {
        /// The dtype.
        dtype: DType,
    },

    /// A shape that DLPack (64-bit signed extents, 32-bit rank) cannot express.
    #[error("shape {shape:?} cannot be exported through DLPack")]
    ShapeTooLarge {
        /// The shape.
        shape: Vec<usize>,
    },

    /// A stream and a buffer (or two streams) belong to different devices.
    #[error("{what}: device {left} and device {right} differ")]
    DeviceMismatch {
        /// What was being combined.
        what: &'static str,
        /// The first device.
        left: usize,
        /// The second device.
        right: usize,
    },
}

impl Error {
    /// True if the error means "no usable GPU here" (not compiled, no driver, no device) rather than a failure of
    /// a GPU that exists. Loaders use this to fall back to CPU quietly.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::NotCompiled | Error::DriverNotFound | Error::NoDevice | Error::DeviceOutOfRange { .. })
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
