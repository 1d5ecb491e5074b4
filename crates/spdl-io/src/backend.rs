//! What the media API asks of FFmpeg (feature `ffmpeg`): the [`Backend`] trait and the objects it makes
//! (demuxers, decoders, filter graphs, bitstream filters, muxers, encoders), and the boundary a backend
//! loaded at run time is reached through ([`abi`]).
//!
//! The trait names only plain data ([`crate::types`], [`crate::input`]); `crate::ffmpeg` implements it
//! (feature `ffmpeg-linked`), and [`crate::media`] finds the implementation (linked in, or loaded) for the
//! entry points of audio, video, probing and the media objects.
//!
//! The backend and the library that loads it must come from one build: they share Rust types across the
//! boundary (a trait object and the values it takes and returns), which is sound only when both were
//! compiled from the same sources by the same compiler. The entry point checks a build id that says so
//! before anything else crosses, and the backend catches its own panics (two copies of the Rust runtime
//! cannot unwind into each other).

use std::collections::BTreeMap;

use spdl_buffer::{Buffer, SharedAllocator};

use crate::Result;
use crate::input::{MediaInput, TimeWindow};
use crate::types::audio::{AudioLimits, Decoded};
use crate::types::clips::{ClipOptions, ClipPlan, ClipStats};
use crate::types::media::{
    AudioEncodeConfig, Codec, DecodeConfig, DemuxConfig, EncoderChoice, Fraction, Frame, MediaFrames, MediaPackets,
    MediaType, Packets, SharedBytes, VideoEncodeConfig,
};
use crate::types::probe::MediaInfo;
use crate::types::video::{DecodeOptions, DemuxOptions, Frames, VideoLimits};

