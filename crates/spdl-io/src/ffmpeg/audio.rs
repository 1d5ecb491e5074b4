//! Audio decoding with libavcodec, for what symphonia cannot read (the audio track of an MP4/MKV video with another
//! codec, Opus, AC-3, ...): same window semantics and planar `f32` scratch as the symphonia path, so the
//! rest of the audio API (resampling, mixing, batching) is shared.

use ffmpeg_next as ff;

use super::avio::{ff_error, open_input, seek_before};
use crate::input::{MediaInput, TimeWindow};
use crate::types::audio::{AudioLimits, Decoded, WindowCollector, check_channels, check_rate};
use crate::{Error, Result};

/// Bytes per sample of an FFmpeg sample format (`None`: the frame states none).
fn sample_bytes(format: ff::format::Sample) -> Option<usize> {
    use ff::format::Sample as S;
    Some(match format {
        S::U8(_) => 1,
        S::I16(_) => 2,
        S::I32(_) | S::F32(_) => 4,
        S::I64(_) | S::F64(_) => 8,
        S::None => return None,
    })
}

/// Appends `count` samples of `format` (native-endian), one every `step` bytes of `src`, to `dst` as
/// `f32` in [-1, 1]. Each format gets its own loop (no call per sample): this runs once per decoded sample.
fn push_samples(format: ff::format::Sample, dst: &mut Vec<f32>, src: &[u8], step: usize, count: usize) {
    use ff::format::Sample as S;
    fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
        b.get(..N).and_then(|s| s.try_into().ok()).unwrap_or([0; N])
    }
    fn push<const N: usize>(dst: &mut Vec<f32>, src: &[u8], step: usize, count: usize, conv: impl Fn([u8; N]) -> f32) {
        if step == N {
            dst.extend(src.chunks_exact(N).take(count).map(|s| conv(arr(s))));
        } else {
            dst.extend(src.chunks(step).take(count).map(|s| conv(arr(s))));
        }
    }
    match format {
        S::U8(_) => push(dst, src, step, count, |[x]: [u8; 1]| (f32::from(x) - 128.0) / 128.0),
        S::I16(_) => push(dst, src, step, count, |b| f32::from(i16::from_ne_bytes(b)) / 32768.0),
        S::I32(_) => push(dst, src, step, count, |b| i32::from_ne_bytes(b) as f32 / 2_147_483_648.0),
        S::I64(_) => {
            push(dst, src, step, count, |b| (i64::from_ne_bytes(b) as f64 / 9_223_372_036_854_775_808.0) as f32)
        }
        S::F32(_) => push(dst, src, step, count, f32::from_ne_bytes),
        S::F64(_) => push(dst, src, step, count, |b| f64::from_ne_bytes(b) as f32),
        S::None => {}
    }
}

/// Decodes the best audio stream of `input` (the `window` of it) into planar `f32` scratch.
pub(crate) fn decode_audio_track(
    input: &MediaInput<'_>,
    item: &str,
    window: Option<&TimeWindow>,
    limits: &AudioLimits,
) -> Result<Decoded> {
    let mut ictx = open_input(input, item)?;
    let container = ictx.format().name().to_owned();
    let (index, time_base, params) = {
        let stream = ictx.streams().best(ff::media::Type::Audio).ok_or_else(|| Error::UnknownFormat {
            item: item.to_owned(),
            detail: format!("{container}: no audio stream"),
        })?;
        (stream.index(), stream.time_base(), stream.parameters().clone())
    };
    let codec = params.id().name().to_owned();
    let mut ctx = ff::codec::Context::from_parameters(params).map_err(|e| ff_error(item, &codec, e))?;
    ctx.set_threading(ff::threading::Config { kind: ff::threading::Type::None, count: 1, ..Default::default() });
    let mut opened = ctx.decoder();
    opened.set_packet_time_base(time_base);
    let mut decoder = opened.audio().map_err(|e| match e {
        ff::Error::DecoderNotFound => {
            Error::UnknownFormat { item: item.to_owned(), detail: format!("ffmpeg has no decoder for {codec}") }
        }
        other => ff_error(item, &codec, other),
    })?;
    if let Some(w) = window.filter(|w| w.start_s > 0.0)
        && !seek_before(&mut ictx, w.start_s)
    {
        drop(ictx);
        ictx = open_input(input, item)?;
    }

    // The container's stated duration (in AV_TIME_BASE units), to size the output once.
    let duration_s = (ictx.duration() > 0).then(|| ictx.duration() as f64 / f64::from(ff::ffi::AV_TIME_BASE));
    let mut state = State { collector: None, pos: None, item, window, limits, codec: &codec, duration_s };
    let mut frame = ff::frame::Audio::empty();
    let (mut read, mut bad) = (0u64, 0u32);
    let mut ended = false;
    'packets: loop {
        let mut packet = ff::Packet::empty();
        match packet.read(&mut ictx) {
            Ok(()) => {}
            Err(ff::Error::Eof) => break,
            Err(e @ ff::Error::InvalidData) => {
                bad += 1;
                if bad > limits.max_bad_packets {
                    return Err(ff_error(item, &container, e));
                }
                continue;
            }
            Err(_) if state.collector.is_some() => break,
            Err(e) => return Err(ff_error(item, &container, e)),
        }
        read += 1;
        if read > limits.max_packets {
            return Err(Error::LimitExceeded {
                item: item.to_owned(),
                what: "packets".into(),
                value: read,
                limit: limits.max_packets,
            });
        }
        if packet.stream() != index {
            continue;
        }
        if let Err(e) = decoder.send_packet(&packet) {
            bad += 1;
            state.pos = None;
            if bad > limits.max_bad_packets {
                return Err(ff_error(item, &codec, e));
            }
            continue;
        }
        bad = 0;
        while decoder.receive_frame(&mut frame).is_ok() {
            if state.on_frame(&frame, time_base)? {
                ended = true;
                break 'packets;
            }
        }
    }
    if !ended && decoder.send_eof().is_ok() {
        while decoder.receive_frame(&mut frame).is_ok() {
            if state.on_frame(&frame, time_base)? {
                break;
            }
        }
    }
    match state.collector {
        Some(c) => Ok(c.finish(&codec, &container)),
        None => Err(Error::Decode { item: item.to_owned(), format: codec, cause: "no audio frame decoded".into() }),
    }
}

