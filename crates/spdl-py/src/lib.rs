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

mod arena;
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
mod pgrp;
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
///
/// One native submodule per Python package that uses it: `_native.pipeline` (the engine's Python face),
/// `_native.io` (decoders, media classes, encoders, host/device memory), `_native.source` (stores, samplers,
/// listings) and `_native.loader` (the loaders); what every package shares stays at the top (the buffer, the
/// build's features, the argument checks, the exit and fork hooks).
///
/// Declared as modules of items (not functions that add them), so that PyO3's introspection sees every class,
/// function and constant: `cargo xtask stubs` writes the `_native/*.pyi` stubs from the built module, and CI
/// checks that the committed stubs are current (`cargo xtask stubs --check`).
#[pymodule(gil_used = false)]
#[pyo3(name = "_native")]
mod native {
    use pyo3::prelude::*;

    #[pymodule_export]
    use crate::args::{_check_count, _check_duration, _check_pipeline_size, _check_size};
    #[pymodule_export]
    use crate::buffer::PyBuffer;
    #[pymodule_export]
    use crate::build_info::{_build_info, _ffmpeg_filters, _ffmpeg_log_level, _ffmpeg_status, _set_ffmpeg_log_level};
    #[pymodule_export]
    use crate::lifecycle::_wait_engine_threads;

    #[pymodule_export]
    const HAS_IO: bool = cfg!(feature = "io");
    #[pymodule_export]
    const HAS_VIDEO: bool = cfg!(feature = "ffmpeg");
    #[pymodule_export]
    const HAS_SOURCE: bool = cfg!(feature = "source");
    #[pymodule_export]
    const HAS_CUDA: bool = cfg!(feature = "cuda");

    /// `spdl_rs._native.pipeline`: what `spdl_rs.pipeline` builds and drives.
    #[pymodule(gil_used = false)]
    mod pipeline {
        #[pymodule_export]
        use crate::arena::{
            _arena_envelope, _arena_open_envelope, ArenaInterrupted, ArenaLease, PoolReader, PoolWriter, RingReader,
            RingWriter, SharedMemoryRingBuffer, SharedMemorySegmentPool,
        };
        #[pymodule_export]
        use crate::checkpoint::{CheckpointEpoch, CheckpointInput, CheckpointTracker, Keyed, KeyedAggregator, KeyedOp};
        #[pymodule_export]
        use crate::pgrp::_process_group_sample;
        #[pymodule_export]
        use crate::pipeline::observe::{
            _get_env_bool, _log_task_result, _queue_stats_line, _stage_figures, _task_stats_line, ProfileStats,
            QueueStats, StatsCounter, TaskStats, set_compact_log,
        };
        #[pymodule_export]
        use crate::pipeline::spec::{ThroughStep, check, check_aggregate, check_regions, check_source, op_kind};
        #[pymodule_export]
        use crate::pipeline::{
            AsyncBridge, CacheIterator, CoreOptions, PipelineCore, PriorityScheduler, PyNativeOp, RegionInputs, Reply,
            StatsSnapshot, cache_iterator,
        };

        /// The capacity of each queue between two stages unless the pipeline is built with another
        /// `stage_buffer_size` (declared once, here; the Python builder's default).
        #[pymodule_export]
        const DEFAULT_STAGE_BUFFER_SIZE: usize = crate::pipeline::DEFAULT_STAGE_BUFFER;
    }

