//! The FFmpeg backend (feature `ffmpeg-linked`; ffmpeg-next over the FFmpeg 4–8 libraries it is built
//! against): every call into libav* lives here, behind [`crate::backend::Backend`], which the media, video,
//! audio and probe APIs call. Built into a program (`ffmpeg-linked`), or into `libspdl_ffmpeg{M}.so`, one
//! per FFmpeg major, which `crate::media` loads at run time
//! (through [`entry`]).
//!
//! - `avio`: FFmpeg set-up, errors, and opening a [`crate::MediaInput`] (a path or in-memory bytes)
//!   through a custom AVIO read/seek context, so bytes fetched from object storage need no temp file and
//!   a path is never read as an FFmpeg protocol URL.
//! - `demux`: the packets of a video stream that a time window needs.
//! - `video`: libavcodec video decoding and swscale conversion into one `[N, H, W, C]` buffer.
//! - `clips`: a clip plan decoded run by run (each GOP once), into one `[clips, frames, H, W, C]` buffer.
//! - `audio`: libavcodec audio decoding into the audio API's planar `f32` scratch (what symphonia cannot
//!   read, and MP3/Vorbis, which libavcodec decodes faster).
//! - `probe`: every stream of any container FFmpeg reads.
//! - `media`, `frames`, `bsf`: SPDL's streaming objects ([`crate::media`]): a demuxer kept open over a
//!   source, a streaming decoder with an optional filter graph, bitstream filters, `convert_frames`.
//! - `serialize`: packets as bytes and back (pickling, and zero-copy views of serialized packets).
//! - `encode`: the way back: a muxer writing one container, with encoded or remuxed streams, and the
//!   audio/video encoders (swscale when the frames' pixel format is not the encoder's).
//!
//! Every entry point catches its own panics (`catch`): in a loaded backend, a panic must not unwind into
//! the loader's copy of the Rust runtime.
//!
//! FFmpeg's own log is quiet unless `SPDL_FFMPEG_LOG` is set (`error`, `warning`, `info`, `debug`).

mod audio;
mod avio;
mod bsf;
mod clips;
mod demux;
mod encode;
mod frames;
mod media;
mod probe;
mod serialize;
mod video;

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

use spdl_buffer::{Buffer, SharedAllocator};

use std::ffi::c_void;

use crate::Result;
use crate::backend::{Backend, BsfOps, DecoderOps, DemuxerOps, EncoderOps, FilterGraphOps, MuxerOps, abi};
use crate::input::{MediaInput, TimeWindow};
use crate::types::audio::{AudioLimits, Decoded};
use crate::types::clips::{ClipOptions, ClipPlan, ClipStats};
use crate::types::media::{
    AudioEncodeConfig, Codec, DecodeConfig, DemuxConfig, EncoderChoice, Fraction, Frame, MediaFrames, MediaPackets,
    MediaType, Packets, SharedBytes, VideoEncodeConfig,
};
use crate::types::probe::MediaInfo;
use crate::types::video::{DecodeOptions, DemuxOptions, Frames, VideoLimits};

/// The backend of this build.
pub(crate) fn linked() -> &'static dyn Backend {
    &FfBackend
}