struct State<'a> {
    collector: Option<WindowCollector>,
    /// Frame index (at the stream's rate) where the next decoded frame starts.
    pos: Option<i64>,
    item: &'a str,
    window: Option<&'a TimeWindow>,
    limits: &'a AudioLimits,
    codec: &'a str,
    /// The container's stated duration, if any.
    duration_s: Option<f64>,
}

impl State<'_> {
    /// Keeps the part of `frame` inside the window; `true` once past the window's end.
    fn on_frame(&mut self, frame: &ff::frame::Audio, time_base: ff::Rational) -> Result<bool> {
        let item = self.item;
        let rate = frame.rate();
        let channels = usize::from(frame.channels());
        let n = frame.samples();
        let col = match &mut self.collector {
            Some(c) => c,
            None => {
                check_rate(item, rate, self.limits)?;
                check_channels(item, channels, self.limits)?;
                let col = self.collector.insert(WindowCollector::new(item, channels, rate, self.window, self.limits));
                if let Some(d) = self.duration_s {
                    col.reserve((d * f64::from(rate)) as u64);
                }
                col
            }
        };
        if rate != col.rate() || channels != col.channels() {
            return Err(Error::Decode {
                item: item.to_owned(),
                format: self.codec.to_owned(),
                cause: format!(
                    "stream changed from {} channels at {} Hz to {channels} channels at {rate} Hz",
                    col.channels(),
                    col.rate()
                )
                .into(),
            });
        }
        let start = match (self.pos, frame.timestamp().or(frame.pts())) {
            (Some(p), _) => p,
            (None, Some(ts)) => {
                let num = i128::from(ts) * i128::from(time_base.numerator()) * i128::from(rate);
                let den = i128::from(time_base.denominator()).max(1);
                i64::try_from(num.div_euclid(den)).unwrap_or(0)
            }
            (None, None) => 0,
        };
        self.pos = Some(start.saturating_add(n as i64));
        let Some((a, b)) = col.overlap(start, n) else {
            return Ok(col.done(start));
        };
        let format = frame.format();
        let Some(bps) = sample_bytes(format) else {
            return Err(Error::Decode {
                item: item.to_owned(),
                format: self.codec.to_owned(),
                cause: "decoder gave frames without a sample format".into(),
            });
        };
        let planar = frame.is_planar();
        if frame.planes() < if planar { channels } else { 1 } {
            return Err(Error::Decode {
                item: item.to_owned(),
                format: self.codec.to_owned(),
                cause: "frame without data".into(),
            });
        }
        col.append(start + a as i64, b - a, |c, dst| {
            let (plane, step, first) = if planar {
                (frame.data(c), bps, a * bps)
            } else {
                (frame.data(0), bps * channels, (a * channels + c) * bps)
            };
            push_samples(format, dst, plane.get(first..).unwrap_or_default(), step, b - a);
        })?;
        Ok(col.done(start.saturating_add(n as i64)))
    }
}
