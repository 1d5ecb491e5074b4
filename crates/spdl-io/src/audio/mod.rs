//! Audio decoding into [`spdl_buffer::Buffer`]s: one clip ([`decode_audio`]) or a batch of clips padded or
//! truncated to one length ([`decode_audio_batch`]), from files or in-memory bytes ([`MediaInput`]).
//!
//! Start from [`decode_audio`] with [`AudioOptions`]: a time window (the decoder seeks to it rather than
//! decoding from the start when the container allows), a target sample rate (rubato's FFT resampler),
//! channel selection or mono mix-down, `f32` or `i16` samples, channels-first `[C, T]` or interleaved
//! `[T, C]`. Output goes straight into memory from any [`spdl_buffer::HostAllocator`].
//!
//! Decoders, in order ([`AudioBackend::Auto`]):
//! 1. **PCM/float WAV fast path**: samples are read from the file's bytes straight into the output (only the
//!    window's bytes are read); no decoder, no shared state, so it scales with threads.
//! 2. **symphonia** (pure Rust): WAV (ADPCM, A-law, ...), FLAC, MP3, Ogg Vorbis, AAC in ADTS or MP4/M4A,
//!    MKV/WebM. AAC in MP4/M4A starts after the encoder's priming samples, as the edit list says (as FFmpeg does);
//!    ADTS AAC has no such record and keeps them (as FFmpeg does).
//! 3. **FFmpeg** (feature `ffmpeg`): what symphonia cannot read, such as the audio track of an MP4/MKV video
//!    with another codec, or Opus; and MP3 and Ogg Vorbis read from their beginning, which libavcodec
//!    decodes about 1.2x and 1.3-1.6x faster than symphonia (symphonia remains their fallback, and decodes
//!    windows that start later, for their exact samples after a seek).
//!
//! Bounded work: [`AudioLimits`] caps decoded samples, packets, channels and rate; corrupt or truncated input
//! gives a typed [`crate::Error`] naming the item (a cut file yields the frames before the cut), and a
//! panic inside a decoder is caught and reported as [`crate::Error::Decode`].
//!
//! # Example
//! ```
//! use spdl_buffer::{Layout, system_allocator};
//! use spdl_io::audio::{AudioOptions, ChannelSelect, decode_audio, encode_wav_i16};
//! use spdl_io::{MediaInput, TimeWindow};
//!
//! // One second of a stereo 440 Hz sine at 8 kHz, as a WAV file in memory.
//! let samples: Vec<i16> = (0..8000)
//!     .flat_map(|i| {
//!         let s = ((i as f32 * 440.0 / 8000.0 * std::f32::consts::TAU).sin() * 16384.0) as i16;
//!         [s, s]
//!     })
//!     .collect();
//! let wav = encode_wav_i16(&samples, 2, 8000);
//!
//! let opts = AudioOptions {
//!     window: Some(TimeWindow::new(0.25, 0.5)),
//!     sample_rate: Some(16_000),
//!     channels: ChannelSelect::Mono,
//!     ..AudioOptions::default()
//! };
//! let audio = decode_audio(MediaInput::bytes(&wav, "sine.wav"), &opts, &system_allocator())?;
//! assert_eq!(audio.buffer.shape(), &[1, 8000]); // [C, T]: 0.5 s at 16 kHz
//! assert_eq!(audio.buffer.layout(), Layout::Ct);
//! assert_eq!((audio.sample_rate, audio.start_s), (16_000, 0.25));
//! # Ok::<(), spdl_io::Error>(())
//! ```

mod batch;
mod mp4;
mod resample;
mod symph;
mod wav;

use spdl_buffer::{Buffer, DType, SharedAllocator};

pub use crate::input::{MediaInput, TimeWindow};
pub use crate::probe::{MediaInfo, StreamInfo, StreamKind, probe};
pub use crate::types::audio::{AudioBackend, AudioLayout, AudioLimits, AudioOptions, ChannelSelect, SampleType};
pub use batch::{AudioBatch, AudioBatchOptions, decode_audio_batch};
pub use wav::encode_wav_i16;

use crate::types::audio::Decoded;

use crate::error::guarded;
use crate::types::audio::render::{self, ClipSource, Mapping, OutSample, Planes};
use crate::{Error, Result};