/// What a backend's entry point does (`spdl_io::media::abi::entry`, which the backend libraries export):
/// checks `request` and returns a pointer to its `&'static dyn Backend`, or null when the request is of
/// another build.
///
/// # Safety
/// `request` must be null or point at a valid [`abi::Request`].
pub unsafe fn entry(request: *const abi::Request) -> *const c_void {
    static BACKEND: std::sync::OnceLock<&'static dyn Backend> = std::sync::OnceLock::new();
    let answer = std::panic::catch_unwind(|| {
        // SAFETY: the caller passes null or a valid request.
        let Some(r) = (unsafe { request.as_ref() }) else { return std::ptr::null() };
        if r.abi != abi::ABI || r.build_id.is_null() {
            return std::ptr::null();
        }
        // SAFETY: `build_id` points at `build_id_len` bytes owned by the caller for the call.
        let id = unsafe { std::slice::from_raw_parts(r.build_id, r.build_id_len) };
        if id != abi::build_id().as_bytes() {
            return std::ptr::null();
        }
        if !r.decode_memory.is_null() {
            // SAFETY: the build id matched: `decode_memory` is this build's `SharedDecodeMemory`, a static of the
            // loader.
            crate::decode_memory::use_host(unsafe {
                &*r.decode_memory.cast::<crate::decode_memory::SharedDecodeMemory>()
            });
        }
        let b: &'static &'static dyn Backend = BACKEND.get_or_init(linked);
        b as *const &'static dyn Backend as *const c_void
    });
    answer.unwrap_or(std::ptr::null())
}

/// Runs `f`, turning a panic into [`Error::Decode`] for `item`.
fn catch<T>(item: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    crate::error::guarded(item, "ffmpeg", f)
}

/// Runs `f`, giving `fallback` if it panics (for the entry points that cannot fail).
fn catch_or<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

struct FfBackend;

impl Backend for FfBackend {
    fn versions(&self) -> Vec<(String, String)> {
        catch_or(Vec::new(), avio::versions)
    }

    fn filters(&self) -> Vec<String> {
        catch_or(Vec::new(), avio::filters)
    }

    fn log_level(&self) -> i32 {
        avio::init();
        // SAFETY: reads FFmpeg's global log level; no arguments.
        catch_or(0, || unsafe { ffmpeg_next::ffi::av_log_get_level() })
    }

    fn set_log_level(&self, level: i32) {
        avio::init();
        // SAFETY: sets FFmpeg's global log level (an int FFmpeg reads before each message).
        catch_or((), || unsafe { ffmpeg_next::ffi::av_log_set_level(level) })
    }

    fn probe(&self, input: &MediaInput<'_>, item: &str, size_bytes: u64) -> Result<MediaInfo> {
        catch(item, || probe::probe_ffmpeg(input, item, size_bytes))
    }

    fn decode_audio_track(
        &self,
        input: &MediaInput<'_>,
        item: &str,
        window: Option<&TimeWindow>,
        limits: &AudioLimits,
    ) -> Result<Decoded> {
        catch(item, || audio::decode_audio_track(input, item, window, limits))
    }

    fn demux_video(&self, input: &MediaInput<'_>, opts: &DemuxOptions) -> Result<Packets> {
        catch(&input.name(), || demux::demux_video(input, opts))
    }

    fn decode_packets(&self, packets: Packets, opts: &DecodeOptions, allocator: &SharedAllocator) -> Result<Frames> {
        let item = packets.item.clone();
        catch(&item, || video::decode_packets(packets, opts, allocator))
    }

    fn decode_clips(&self, packets: Packets, plan: &ClipPlan, opts: &ClipOptions, dst: &mut [u8]) -> Result<ClipStats> {
        let item = packets.item.clone();
        catch(&item, || clips::decode_clips(packets, plan, opts, dst))
    }

    fn open_demuxer(&self, input: &MediaInput<'_>, config: &DemuxConfig) -> Result<Box<dyn DemuxerOps>> {
        catch(&input.name(), || Ok(Box::new(media::FfDemuxer::open(input, config)?) as Box<dyn DemuxerOps>))
    }

    fn new_decoder(
        &self,
        codec: &Codec,
        config: &DecodeConfig,
        filter_desc: Option<&str>,
        item: &str,
        limits: VideoLimits,
    ) -> Result<Box<dyn DecoderOps>> {
        catch(item, || {
            Ok(Box::new(frames::FfDecoder::new(codec, config, filter_desc, item, limits)?) as Box<dyn DecoderOps>)
        })
    }