    /// `spdl_rs._native.io`: what `spdl_rs.io` wraps.
    #[pymodule(gil_used = false)]
    mod io {
        #[cfg(feature = "cuda")]
        #[pymodule_export]
        use crate::cuda::CUDAUnavailableError;
        #[cfg(feature = "cuda")]
        #[pymodule_export]
        use crate::cuda::{
            CpuStorage, CudaBuffer, CudaConfig, cuda_cpu_storage, cuda_device_count, cuda_open, cuda_pinned_buffer,
            cuda_transfer_buffer, cuda_transfer_buffer_cpu,
        };
        #[cfg(feature = "io")]
        #[pymodule_export]
        use crate::io::array::{npy_header, npz_entries, npz_inflate, zip_directory};
        #[cfg(feature = "io")]
        #[pymodule_export]
        use crate::io::audio::{load_audio_batch, load_audio_batch_op, load_audio_op, probe};
        #[cfg(feature = "ffmpeg")]
        #[pymodule_export]
        use crate::io::clips::{
            clips_at_fps, clips_at_random_indices, clips_at_random_timestamps, clips_at_regular_indices,
            clips_at_regular_timestamps, load_clips, load_clips_batch, load_clips_batch_op, load_clips_op,
        };
        #[cfg(feature = "io")]
        #[pymodule_export]
        use crate::io::encode::{encode_image, encode_image_file, save_image};
        #[cfg(feature = "io")]
        #[pymodule_export]
        use crate::io::filter_desc::{
            get_abuffer_desc, get_audio_filter_desc, get_buffer_desc, get_filter_desc, get_video_filter_desc,
        };
        #[cfg(feature = "ffmpeg")]
        #[pymodule_export]
        use crate::io::media::{
            PyAudioCodec, PyAudioFrames, PyAudioPackets, PyFilterGraph, PyImageCodec, PyImageFrames, PyImagePackets,
            PyVideoCodec, PyVideoFrames, PyVideoPackets, split_packets_at_indices,
        };
        #[cfg(feature = "ffmpeg")]
        #[pymodule_export]
        use crate::io::media_api::{
            PyBsf, PyDecodeConfig, PyDemuxConfig, PyDemuxer, PyStreamingDemux, apply_bsf, decode_config, demux_audio,
            demux_config, demux_image, demux_video,
        };
        #[cfg(feature = "ffmpeg")]
        #[pymodule_export]
        use crate::io::media_decode::{
            Decoder, PyAudioDecoder, PyVideoDecoder, convert_frames, create_reference_audio_frame,
            create_reference_video_frame, decode_packets, sample_decode_video,
        };
        #[cfg(feature = "ffmpeg")]
        #[pymodule_export]
        use crate::io::mux::{
            PyAudioEncodeConfig, PyAudioEncoder, PyMuxer, PyVideoEncodeConfig, PyVideoEncoder, audio_encode_config,
            video_encode_config,
        };
        #[cfg(feature = "ffmpeg")]
        #[pymodule_export]
        use crate::io::spdl_form::load_video;
        #[cfg(feature = "io")]
        #[pymodule_export]
        use crate::io::spdl_form::{decode_image, load_audio, load_image, load_image_batch};
        #[cfg(feature = "io")]
        #[pymodule_export]
        use crate::io::tar::{TarStream, tar_index};
        #[cfg(feature = "io")]
        #[pymodule_export]
        use crate::io::utils::{
            PyTraceSession, built_with_cuda, built_with_nvcodec, built_with_nvjpeg, get_ffmpeg_filters,
            get_ffmpeg_log_level, get_ffmpeg_versions, set_ffmpeg_log_level, trace, trace_counter, trace_start,
        };
        #[cfg(feature = "ffmpeg")]
        #[pymodule_export]
        use crate::io::video::{decode_packets_op, demux_video_op, load_video_op};
        #[cfg(feature = "io")]
        #[pymodule_export]
        use crate::io::wav::{WavHeader, wav_header, wav_samples};
        #[cfg(feature = "io")]
        #[pymodule_export]
        use crate::io::{
            decode_image_op, decode_memory_budget, image_info, load_image_batch_op, set_decode_memory_budget,
        };
    }

    /// `spdl_rs._native.ray`: the Ray Data decoders `spdl_rs.ray` re-exports.
    #[pymodule(gil_used = false)]
    mod ray {
        #[cfg(feature = "ffmpeg")]
        #[pymodule_export]
        use crate::io::ray::VideoClipDecoder;
        #[cfg(feature = "io")]
        #[pymodule_export]
        use crate::io::ray::{ImageBatchDecoder, RayDataSource, RayEpoch, import_ray};
    }

    /// `spdl_rs._native.source`: what `spdl_rs.source` wraps.
    #[pymodule(gil_used = false)]
    mod source {
        #[cfg(feature = "source")]
        #[pymodule_export]
        use crate::elastic::{PyElasticSampler, merge_rank_states};
        #[cfg(feature = "source")]
        #[pymodule_export]
        use crate::source::{
            _deterministic_sampler, _random_sampler, PyDistributedDeterministicSampler, PyDistributedRandomSampler,
            PySampler, PyStore, list_dataset,
        };
    }

    /// `spdl_rs._native.loader`: what `spdl_rs.loader` wraps.
    #[pymodule(gil_used = false)]
    mod loader {
        #[cfg(all(feature = "loader", feature = "ffmpeg"))]
        #[pymodule_export]
        use crate::loader::ClipLoader;
        #[cfg(feature = "loader")]
        #[pymodule_export]
        use crate::loader::{ImageLoader, run_demo};
    }

    /// What the module does when it is imported, besides adding its items: the interpreter-exit and fork
    /// hooks, `ARG_LIMITS` (a dict, which a declared constant cannot be), and each submodule under its full
    /// name in `sys.modules` (`spdl_rs._native.io`), so that it imports, pickles and type-checks as a module.
    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        crate::lifecycle::install_hooks(m)?;
        // Engine threads release a GIL a Python stage kept across items before they wait.
        spdl_exec::set_before_block_hook(crate::pipeline::tstate::release_held);
        crate::args::add_limits(m)?;
        let modules = m.py().import("sys")?.getattr("modules")?;
        let parent = m.name()?;
        for sub in ["pipeline", "io", "ray", "source", "loader"] {
            let module = m.getattr(sub)?;
            let full = format!("{parent}.{sub}");
            module.setattr("__name__", &full)?;
            if sub == "source" && cfg!(feature = "source") {
                // What the samplers' `__reduce__` names: pickle finds them under the module's full name.
                for f in ["_deterministic_sampler", "_random_sampler"] {
                    module.getattr(f)?.setattr("__module__", &full)?;
                }
            }
            modules.set_item(full, module)?;
        }
        Ok(())
    }
}