/// A decoded clip.
#[derive(Debug)]
#[non_exhaustive]
pub struct Audio {
    /// `[C, T]` ([`spdl_buffer::Layout::Ct`]) or `[T, C]` ([`spdl_buffer::Layout::Tc`]), `f32` or `i16`.
    pub buffer: Buffer,
    /// Sample rate of `buffer`, in Hz.
    pub sample_rate: u32,
    /// Frames of `buffer` that hold decoded audio; the rest (up to [`AudioOptions::num_frames`]) is zero.
    pub frames: usize,
    /// Time of the first frame in the source, in seconds (the window start, or where the stream began).
    pub start_s: f64,
    /// What was decoded.
    pub source: SourceInfo,
}

/// What the decoded stream was.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SourceInfo {
    /// Codec short name (`"pcm_s16le"`, `"flac"`, `"mp3"`, `"aac"`, `"vorbis"`, ...).
    pub codec: String,
    /// Container short name (`"wav"`, `"ogg"`, `"isomp4"`, ...).
    pub container: String,
    /// Source sample rate in Hz.
    pub sample_rate: u32,
    /// Source channel count.
    pub channels: usize,
}

/// An opened clip at the source rate, restricted to the window.
#[derive(Debug)]
pub(crate) enum Clip<'a> {
    Wav(wav::WavClip<'a>),
    Decoded(Decoded),
}

impl Clip<'_> {
    fn channels(&self) -> usize {
        match self {
            Clip::Wav(w) => w.channels(),
            Clip::Decoded(d) => d.planes.channels(),
        }
    }

    fn frames(&self) -> usize {
        match self {
            Clip::Wav(w) => w.frames(),
            Clip::Decoded(d) => d.planes.frames(),
        }
    }

    fn rate(&self) -> u32 {
        match self {
            Clip::Wav(w) => w.header.sample_rate,
            Clip::Decoded(d) => d.sample_rate,
        }
    }

    fn start_s(&self) -> f64 {
        match self {
            Clip::Wav(w) => w.start_s,
            Clip::Decoded(d) => d.start_s,
        }
    }

    fn source_info(&self) -> SourceInfo {
        match self {
            Clip::Wav(w) => SourceInfo {
                codec: w.header.kind.codec_name().into(),
                container: "wav".into(),
                sample_rate: w.header.sample_rate,
                channels: w.header.channels,
            },
            Clip::Decoded(d) => SourceInfo {
                codec: d.codec.clone(),
                container: d.container.clone(),
                sample_rate: d.sample_rate,
                channels: d.planes.channels(),
            },
        }
    }
}

#[cfg(feature = "ffmpeg")]
fn ffmpeg_decode(input: &MediaInput<'_>, item: &str, opts: &AudioOptions) -> Result<Decoded> {
    let backend = crate::media::backend()?;
    guarded(item, "ffmpeg", || backend.decode_audio_track(input, item, opts.window.as_ref(), &opts.limits))
}

/// True when `head` (the first bytes of an input) starts a stream that FFmpeg decodes faster than
/// symphonia (measured with `av_throughput --backend`, docs/benchmarks.md): MP3 (an ID3v2 tag, or an
/// MPEG-1/2/2.5 Layer III frame header) and Ogg (Vorbis; Opus, which symphonia cannot read, goes there
/// anyway). FLAC stays with symphonia, which is faster on it; AAC too (the two differ on priming samples).
#[cfg(feature = "ffmpeg")]
fn ffmpeg_is_faster(head: &[u8]) -> bool {
    match head {
        [b'I', b'D', b'3', ..] | [b'O', b'g', b'g', b'S', ..] => true,
        // 11 sync bits, a version other than "reserved" (01), layer III (01).
        [0xFF, b, ..] => b & 0xE0 == 0xE0 && (b >> 3) & 0b11 != 0b01 && (b >> 1) & 0b11 == 0b01,
        _ => false,
    }
}

/// `first`'s error (its variant, for callers that match on it), with the reasons of both decoders in its
/// message, when both failed: "`first_name`: why; `second_name`: why".
#[cfg(feature = "ffmpeg")]
fn both_failed(first: Error, first_name: &str, second: &Error, second_name: &str) -> Error {
    use spdl_report::error_chain;
    let label = |name: &str, why: String| {
        if why.to_lowercase().starts_with(&name.to_lowercase()) { why } else { format!("{name}: {why}") }
    };
    let second = label(
        second_name,
        match second {
            Error::Decode { format, cause, .. } => format!("cannot decode {format}: {}", error_chain(&**cause)),
            Error::UnknownFormat { detail, .. } => detail.clone(),
            other => error_chain(other),
        },
    );
    match first {
        Error::Decode { item, format, cause } => Error::Decode {
            item,
            format,
            cause: format!("{}; {second}", label(first_name, error_chain(&*cause))).into(),
        },
        Error::UnknownFormat { item, detail } => {
            Error::UnknownFormat { item, detail: format!("{}; {second}", label(first_name, detail)) }
        }
        other => other,
    }
}

