//! `probe`: what a media file holds (streams, codecs, duration, size, rates) without decoding it, for every
//! medium: images by their magic bytes, then FFmpeg (feature `ffmpeg`), then symphonia (audio formats).

use serde::Serialize;
use symphonia::core::codecs::CodecParameters;

use crate::error::guarded;
use crate::input::MediaInput;
use crate::{Error, Result};

/// What kind of data a stream carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum StreamKind {
    /// Video frames.
    Video,
    /// Audio samples.
    Audio,
    /// A still image (the whole file is one picture).
    Image,
    /// Subtitles.
    Subtitle,
    /// Anything else (data, attachments, unknown).
    Other,
}

/// One stream of a media file. Fields that do not apply to the stream's kind, or that the container does
/// not state, are `None`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct StreamInfo {
    /// Position of the stream in the container.
    pub index: usize,
    /// Video, audio, image, ...
    pub kind: StreamKind,
    /// Codec short name (`"h264"`, `"aac"`, `"flac"`, `"jpeg"`, ...).
    pub codec: String,
    /// Duration in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// Start time in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_s: Option<f64>,
    /// Number of frames (video frames, or audio sample frames), as the container states it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_frames: Option<u64>,
    /// Bits per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bit_rate: Option<u64>,
    /// Width in pixels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    /// Height in pixels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
    /// Average frame rate in frames per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame_rate: Option<f64>,
    /// Pixel format (`"yuv420p"`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pixel_format: Option<String>,
    /// Sample rate in Hz.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample_rate: Option<u32>,
    /// Audio channels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels: Option<u32>,
    /// Sample format (`"fltp"`, `"s16"`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample_format: Option<String>,
}

impl StreamInfo {
    /// A stream with only its index, kind and codec known.
    pub fn new(index: usize, kind: StreamKind, codec: impl Into<String>) -> StreamInfo {
        StreamInfo {
            index,
            kind,
            codec: codec.into(),
            duration_s: None,
            start_s: None,
            num_frames: None,
            bit_rate: None,
            width: None,
            height: None,
            frame_rate: None,
            pixel_format: None,
            sample_rate: None,
            channels: None,
            sample_format: None,
        }
    }
}

/// What [`probe`] found in a media file.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct MediaInfo {
    /// The item (path or name).
    pub item: String,
    /// Container short name (`"mov,mp4,m4a,3gp,3g2,mj2"`, `"wav"`, `"ogg"`, `"png"`, ...).
    pub format: String,
    /// Which reader answered: `"ffmpeg"`, `"symphonia"` or `"image"`.
    pub prober: String,
    /// Size of the input in bytes.
    pub size_bytes: u64,
    /// Duration in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// Overall bits per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bit_rate: Option<u64>,
    /// The streams, in container order.
    pub streams: Vec<StreamInfo>,
}

