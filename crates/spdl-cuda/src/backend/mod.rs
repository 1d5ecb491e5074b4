//! The CUDA driver behind a small internal interface, with two implementations: `cuda` (cudarc, loaded at run
//! time) and `stub` (no CUDA compiled in: every type is uninhabited, so nothing that needs a GPU can be built).
//! The public types in the rest of the crate are written once against this interface.

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub(crate) use cuda::*;

#[cfg(not(feature = "cuda"))]
mod stub;
#[cfg(not(feature = "cuda"))]
pub(crate) use stub::*;