/// Opens `input` with the chosen backend and decodes its window at the source rate.
pub(crate) fn open_clip<'a>(input: &MediaInput<'a>, opts: &AudioOptions) -> Result<Clip<'a>> {
    let item = input.name();
    input.check_not_empty()?;
    match opts.backend {
        AudioBackend::Auto => {
            let mut file = match *input {
                MediaInput::Path(p) => Some(MediaInput::open_file(p)?),
                MediaInput::Bytes { .. } => None,
            };
            // The first bytes, read once: the WAV fast path parses them, the FFmpeg route sniffs them.
            let head = input.read_at(file.as_mut(), 0, wav::HEAD)?;
            if let Some(header) = wav::parse(input, file.as_mut(), &head, &item, &opts.limits)? {
                let clip = wav::open_window(input, file.as_mut(), header, opts.window.as_ref(), &item, &opts.limits)?;
                return Ok(Clip::Wav(clip));
            }
            // MP3 and Vorbis decode faster through FFmpeg than through symphonia: FFmpeg first, symphonia
            // if FFmpeg cannot read it. Not for a window that starts later: after FFmpeg's seek the first
            // MP3 frames lack their bit reservoir and overlap (0.02 off a sine where symphonia, which decodes
            // from a pre-roll packet, stays under 0.01).
            #[cfg(feature = "ffmpeg")]
            if opts.window.as_ref().is_none_or(|w| w.start_s <= 0.0) && ffmpeg_is_faster(&head) {
                drop(file);
                return match ffmpeg_decode(input, &item, opts) {
                    Ok(d) => Ok(Clip::Decoded(d)),
                    // Without FFmpeg on this machine, symphonia reads these as well.
                    Err(Error::Unavailable { .. }) => {
                        guarded(&item, "audio", || symph::decode(input, &item, opts.window.as_ref(), &opts.limits))
                            .map(Clip::Decoded)
                    }
                    Err(first @ (Error::UnknownFormat { .. } | Error::Decode { .. })) => {
                        guarded(&item, "audio", || symph::decode(input, &item, opts.window.as_ref(), &opts.limits))
                            .map(Clip::Decoded)
                            .map_err(|second| both_failed(first, "FFmpeg", &second, "symphonia"))
                    }
                    Err(e) => Err(e),
                };
            }
            drop(file);
            let symphonia = guarded(&item, "audio", || symph::decode(input, &item, opts.window.as_ref(), &opts.limits));
            match symphonia {
                Ok(d) => Ok(Clip::Decoded(d)),
                #[cfg(feature = "ffmpeg")]
                Err(first @ (Error::UnknownFormat { .. } | Error::Decode { .. })) => {
                    match (ffmpeg_decode(input, &item, opts), first) {
                        (Ok(d), _) => Ok(Clip::Decoded(d)),
                        // Symphonia could not read the format at all: FFmpeg's error is the informative one.
                        (Err(e), first @ Error::UnknownFormat { .. }) => {
                            Err(both_failed(e, "FFmpeg", &first, "symphonia"))
                        }
                        (Err(e), first) => Err(both_failed(first, "symphonia", &e, "FFmpeg")),
                    }
                }
                Err(e) => Err(e),
            }
        }
        AudioBackend::Symphonia => {
            guarded(&item, "audio", || symph::decode(input, &item, opts.window.as_ref(), &opts.limits))
                .map(Clip::Decoded)
        }
        #[cfg(feature = "ffmpeg")]
        AudioBackend::Ffmpeg => ffmpeg_decode(input, &item, opts).map(Clip::Decoded),
        #[cfg(not(feature = "ffmpeg"))]
        AudioBackend::Ffmpeg => {
            Err(Error::InvalidOptions("AudioBackend::Ffmpeg needs spdl-io's `ffmpeg` feature".into()))
        }
    }
}

/// The output geometry of one clip.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    in_rate: u32,
    out_rate: u32,
    channels: usize,
    /// Frames the whole window yields at the output rate.
    natural: usize,
    /// Frames written (padded or truncated).
    out_frames: usize,
}

