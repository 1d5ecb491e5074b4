//! Media decoding for spdl-rs: images, audio and video decoded straight into [`spdl_buffer::Buffer`]s.
//!
//! (Being built: images by issue 3, audio/video by issue 4.)
#![deny(missing_docs)]

mod error;

#[cfg(feature = "audio")]
pub mod audio;
#[cfg(feature = "image")]
pub mod image;
#[cfg(feature = "synth")]
pub mod synth;
#[cfg(feature = "ffmpeg")]
pub mod video;

pub use error::{BoxError, Error, Result};

#[cfg(feature = "audio")]
pub use audio::{MediaInfo, MediaInput, StreamInfo, StreamKind, TimeWindow, probe};
