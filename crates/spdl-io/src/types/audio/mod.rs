//! The plain data of audio decoding (feature `audio`), shared by the audio API and the decoders behind it
//! (the WAV path, symphonia, the FFmpeg backend): options and limits, the planar `f32` scratch a decoder
//! fills for a window ([`Decoded`], [`WindowCollector`]) and its rendering into the output layout.

mod decoded;
mod options;
pub(crate) mod render;

pub use options::{AudioBackend, AudioLayout, AudioLimits, AudioOptions, ChannelSelect, SampleType};

#[cfg_attr(not(feature = "ffmpeg-linked"), allow(unused_imports))]
pub(crate) use decoded::{Decoded, WindowCollector, check_channels, check_rate};