pub(crate) fn plan(clip: &Clip<'_>, opts: &AudioOptions, item: &str) -> Result<(Mapping, Plan)> {
    let source = clip.channels();
    let map = Mapping::resolve(&opts.channels, source).ok_or_else(|| {
        Error::InvalidOptions(format!("{item}: channels {:?} requested, the source has {source}", opts.channels))
    })?;
    let in_rate = clip.rate();
    let out_rate = opts.sample_rate.unwrap_or(in_rate);
    let natural =
        if in_rate == out_rate { clip.frames() } else { resample::output_len(clip.frames(), in_rate, out_rate) };
    let out_frames = opts.num_frames.unwrap_or(natural);
    let channels = map.out_channels();
    if in_rate != out_rate {
        let state = resample::state_bytes(in_rate, out_rate, channels);
        if state > opts.limits.max_resampler_bytes {
            return Err(Error::LimitExceeded {
                item: item.to_owned(),
                what: format!("resampler bytes ({in_rate} Hz to {out_rate} Hz)"),
                value: state,
                limit: opts.limits.max_resampler_bytes,
            });
        }
    }
    let samples = (out_frames as u64).saturating_mul(channels as u64);
    if samples > opts.limits.max_samples {
        return Err(Error::LimitExceeded {
            item: item.to_owned(),
            what: "output samples".into(),
            value: samples,
            limit: opts.limits.max_samples,
        });
    }
    Ok((map, Plan { in_rate, out_rate, channels, natural, out_frames }))
}

fn render_source<S: ClipSource, T: OutSample>(
    src: &S,
    planes: Option<&Planes>,
    map: &Mapping,
    plan: &Plan,
    layout: AudioLayout,
    dst: &mut [T],
    item: &str,
) -> Result<usize> {
    if plan.in_rate == plan.out_rate {
        return Ok(render::render(src, map, dst, plan.out_frames, layout));
    }
    // Mix/select first so that only the output channels are resampled; skip the copy when it is a no-op.
    let owned;
    let input = match planes {
        Some(p) if *map == Mapping::identity(src.channels()) => p,
        _ => {
            owned = map.to_planes(src);
            &owned
        }
    };
    let want = plan.natural.min(plan.out_frames);
    let resampled = guarded(item, "resample", || resample::resample(input, plan.in_rate, plan.out_rate, want, item))?;
    Ok(render::render(&resampled, &Mapping::identity(plan.channels), dst, plan.out_frames, layout))
}

/// Writes an opened clip into `dst` (exactly `plan.channels * plan.out_frames` elements).
pub(crate) fn render_clip<T: OutSample>(
    clip: &Clip<'_>,
    map: &Mapping,
    plan: &Plan,
    layout: AudioLayout,
    dst: &mut [T],
    item: &str,
) -> Result<usize> {
    match clip {
        Clip::Wav(w) => render_source(w, None, map, plan, layout, dst, item),
        Clip::Decoded(d) => render_source(&d.planes, Some(&d.planes), map, plan, layout, dst, item),
    }
}

fn shape(layout: AudioLayout, channels: usize, frames: usize) -> [usize; 2] {
    match layout {
        AudioLayout::ChannelsFirst => [channels, frames],
        AudioLayout::Interleaved => [frames, channels],
    }
}

/// Decodes one clip from a file or bytes into a new buffer from `allocator`.
///
/// Errors name the item: [`Error::Empty`], [`Error::UnknownFormat`] (no decoder reads it),
/// [`Error::Decode`] (corrupt), [`Error::LimitExceeded`], [`Error::Io`], [`Error::InvalidOptions`]
/// (e.g. a picked channel the file does not have).
pub fn decode_audio<'a>(
    input: impl Into<MediaInput<'a>>,
    opts: &AudioOptions,
    allocator: &SharedAllocator,
) -> Result<Audio> {
    opts.validate()?;
    let input = input.into();
    let item = input.name();
    let clip = open_clip(&input, opts)?;
    let (map, plan) = plan(&clip, opts, &item)?;
    let dims = shape(opts.layout, plan.channels, plan.out_frames);
    let layout = opts.layout.clip_layout();
    let (buffer, frames) = match opts.sample_type {
        SampleType::F32 => {
            let mut buf = Buffer::zeros(DType::F32, &dims, layout, allocator)?;
            let n = render_clip(&clip, &map, &plan, opts.layout, buf.as_mut_slice::<f32>()?, &item)?;
            (buf, n)
        }
        SampleType::I16 => {
            let mut buf = Buffer::zeros(DType::I16, &dims, layout, allocator)?;
            let n = render_clip(&clip, &map, &plan, opts.layout, buf.as_mut_slice::<i16>()?, &item)?;
            (buf, n)
        }
    };
    Ok(Audio { buffer, sample_rate: plan.out_rate, frames, start_s: clip.start_s(), source: clip.source_info() })
}