    fn new_filter_graph(&self, desc: &str) -> Result<Box<dyn FilterGraphOps>> {
        catch(desc, || Ok(Box::new(frames::FfFilterGraph::new(desc)?) as Box<dyn FilterGraphOps>))
    }

    fn new_bsf(&self, codec: &Codec, desc: &str) -> Result<Box<dyn BsfOps>> {
        catch(desc, || Ok(Box::new(bsf::FfBsf::new(codec, desc)?) as Box<dyn BsfOps>))
    }

    fn clone_frames(&self, frames: &[&Frame], item: &str) -> Result<Vec<Frame>> {
        catch(item, || frames.iter().map(|f| frames::clone_frame(f, item)).collect())
    }

    fn frame_metadata(&self, frame: &Frame) -> Vec<(String, String)> {
        catch_or(Vec::new(), || frames::metadata(frame))
    }

    fn convert_frames(&self, items: &[&MediaFrames], batch: bool, allocator: &SharedAllocator) -> Result<Buffer> {
        let item = items.first().map(|f| f.item.clone()).unwrap_or_default();
        catch(&item, || frames::convert_frames(items, batch, allocator))
    }

    fn reference_video_frames(
        &self,
        data: &[u8],
        shape: &[usize],
        itemsize: usize,
        pix_fmt: &str,
        frame_rate: Fraction,
        pts: i64,
    ) -> Result<MediaFrames> {
        catch("create_reference_video_frame", || {
            frames::reference_video_frames(data, shape, itemsize, pix_fmt, frame_rate, pts)
        })
    }

    fn reference_audio_frame(
        &self,
        data: &[u8],
        shape: &[usize],
        itemsize: usize,
        sample_fmt: &str,
        sample_rate: u32,
        pts: i64,
    ) -> Result<MediaFrames> {
        catch("create_reference_audio_frame", || {
            frames::reference_audio_frame(data, shape, itemsize, sample_fmt, sample_rate, pts)
        })
    }

    fn new_muxer(&self, dst: &str, format: Option<&str>) -> Result<Box<dyn MuxerOps>> {
        catch(dst, || Ok(Box::new(encode::FfMuxer::new(dst, format)?) as Box<dyn MuxerOps>))
    }

    fn serialize_packets(&self, packets: &MediaPackets) -> Result<Vec<u8>> {
        catch(&packets.item, || serialize::serialize(packets))
    }

    fn deserialize_packets(&self, data: &[u8], keeper: Option<&SharedBytes>) -> Result<MediaPackets> {
        catch("serialized packets", || serialize::deserialize(data, keeper))
    }
}

impl DemuxerOps for media::FfDemuxer {
    fn item(&self) -> &str {
        self.item()
    }

    fn stream_index(&self, kind: MediaType) -> Option<usize> {
        catch_or(None, || self.stream_index(kind))
    }

    fn codec(&self, kind: MediaType) -> Result<Codec> {
        catch(self.item(), || self.codec(kind))
    }

    fn demux(&mut self, kind: MediaType, window: Option<(f64, f64)>) -> Result<MediaPackets> {
        let item = self.item().to_owned();
        catch(&item, || self.demux(kind, window))
    }

    fn start_streaming(&mut self, indices: &[usize], num_packets: Option<usize>, duration: Option<f64>) -> Result<()> {
        let item = self.item().to_owned();
        catch(&item, || self.start_streaming(indices, num_packets, duration))
    }

    fn next_chunk(&mut self) -> Result<Option<BTreeMap<usize, MediaPackets>>> {
        let item = self.item().to_owned();
        catch(&item, || self.next_chunk())
    }
}

impl DecoderOps for frames::FfDecoder {
    fn item(&self) -> &str {
        self.item()
    }

    fn decode_until(&mut self, packets: &MediaPackets, max: Option<usize>) -> Result<MediaFrames> {
        catch(&packets.item, || self.decode_until(packets, max))
    }

