//! Decoding through symphonia (pure Rust): WAV, FLAC, MP3, Ogg Vorbis, AAC (ADTS and MP4/M4A), MKV/WebM
//! audio tracks of those codecs.

use symphonia::core::codecs::CodecParameters;
use symphonia::core::codecs::audio::AudioDecoderOptions;
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::{SeekMode, SeekTo, TrackType};
use symphonia::core::units::{Time, TimeBase};

use crate::input::MediaInput;
use crate::input::TimeWindow;
use crate::probe::symphonia_reader;
use crate::types::audio::{AudioLimits, Decoded, WindowCollector, check_channels, check_rate};
use crate::{Error, Result};

fn decode_error(item: &str, format: &str, cause: SymError) -> Error {
    Error::Decode { item: item.to_owned(), format: format.to_owned(), cause: Box::new(cause) }
}

/// Converts a track timestamp to a frame index at `rate`.
fn ts_to_frames(ts: i64, tb: Option<TimeBase>, rate: u32) -> i64 {
    match tb {
        Some(tb) => {
            let num = i128::from(ts) * i128::from(tb.numer.get()) * i128::from(rate);
            let den = i128::from(tb.denom.get());
            i64::try_from(num.div_euclid(den)).unwrap_or(if ts < 0 { i64::MIN } else { i64::MAX })
        }
        None => ts,
    }
}

/// A channel count that two sources disagree on (the container and the decoder, or two readings of the
/// header).
fn channels_differ(item: &str, codec: &str, first: &str, a: usize, second: &str, b: usize) -> Error {
    Error::Decode {
        item: item.to_owned(),
        format: codec.to_owned(),
        cause: format!("{first} {a} channels, {second} {b}: the samples would be scrambled").into(),
    }
}

