//! `probe`: what a media file holds (streams, codecs, duration, size, rates) without decoding it, for every
//! medium: images by their magic bytes, then FFmpeg (feature `ffmpeg`), then symphonia (audio formats).

use std::io::Cursor;

use symphonia::core::codecs::CodecParameters;
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, FormatReader};
use symphonia::core::io::{MediaSource, MediaSourceStream};
use symphonia::core::meta::MetadataOptions;

use crate::error::guarded;
use crate::input::MediaInput;
pub use crate::types::probe::{MediaInfo, StreamInfo, StreamKind};
use crate::{Error, Result};

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
    let reader = symphonia_reader(input, item)?;
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

/// Opens `input` with symphonia's container readers (the audio decoder's, and [`probe`]'s without FFmpeg).
pub(crate) fn symphonia_reader<'a>(input: &MediaInput<'a>, item: &str) -> Result<Box<dyn FormatReader + 'a>> {
    let source: Box<dyn MediaSource + 'a> = match *input {
        MediaInput::Path(p) => Box::new(MediaInput::open_file(p)?) as Box<dyn MediaSource>,
        MediaInput::Bytes { data, .. } => Box::new(Cursor::new(data)),
    };
    let mss = MediaSourceStream::new(source, Default::default());
    let mut hint = Hint::new();
    if let Some(ext) = input.extension() {
        hint.with_extension(ext);
    }
    symphonia::default::get_probe().probe(&hint, mss, FormatOptions::default(), MetadataOptions::default()).map_err(
        |e| match e {
            SymError::Unsupported(what) => {
                Error::UnknownFormat { item: item.to_owned(), detail: format!("symphonia: {what}") }
            }
            other => Error::Decode { item: item.to_owned(), format: "audio container".into(), cause: Box::new(other) },
        },
    )
}
