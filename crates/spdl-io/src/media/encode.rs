//! SPDL's encoding and muxing objects (feature `ffmpeg`): a [`Muxer`] writes one container (a file, or any
//! output FFmpeg can open), with streams that are either encoded here from frames ([`AudioEncoder`],
//! [`VideoEncoder`], configured by [`AudioEncodeConfig`]/[`VideoEncodeConfig`]) or copied from demuxed packets
//! ([`Muxer::add_remux_stream`]).
//!
//! As everywhere in [`crate::media`], these are the API types; the backend behind them does the FFmpeg work.
//! Packets out of an encoder carry the encoder's time base (`1 / frame_rate`, `1 / sample_rate`);
//! [`Muxer::write`] rescales them to the stream's.

use super::backend;
use crate::Result;
use crate::backend::{EncoderOps, MuxerOps};
use crate::types::media::{AudioEncodeConfig, Codec, EncoderChoice, MediaFrames, MediaPackets, VideoEncodeConfig};

/// Writes one container (SPDL's `Muxer`): add its streams, [`Muxer::open`] it, [`Muxer::write`] packets to
/// each stream, then [`Muxer::flush`] and [`Muxer::close`] (dropping an open muxer closes it too, ignoring
/// errors).
///
/// ```no_run
/// use spdl_io::media::{EncoderChoice, Muxer, VideoEncodeConfig, reference_video_frames};
///
/// let mut muxer = Muxer::new("out.mp4", None)?;
/// let mut config = VideoEncodeConfig::new(64, 48);
/// config.frame_rate = Some((25, 1));
/// config.pix_fmt = Some("rgb24".into());
/// let mut encoder = muxer.add_video_encode_stream(&config, &EncoderChoice::default())?;
/// muxer.open(&[])?;
/// let pixels = vec![128u8; 10 * 48 * 64 * 3];
/// let frames = reference_video_frames(&pixels, &[10, 48, 64, 3], 1, "rgb24", (25, 1), 0)?;
/// if let Some(packets) = encoder.encode(&frames)? {
///     muxer.write(0, &packets)?;
/// }
/// if let Some(packets) = encoder.flush()? {
///     muxer.write(0, &packets)?;
/// }
/// muxer.flush()?;
/// muxer.close()?;
/// # Ok::<(), spdl_io::Error>(())
/// ```
pub struct Muxer(Box<dyn MuxerOps>);

impl std::fmt::Debug for Muxer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Muxer")
            .field("dst", &self.0.dst())
            .field("streams", &self.0.num_streams())
            .finish_non_exhaustive()
    }
}

impl Muxer {
    /// A muxer writing `dst` (a path, or any URL FFmpeg opens for writing) in the container `format` (an
    /// FFmpeg muxer name, `ffmpeg -muxers`; `None`: from `dst`'s extension). Nothing is opened or written
    /// before [`Muxer::open`].
    ///
    /// Errors: [`crate::Error::InvalidOptions`] when the container cannot be told from `dst` or `format` is
    /// unknown, [`crate::Error::Unavailable`] (no FFmpeg).
    pub fn new(dst: &str, format: Option<&str>) -> Result<Muxer> {
        Ok(Muxer(backend()?.new_muxer(dst, format)?))
    }

    /// Where it writes.
    pub fn dst(&self) -> &str {
        self.0.dst()
    }

    /// Streams added so far (their indices are `0..num_streams()`, in the order they were added).
    pub fn num_streams(&self) -> usize {
        self.0.num_streams()
    }

    /// Adds an audio stream encoded from frames: the encoder that makes its packets (stream index:
    /// [`AudioEncoder::stream_index`]). Only before [`Muxer::open`].
    ///
    /// Errors: [`crate::Error::InvalidOptions`] for an unknown encoder, one that is not an audio encoder, a
    /// sample format, rate or channel count it does not take, or an option it does not know.
    pub fn add_audio_encode_stream(
        &mut self,
        config: &AudioEncodeConfig,
        encoder: &EncoderChoice,
    ) -> Result<AudioEncoder> {
        Ok(AudioEncoder(self.0.add_audio_stream(config, encoder)?))
    }

    /// Adds a video stream encoded from frames: the encoder that makes its packets. Only before
    /// [`Muxer::open`].
    ///
    /// Errors: [`crate::Error::InvalidOptions`] for an unknown encoder, one that is not a video encoder, a
    /// size, frame rate, pixel format or color setting it does not take, or an option it does not know.
    pub fn add_video_encode_stream(
        &mut self,
        config: &VideoEncodeConfig,
        encoder: &EncoderChoice,
    ) -> Result<VideoEncoder> {
        Ok(VideoEncoder(self.0.add_video_stream(config, encoder)?))
    }