/// Everything the media API asks of FFmpeg.
pub(crate) trait Backend: Send + Sync {
    /// `(library, version)` of the FFmpeg libraries in use (`("libavcodec", "59.37.100")`, ...).
    fn versions(&self) -> Vec<(String, String)>;
    /// The names of the filters libavfilter has, sorted.
    fn filters(&self) -> Vec<String>;
    /// FFmpeg's log level (`av_log_get_level`).
    fn log_level(&self) -> i32;
    /// Sets FFmpeg's log level (`av_log_set_level`).
    fn set_log_level(&self, level: i32);
    /// Every stream of any container FFmpeg reads.
    fn probe(&self, input: &MediaInput<'_>, item: &str, size_bytes: u64) -> Result<MediaInfo>;
    /// The best audio stream, decoded into the audio API's scratch.
    fn decode_audio_track(
        &self,
        input: &MediaInput<'_>,
        item: &str,
        window: Option<&TimeWindow>,
        limits: &AudioLimits,
    ) -> Result<Decoded>;
    /// The packets of the best video stream that `opts.window` needs.
    fn demux_video(&self, input: &MediaInput<'_>, opts: &DemuxOptions) -> Result<Packets>;
    /// Decodes, samples and converts video packets into one buffer.
    fn decode_packets(&self, packets: Packets, opts: &DecodeOptions, allocator: &SharedAllocator) -> Result<Frames>;
    /// Decodes a clip plan made from `packets` into `dst` (its size checked by the caller).
    fn decode_clips(&self, packets: Packets, plan: &ClipPlan, opts: &ClipOptions, dst: &mut [u8]) -> Result<ClipStats>;
    fn open_demuxer(&self, input: &MediaInput<'_>, config: &DemuxConfig) -> Result<Box<dyn DemuxerOps>>;
    fn new_decoder(
        &self,
        codec: &Codec,
        config: &DecodeConfig,
        filter_desc: Option<&str>,
        item: &str,
        limits: VideoLimits,
    ) -> Result<Box<dyn DecoderOps>>;
    fn new_filter_graph(&self, desc: &str) -> Result<Box<dyn FilterGraphOps>>;
    fn new_bsf(&self, codec: &Codec, desc: &str) -> Result<Box<dyn BsfOps>>;
    /// New references to the data of `frames`.
    fn clone_frames(&self, frames: &[&Frame], item: &str) -> Result<Vec<Frame>>;
    fn frame_metadata(&self, frame: &Frame) -> Vec<(String, String)>;
    fn convert_frames(&self, items: &[&MediaFrames], batch: bool, allocator: &SharedAllocator) -> Result<Buffer>;
    fn reference_video_frames(
        &self,
        data: &[u8],
        shape: &[usize],
        itemsize: usize,
        pix_fmt: &str,
        frame_rate: Fraction,
        pts: i64,
    ) -> Result<MediaFrames>;
    fn reference_audio_frame(
        &self,
        data: &[u8],
        shape: &[usize],
        itemsize: usize,
        sample_fmt: &str,
        sample_rate: u32,
        pts: i64,
    ) -> Result<MediaFrames>;
    /// A muxer writing `dst` in container `format` (from the name when `None`); nothing opened yet.
    fn new_muxer(&self, dst: &str, format: Option<&str>) -> Result<Box<dyn MuxerOps>>;
    /// `packets` as bytes, codec parameters and side data included ([`MediaPackets::serialize`]).
    fn serialize_packets(&self, packets: &MediaPackets) -> Result<Vec<u8>>;
    /// Packets from bytes that `serialize_packets` wrote: pointing into `data` when `keeper` (the owner of
    /// `data`'s memory) is given, else copied out of it.
    fn deserialize_packets(&self, data: &[u8], keeper: Option<&SharedBytes>) -> Result<MediaPackets>;
}

/// An open demuxer ([`crate::media::Demuxer`]).
pub(crate) trait DemuxerOps: Send {
    fn item(&self) -> &str;
    fn stream_index(&self, kind: MediaType) -> Option<usize>;
    fn codec(&self, kind: MediaType) -> Result<Codec>;
    fn demux(&mut self, kind: MediaType, window: Option<(f64, f64)>) -> Result<MediaPackets>;
    fn start_streaming(&mut self, indices: &[usize], num_packets: Option<usize>, duration: Option<f64>) -> Result<()>;
    fn next_chunk(&mut self) -> Result<Option<BTreeMap<usize, MediaPackets>>>;
}

/// A streaming decoder ([`crate::media::Decoder`]).
pub(crate) trait DecoderOps: Send {
    fn item(&self) -> &str;
    fn decode_until(&mut self, packets: &MediaPackets, max: Option<usize>) -> Result<MediaFrames>;
    fn flush(&mut self) -> Result<MediaFrames>;
}

/// A configured filter graph ([`crate::media::FilterGraph`]).
pub(crate) trait FilterGraphOps: Send {
    fn desc(&self) -> &str;
    fn set_limits(&mut self, limits: VideoLimits);
    fn inputs(&self) -> Vec<String>;
    fn outputs(&self) -> Vec<String>;
    fn add_frames(&mut self, frames: &MediaFrames, key: Option<&str>) -> Result<()>;
    fn flush(&mut self) -> Result<()>;
    fn get_frames(&mut self, key: Option<&str>, item: &str) -> Result<Option<MediaFrames>>;
    fn dump(&self) -> String;
}

/// A bitstream filter chain ([`crate::media::Bsf`]).
pub(crate) trait BsfOps: Send {
    fn desc(&self) -> &str;
    fn output_codec(&self) -> &Codec;
    fn filter(&mut self, packets: &MediaPackets, flush: bool) -> Result<Option<MediaPackets>>;
    fn flush(&mut self, item: &str) -> Result<Option<MediaPackets>>;
}

/// A muxer ([`crate::media::Muxer`]): streams are added, then it is opened, written, flushed and closed.
pub(crate) trait MuxerOps: Send {
    fn dst(&self) -> &str;
    fn num_streams(&self) -> usize;
    fn add_audio_stream(&mut self, config: &AudioEncodeConfig, choice: &EncoderChoice) -> Result<Box<dyn EncoderOps>>;
    fn add_video_stream(&mut self, config: &VideoEncodeConfig, choice: &EncoderChoice) -> Result<Box<dyn EncoderOps>>;
    fn add_remux_stream(&mut self, codec: &Codec) -> Result<usize>;
    fn open(&mut self, options: &[(String, String)]) -> Result<()>;
    fn write(&mut self, index: usize, packets: &MediaPackets) -> Result<()>;
    fn flush(&mut self) -> Result<()>;
    fn close(&mut self) -> Result<()>;
}

/// An encoder of one muxer stream ([`crate::media::AudioEncoder`], [`crate::media::VideoEncoder`]).
pub(crate) trait EncoderOps: Send {
    fn item(&self) -> &str;
    fn codec(&self) -> &Codec;
    fn stream_index(&self) -> usize;
    fn frame_size(&self) -> usize;
    fn encode(&mut self, frames: &MediaFrames) -> Result<Option<MediaPackets>>;
    fn flush(&mut self) -> Result<Option<MediaPackets>>;
}

/// The boundary between a loading library and a backend (not an API: both sides are this crate, from one
/// build).
pub mod abi {
    use std::ffi::c_void;

    /// The entry point a backend exports.
    pub const ENTRY: &str = "spdl_ffmpeg_backend_v1";
    /// The version of [`Request`] and of what the entry point returns.
    pub const ABI: u32 = 1;

    /// The entry point's type.
    pub type EntryFn = unsafe extern "C" fn(*const Request) -> *const c_void;

    /// What the loading library hands the backend.
    #[repr(C)]
    #[derive(Debug)]
    pub struct Request {
        /// [`ABI`].
        pub abi: u32,
        /// [`build_id`], UTF-8.
        pub build_id: *const u8,
        /// Its length in bytes.
        pub build_id_len: usize,
        /// The loading library's decode memory budget (read only after the build id matched).
        pub decode_memory: *const c_void,
    }

    impl Request {
        /// The request of this build.
        #[allow(dead_code)] // only the loading side makes one
        pub(crate) fn new() -> Request {
            let id = build_id();
            Request {
                abi: ABI,
                build_id: id.as_ptr(),
                build_id_len: id.len(),
                decode_memory: crate::decode_memory::shared() as *const crate::decode_memory::SharedDecodeMemory
                    as *const c_void,
            }
        }
    }

    /// This build's id: the crate's version, the compiler, the target and a digest of the sources of the
    /// types that cross the boundary.
    pub fn build_id() -> &'static str {
        env!("SPDL_IO_BUILD_ID")
    }
}