/// Reads the headers of a media file (a path or bytes) and describes its streams, without decoding.
///
/// Images are recognised from their magic bytes (feature `image`); everything else goes through FFmpeg
/// when the `ffmpeg` feature is on, and through symphonia otherwise (audio formats only).
///
/// ```
/// use spdl_io::audio::encode_wav_i16;
/// use spdl_io::{MediaInput, StreamKind, probe};
///
/// let wav = encode_wav_i16(&[0; 16000], 2, 16000); // 0.5 s of stereo silence
/// let info = probe(MediaInput::bytes(&wav, "a.wav"))?;
/// assert_eq!(info.streams.len(), 1);
/// let s = &info.streams[0];
/// assert_eq!((s.kind, s.sample_rate, s.channels), (StreamKind::Audio, Some(16000), Some(2)));
/// assert_eq!(s.duration_s, Some(0.5));
/// # Ok::<(), spdl_io::Error>(())
/// ```
pub fn probe<'a>(input: impl Into<MediaInput<'a>>) -> Result<MediaInfo> {
    let input = input.into();
    let item = input.name().into_owned();
    input.check_not_empty()?;
    let size_bytes = input.len()?;
    #[cfg(feature = "image")]
    if let Some(info) = probe_image(&input, &item, size_bytes)? {
        return Ok(info);
    }
    #[cfg(feature = "ffmpeg")]
    {
        let found = crate::media::backend()
            .and_then(|backend| guarded(&item, "ffmpeg", || backend.probe(&input, &item, size_bytes)));
        match found {
            Ok(info) => return Ok(info),
            // Not a container FFmpeg reads, or no FFmpeg on this machine: symphonia may still read it.
            Err(Error::UnknownFormat { .. } | Error::Unavailable { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    guarded(&item, "audio", || probe_symphonia(&input, &item, size_bytes))
}

#[cfg(feature = "image")]
fn probe_image(input: &MediaInput<'_>, item: &str, size_bytes: u64) -> Result<Option<MediaInfo>> {
    use crate::image::{ImageFormat, image_info};
    let head = input.read_at(None, 0, 16)?;
    if ImageFormat::detect(&head).is_none() {
        return Ok(None);
    }
    let bytes = input.read_at(None, 0, usize::try_from(size_bytes).unwrap_or(usize::MAX))?;
    let info = image_info(&bytes, item)?;
    let mut stream = StreamInfo::new(0, StreamKind::Image, info.format.name());
    stream.width = Some(info.width);
    stream.height = Some(info.height);
    stream.num_frames = Some(1);
    Ok(Some(MediaInfo {
        item: item.to_owned(),
        format: info.format.name().to_owned(),
        prober: "image".into(),
        size_bytes,
        duration_s: None,
        bit_rate: None,
        streams: vec![stream],
    }))
}

fn probe_symphonia(input: &MediaInput<'_>, item: &str, size_bytes: u64) -> Result<MediaInfo> {
    let reader = crate::audio::symphonia_reader(input, item)?;
    let codecs = symphonia::default::get_codecs();
    let mut streams = Vec::new();
    for (index, track) in reader.tracks().iter().enumerate() {
        let seconds =
            |frames: u64| track.time_base.and_then(|tb| tb.calc_duration(frames.into())).map(|t| t.as_secs_f64());
        let mut s = match &track.codec_params {
            Some(CodecParameters::Audio(p)) => {
                let codec = codecs
                    .get_audio_decoder(p.codec)
                    .map_or_else(|| p.codec.to_string(), |r| r.codec.info.short_name.to_owned());
                let mut s = StreamInfo::new(index, StreamKind::Audio, codec);
                s.sample_rate = p.sample_rate;
                s.channels = p.channels.as_ref().and_then(|c| u32::try_from(c.count()).ok());
                s.sample_format = p.sample_format.map(|f| format!("{f:?}").to_lowercase());
                s
            }
            Some(CodecParameters::Video(p)) => StreamInfo::new(index, StreamKind::Video, p.codec.to_string()),
            Some(CodecParameters::Subtitle(p)) => StreamInfo::new(index, StreamKind::Subtitle, p.codec.to_string()),
            _ => StreamInfo::new(index, StreamKind::Other, "unknown"),
        };
        s.num_frames = track.num_frames;
        s.duration_s = track.duration.and_then(|d| seconds(d.get())).or_else(|| {
            let frames = track.num_frames?;
            let rate = s.sample_rate?;
            Some(frames as f64 / f64::from(rate))
        });
        s.start_s = track.time_base.and_then(|tb| tb.calc_time(track.start_ts)).map(|t| t.as_secs_f64());
        streams.push(s);
    }
    if streams.is_empty() {
        return Err(Error::UnknownFormat { item: item.to_owned(), detail: "no streams".into() });
    }
    let duration_s = streams.iter().filter_map(|s| s.duration_s).reduce(f64::max);
    Ok(MediaInfo {
        item: item.to_owned(),
        format: reader.format_info().short_name.to_owned(),
        prober: "symphonia".into(),
        size_bytes,
        duration_s,
        bit_rate: None,
        streams,
    })
}