    /// Adds a stream that takes packets of `codec` as they are (demuxed from another source, not
    /// re-encoded): its index. Only before [`Muxer::open`].
    ///
    /// Errors: [`crate::Error::InvalidOptions`] when the container holds no stream of the codec's kind.
    pub fn add_remux_stream(&mut self, codec: &Codec) -> Result<usize> {
        self.0.add_remux_stream(codec)
    }

    /// Opens the output and writes the container's header; `options` go to the output protocol and the
    /// muxer (`ffmpeg -h muxer=NAME`; an option neither takes is an error).
    ///
    /// Errors: [`crate::Error::InvalidOptions`] (no stream added, already open, unknown options),
    /// [`crate::Error::Encode`] (the output does not open: its cause is the [`std::io::Error`]; the header).
    pub fn open(&mut self, options: &[(String, String)]) -> Result<()> {
        self.0.open(options)
    }

    /// Writes `packets` to stream `index` (interleaved with the other streams' by FFmpeg), rescaling their
    /// timestamps from their codec's time base to the stream's. The packets are not consumed.
    ///
    /// Errors: [`crate::Error::InvalidOptions`] before [`Muxer::open`] or after [`Muxer::close`], for an
    /// index out of range or packets of another kind or codec than the stream's; [`crate::Error::Encode`].
    pub fn write(&mut self, index: usize, packets: &MediaPackets) -> Result<()> {
        self.0.write(index, packets)
    }

    /// Writes what the interleaving still holds (call it once every stream is written).
    pub fn flush(&mut self) -> Result<()> {
        self.0.flush()
    }

    /// Writes the container's trailer and closes the output; later calls are no-ops, later writes errors.
    pub fn close(&mut self) -> Result<()> {
        self.0.close()
    }
}

/// Encodes audio frames into packets of one stream of a [`Muxer`] (SPDL's `AudioEncoder`).
pub struct AudioEncoder(Box<dyn EncoderOps>);

/// Encodes video frames into packets of one stream of a [`Muxer`] (SPDL's `VideoEncoder`).
pub struct VideoEncoder(Box<dyn EncoderOps>);

impl std::fmt::Debug for AudioEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AudioEncoder").field("item", &self.0.item()).finish_non_exhaustive()
    }
}

impl std::fmt::Debug for VideoEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VideoEncoder").field("item", &self.0.item()).finish_non_exhaustive()
    }
}

impl AudioEncoder {
    /// What its errors and packets name: `DST stream I (ENCODER)`.
    pub fn item(&self) -> &str {
        self.0.item()
    }

    /// Samples per channel that each frame must have (only the last may have fewer); `0` when the encoder
    /// takes frames of any size (PCM). Slice the samples accordingly before making frames of them.
    pub fn frame_size(&self) -> usize {
        self.0.frame_size()
    }

    /// Encodes `frames` (not consumed): the packets ready, or `None` while the encoder holds them back.
    ///
    /// Errors: [`crate::Error::InvalidOptions`] for frames of another kind, format, rate or channel count than
    /// the configuration's, or of more samples than [`AudioEncoder::frame_size`]; [`crate::Error::Encode`].
    pub fn encode(&mut self, frames: &MediaFrames) -> Result<Option<MediaPackets>> {
        self.0.encode(frames)
    }

    /// Ends the stream: the packets the encoder still held, or `None`. The encoder is then spent.
    pub fn flush(&mut self) -> Result<Option<MediaPackets>> {
        self.0.flush()
    }

    /// The codec of the packets it makes (their time base is `1 / sample_rate`).
    pub fn codec(&self) -> &Codec {
        self.0.codec()
    }

    /// The index of its stream in the muxer.
    pub fn stream_index(&self) -> usize {
        self.0.stream_index()
    }
}

impl VideoEncoder {
    /// What its errors and packets name: `DST stream I (ENCODER)`.
    pub fn item(&self) -> &str {
        self.0.item()
    }

    /// Encodes `frames` (not consumed; converted first when the encoder does not take their format): the
    /// packets ready, or `None` while the encoder holds them back (most do for a few frames).
    ///
    /// Errors: [`crate::Error::InvalidOptions`] for frames of another kind, size or pixel format than the
    /// configuration's; [`crate::Error::Encode`].
    pub fn encode(&mut self, frames: &MediaFrames) -> Result<Option<MediaPackets>> {
        self.0.encode(frames)
    }

    /// Ends the stream: the packets the encoder still held, or `None`. The encoder is then spent.
    pub fn flush(&mut self) -> Result<Option<MediaPackets>> {
        self.0.flush()
    }

    /// The codec of the packets it makes (their time base is `1 / frame_rate`).
    pub fn codec(&self) -> &Codec {
        self.0.codec()
    }

    /// The pixel format it encodes in (the configuration's, or the one frames are converted to).
    pub fn encoder_pix_fmt(&self) -> &str {
        &self.0.codec().pix_fmt
    }

    /// The index of its stream in the muxer.
    pub fn stream_index(&self) -> usize {
        self.0.stream_index()
    }
}
