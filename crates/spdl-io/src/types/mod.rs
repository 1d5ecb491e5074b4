//! The plain data that the media API and the FFmpeg backend share: options, limits, decoded outputs, probe
//! results, packets, frames and clip plans. These modules import nothing of the API modules (`audio`,
//! `video`, `probe`, `media`) nor of the backend, so that both sides can name them: the
//! [`crate::backend::Backend`] trait takes and returns them, `crate::ffmpeg` fills them, and the API
//! modules re-export them at their public paths (`spdl_io::audio::AudioOptions`,
//! `spdl_io::video::VideoLimits`, `spdl_io::media::MediaPackets`, ...).

#[cfg(feature = "audio")]
pub(crate) mod audio;
#[cfg(feature = "ffmpeg")]
pub(crate) mod clips;
#[cfg(feature = "ffmpeg")]
pub(crate) mod media;
#[cfg(feature = "audio")]
pub(crate) mod probe;
#[cfg(feature = "ffmpeg")]
pub(crate) mod sampling;
#[cfg(feature = "ffmpeg")]
pub(crate) mod video;