/// Decodes the default audio track of `input` (the `window` of it) into planar `f32` scratch.
pub(crate) fn decode(
    input: &MediaInput<'_>,
    item: &str,
    window: Option<&TimeWindow>,
    limits: &AudioLimits,
) -> Result<Decoded> {
    // The container's own statement of the channel count, where symphonia may read another (WAV).
    let stated_channels = super::wav::stated_channels(input, item, limits)?;
    let mut reader = symphonia_reader(input, item)?;
    let container = reader.format_info().short_name.to_owned();
    let track = reader.default_track(TrackType::Audio).ok_or_else(|| Error::UnknownFormat {
        item: item.to_owned(),
        detail: format!("{container}: no audio track symphonia can decode"),
    })?;
    let track_id = track.id;
    let time_base = track.time_base;
    let stated_frames = track.num_frames;
    let Some(CodecParameters::Audio(params)) = track.codec_params.clone() else {
        return Err(Error::UnknownFormat {
            item: item.to_owned(),
            detail: format!("{container}: no audio codec parameters"),
        });
    };
    let codecs = symphonia::default::get_codecs();
    let codec = codecs.get_audio_decoder(params.codec).map(|r| r.codec.info.short_name).ok_or_else(|| {
        Error::UnknownFormat {
            item: item.to_owned(),
            detail: format!("{container}: audio codec {} not supported", params.codec),
        }
    })?;
    let mut decoder = codecs.make_audio_decoder(&params, &AudioDecoderOptions::default()).map_err(|e| match e {
        SymError::Unsupported(what) => {
            Error::UnknownFormat { item: item.to_owned(), detail: format!("{container}/{codec}: {what}") }
        }
        other => decode_error(item, codec, other),
    })?;
    let declared_rate = params.sample_rate;
    let declared_channels = params.channels.as_ref().map(|c| c.count());
    if let Some(c) = declared_channels {
        check_channels(item, c, limits)?;
    }
    if let (Some(stated), Some(read)) = (stated_channels, declared_channels)
        && stated != read
    {
        return Err(channels_differ(item, codec, "the WAV header states", stated, "symphonia reads", read));
    }
    if let Some(r) = declared_rate {
        check_rate(item, r, limits)?;
    }

    // MP4/M4A: the encoder's priming frames, which the edit list says to skip (FFmpeg does; symphonia's reader
    // does not). Positions below are shifted by it, so frame 0 is the first real sample.
    let delay = match (container.as_str(), declared_rate) {
        ("isomp4", Some(r)) => super::mp4::priming_frames(input, r).map_or(0, |f| f as i64),
        _ => 0,
    };

    // Seek to the window (the reader lands on a packet at or before it); on failure decode from the start.
    if let Some(w) = window.filter(|w| w.start_s > 0.0)
        && let Some(time) =
            Time::try_from_secs_f64(w.start_s + delay as f64 / f64::from(declared_rate.unwrap_or(1).max(1)))
    {
        match reader.seek(SeekMode::Accurate, SeekTo::Time { time, track_id: Some(track_id) }) {
            Ok(_) => decoder.reset(),
            Err(_) => {
                // Some readers leave their state undefined after a failed seek: start over.
                drop(reader);
                reader = symphonia_reader(input, item)?;
            }
        }
    }

    let mut collector: Option<WindowCollector> = None;
    let mut pos: Option<i64> = None;
    let mut packets: u64 = 0;
    let mut bad: u32 = 0;
    let mut last_error: Option<SymError> = None;
    loop {
        let packet = match reader.next_packet() {
            Ok(Some(p)) => p,
            Ok(None) | Err(SymError::ResetRequired) => break,
            // A cut file ends with an unexpected EOF: keep what was decoded.
            Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(decode_error(item, &container, e)),
        };
        packets += 1;
        if packets > limits.max_packets {
            return Err(Error::LimitExceeded {
                item: item.to_owned(),
                what: "packets".into(),
                value: packets,
                limit: limits.max_packets,
            });
        }
        if packet.track_id != track_id {
            continue;
        }
        let first_ts = packet.pts.get().saturating_add(i64::try_from(packet.trim_start.get()).unwrap_or(0));
        let buf = match decoder.decode(&packet) {
            Ok(buf) => buf,
            Err(e @ (SymError::DecodeError(_) | SymError::IoError(_))) => {
                // A damaged packet: skip it, resynchronise on the next packet's timestamp.
                bad += 1;
                pos = None;
                if bad > limits.max_bad_packets {
                    return Err(decode_error(item, codec, e));
                }
                last_error = Some(e);
                continue;
            }
            Err(e) => return Err(decode_error(item, codec, e)),
        };
        bad = 0;
        let spec = buf.spec();
        let rate = spec.rate();
        let channels = buf.num_planes();
        let n = buf.frames();
        let col = match &mut collector {
            Some(c) => c,
            None => {
                check_rate(item, rate, limits)?;
                check_channels(item, channels, limits)?;
                // Samples laid out for one count and read as another come out scrambled: never silently.
                if let Some(stated) = declared_channels.or(stated_channels)
                    && stated != channels
                {
                    return Err(channels_differ(
                        item,
                        codec,
                        "the container states",
                        stated,
                        "the decoder gives",
                        channels,
                    ));
                }
                let c = collector.insert(WindowCollector::new(item, channels, rate, window, limits));
                if delay > 0 {
                    c.drop_before(0);
                }
                // The header's length: the planes then grow without being moved (a copy per doubling).
                c.reserve(stated_frames.unwrap_or(0));
                c
            }
        };
        if rate != col.rate() || channels != col.channels() {
            return Err(Error::Decode {
                item: item.to_owned(),
                format: codec.to_owned(),
                cause: format!(
                    "stream changed from {} channels at {} Hz to {channels} channels at {rate} Hz",
                    col.channels(),
                    col.rate()
                )
                .into(),
            });
        }
        let start = pos.unwrap_or_else(|| ts_to_frames(first_ts, time_base, rate).saturating_sub(delay));
        // A packet that yields nothing (the first Vorbis packet after a seek only primes the overlap) says
        // nothing about where the next one starts: take that from its own timestamp.
        pos = (n > 0).then(|| start.saturating_add(n as i64));
        let Some((a, b)) = col.overlap(start, n) else {
            if col.done(start) {
                break;
            }
            continue;
        };
        let mut tails = col.extend(start + a as i64, b - a)?;
        buf.slice(a..b).copy_to_slice_planar::<f32, _>(&mut tails);
        if col.done(start.saturating_add(n as i64)) {
            break;
        }
    }
    match collector {
        Some(c) => Ok(c.finish(codec, &container)),
        None => match last_error {
            Some(e) => Err(decode_error(item, codec, e)),
            // No packet in the window: an empty stream, or a window past the end.
            None => match (declared_channels, declared_rate) {
                (Some(c), Some(r)) => Ok(Decoded::empty(c, r, window.map_or(0.0, |w| w.start_s), codec, &container)),
                _ => Err(Error::Decode {
                    item: item.to_owned(),
                    format: codec.to_owned(),
                    cause: "no audio packet, and the header gives no channel count or sample rate".into(),
                }),
            },
        },
    }
}