    fn flush(&mut self) -> Result<MediaFrames> {
        let item = self.item().to_owned();
        catch(&item, || self.flush())
    }
}

impl FilterGraphOps for frames::FfFilterGraph {
    fn desc(&self) -> &str {
        self.desc()
    }

    fn set_limits(&mut self, limits: VideoLimits) {
        self.set_limits(limits);
    }

    fn inputs(&self) -> Vec<String> {
        self.inputs()
    }

    fn outputs(&self) -> Vec<String> {
        self.outputs()
    }

    fn add_frames(&mut self, frames: &MediaFrames, key: Option<&str>) -> Result<()> {
        catch(&frames.item, || self.add_frames(frames, key))
    }

    fn flush(&mut self) -> Result<()> {
        let desc = self.desc().to_owned();
        catch(&desc, || self.flush())
    }

    fn get_frames(&mut self, key: Option<&str>, item: &str) -> Result<Option<MediaFrames>> {
        catch(item, || self.get_frames(key, item))
    }

    fn dump(&self) -> String {
        catch_or(String::new(), || self.dump())
    }
}

impl BsfOps for bsf::FfBsf {
    fn desc(&self) -> &str {
        self.desc()
    }

    fn output_codec(&self) -> &Codec {
        self.output_codec()
    }

    fn filter(&mut self, packets: &MediaPackets, flush: bool) -> Result<Option<MediaPackets>> {
        catch(&packets.item, || self.filter(packets, flush))
    }

    fn flush(&mut self, item: &str) -> Result<Option<MediaPackets>> {
        catch(item, || self.flush(item))
    }
}

impl MuxerOps for encode::FfMuxer {
    fn dst(&self) -> &str {
        self.dst()
    }

    fn num_streams(&self) -> usize {
        self.num_streams()
    }

    fn add_audio_stream(&mut self, config: &AudioEncodeConfig, choice: &EncoderChoice) -> Result<Box<dyn EncoderOps>> {
        let dst = self.dst().to_owned();
        catch(&dst, || Ok(Box::new(self.add_audio_stream(config, choice)?) as Box<dyn EncoderOps>))
    }

    fn add_video_stream(&mut self, config: &VideoEncodeConfig, choice: &EncoderChoice) -> Result<Box<dyn EncoderOps>> {
        let dst = self.dst().to_owned();
        catch(&dst, || Ok(Box::new(self.add_video_stream(config, choice)?) as Box<dyn EncoderOps>))
    }

    fn add_remux_stream(&mut self, codec: &Codec) -> Result<usize> {
        let dst = self.dst().to_owned();
        catch(&dst, || self.add_remux_stream(codec))
    }

    fn open(&mut self, options: &[(String, String)]) -> Result<()> {
        let dst = self.dst().to_owned();
        catch(&dst, || self.open(options))
    }

    fn write(&mut self, index: usize, packets: &MediaPackets) -> Result<()> {
        let dst = self.dst().to_owned();
        catch(&dst, || self.write(index, packets))
    }

    fn flush(&mut self) -> Result<()> {
        let dst = self.dst().to_owned();
        catch(&dst, || self.flush())
    }

    fn close(&mut self) -> Result<()> {
        let dst = self.dst().to_owned();
        catch(&dst, || self.close())
    }
}

impl EncoderOps for encode::FfEncoder {
    fn item(&self) -> &str {
        self.item()
    }

    fn codec(&self) -> &Codec {
        self.codec()
    }

    fn stream_index(&self) -> usize {
        self.stream_index()
    }

    fn frame_size(&self) -> usize {
        self.frame_size()
    }

    fn encode(&mut self, frames: &MediaFrames) -> Result<Option<MediaPackets>> {
        let item = self.item().to_owned();
        catch(&item, || self.encode(frames))
    }

    fn flush(&mut self) -> Result<Option<MediaPackets>> {
        let item = self.item().to_owned();
        catch(&item, || self.flush())
    }
}
