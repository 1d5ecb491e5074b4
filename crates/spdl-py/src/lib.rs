//! # spdl-py: the Python package `spdl_rs`
//!
//! A PyO3 module (built with maturin, see `pyproject.toml`) that puts the spdl-rs engine and decoders
//! behind the Python API of Meta's SPDL, so that an SPDL user switches with an import change:
//!
//! - `spdl_rs.pipeline.PipelineBuilder` / `Pipeline` drive an [`spdl_exec::Pipeline`] over [`Value`]s.
//!   Sync Python ops run on the engine's Rust thread pool and take the GIL only while Python code runs;
//!   async ops run on an asyncio loop the pipeline owns, reached through a socket so that the scheduler
//!   never takes the GIL; native ops ([`NativeOp`], e.g. `spdl_rs.io.ops.decode_image`) never take it.
//! - `spdl_rs.Buffer` ([`PyBuffer`]) shows a Rust [`spdl_buffer::Buffer`] to numpy (array interface,
//!   buffer protocol) and to any DLPack consumer, in place.
//! - `spdl_rs.io` (feature `io`) wraps spdl-io's image and audio decoders and `probe`, and (feature
//!   `ffmpeg`, the system's FFmpeg libraries) its video demuxer and decoder, each releasing the GIL.
//! - `spdl_rs.source` (feature `source`) wraps spdl-source's samplers and dataset listings.
//! - `spdl_rs.io`'s host/device memory (feature `cuda`) wraps spdl-cuda's pinned pool and copy stream
//!   (`cpu_storage`, `transfer_buffer`, `CUDABuffer`, ...); CUDA is loaded at run time.
//!
//! The module is declared free-threading safe (`gil_used = false`): no Rust code relies on the GIL for its
//! own safety (shared state is in atomics, channels and `Mutex`es that hold no Python object while Python
//! runs).
//!
//! The type to start from, on the Rust side, is [`Value`] (what travels between stages); a new native op
//! implements [`NativeOp`]:
//!
//! ```
//! use spdl_py::{Error, NativeOp, Value};
//!
//! /// Doubles integers, without the GIL.
//! #[derive(Debug)]
//! struct Double;
//!
//! impl NativeOp for Double {
//!     fn name(&self) -> &str { "double" }
//!     fn expects(&self) -> &'static str { "an int" }
//!     fn call(&self, stage: &str, input: Value) -> Result<Vec<Value>, Error> {
//!         match input {
//!             Value::Int(i) => Ok(vec![Value::Int(i * 2)]),
//!             other => Err(Error::wrong_input(stage, "double", other.describe(), "an int")),
//!         }
//!     }
//! }
//!
//! let out = Double.call("double", Value::Int(21))?;
//! assert!(matches!(out.as_slice(), [Value::Int(42)]));
//! assert!(Double.call("double", Value::Str("x".into())).is_err());
//! # Ok::<(), Error>(())
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod args;
mod buffer;
mod build_info;
mod checkpoint;
#[cfg(feature = "cuda")]
mod cuda;
mod dlpack;
#[cfg(feature = "source")]
mod elastic;
mod error;
#[cfg(feature = "io")]
mod io;
mod lifecycle;
#[cfg(feature = "loader")]
mod loader;
mod pipeline;
#[cfg(any(feature = "io", feature = "source"))]
mod signals;
#[cfg(feature = "source")]
mod source;
mod value;

pub use buffer::PyBuffer;
pub use error::Error;
pub use pipeline::{AsyncBridge, NativeOp, PipelineCore, PyNativeOp, RegionInputs, Reply};
pub use value::Value;

use pyo3::prelude::*;

/// The native part of the `spdl_rs` package (`spdl_rs._native`); the Python package re-exports it.
#[pymodule(gil_used = false)]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<buffer::PyBuffer>()?;
    m.add_class::<pipeline::PipelineCore>()?;
    m.add_class::<pipeline::AsyncBridge>()?;
    m.add_class::<pipeline::Reply>()?;
    m.add_class::<pipeline::RegionInputs>()?;
    m.add_class::<pipeline::CoreOptions>()?;
    pipeline::register_specs(m)?;
    m.add_class::<pipeline::PyNativeOp>()?;
    m.add_class::<checkpoint::CheckpointTracker>()?;
    m.add_class::<checkpoint::CheckpointEpoch>()?;
    lifecycle::register(m)?;
    build_info::register(m)?;
    args::register(m)?;
    #[cfg(feature = "io")]
    io::register(m)?;
    m.add("HAS_IO", cfg!(feature = "io"))?;
    m.add("HAS_VIDEO", cfg!(feature = "ffmpeg"))?;
    #[cfg(feature = "source")]
    source::register(m)?;
    #[cfg(feature = "source")]
    m.add_class::<elastic::PyElasticSampler>()?;
    m.add("HAS_SOURCE", cfg!(feature = "source"))?;
    #[cfg(feature = "loader")]
    loader::register(m)?;
    #[cfg(feature = "cuda")]
    cuda::register(m)?;
    m.add("HAS_CUDA", cfg!(feature = "cuda"))?;
    Ok(())
}
