//! Demuxing: the packets of a video stream that a time window needs, owned and `Send`, so demuxing (I/O
//! bound) and decoding (CPU bound) can run as separate pipeline stages.

use ffmpeg_next as ff;

use super::avio::{ff_error, open_input, rational, seconds_ts, seek_before};
use super::media::{Params, codec_from_params, frac, wrap_packet};
use crate::input::MediaInput;
use crate::types::media::{MediaType, Packets};
use crate::types::video::DemuxOptions;
use crate::{Error, Result};

/// Reads the packets of the best video stream of `input` that `opts.window` needs.
///
/// Errors: [`Error::UnknownFormat`] (no demuxer recognises it, no video stream), [`Error::Decode`]
/// (corrupt container, e.g. an MP4 without its `moov` atom), [`Error::LimitExceeded`], [`Error::Io`].
pub(crate) fn demux_video(input: &MediaInput<'_>, opts: &DemuxOptions) -> Result<Packets> {
    let item = input.name().into_owned();
    if let Some(w) = &opts.window {
        w.validate()?;
    }
    let limits = opts.limits;
    let mut ictx = open_input(input, &item)?;
    let (index, time_base, params, frame_rate, rate) = {
        let stream = ictx
            .streams()
            .best(ff::media::Type::Video)
            .ok_or_else(|| Error::UnknownFormat { item: item.clone(), detail: "no video stream".into() })?;
        let avg = stream.avg_frame_rate();
        let rate = if rational(avg).is_some() { avg } else { stream.rate() };
        // A clone owns its AVCodecParameters: it does not keep the demuxer (and its I/O) alive.
        (stream.index(), stream.time_base(), stream.parameters().clone(), rational(rate), rate)
    };
    // SAFETY: `params` owns a valid AVCodecParameters (allocated and filled by the clone above).
    let (width, height) = unsafe {
        let p = params.as_ptr();
        (u32::try_from((*p).width).unwrap_or(0), u32::try_from((*p).height).unwrap_or(0))
    };
    let pixels = u64::from(width) * u64::from(height);
    if pixels > limits.max_pixels {
        return Err(Error::LimitExceeded {
            item,
            what: "pixels per frame".into(),
            value: pixels,
            limit: limits.max_pixels,
        });
    }
    let codec_name = params.id().name().to_owned();
    let window = match &opts.window {
        None => (i64::MIN, i64::MAX),
        Some(w) => (seconds_ts(w.start_s, time_base), w.end_s().map_or(i64::MAX, |e| seconds_ts(e, time_base))),
    };
    if let Some(w) = opts.window.filter(|w| w.start_s > 0.0)
        && !seek_before(&mut ictx, w.start_s)
    {
        // The demuxer may be left mid-stream by a failed seek: start over and read from the beginning.
        drop(ictx);
        ictx = open_input(input, &item)?;
    }

    let mut packets = Vec::new();
    let (mut read, mut bytes, mut bad) = (0u64, 0u64, 0u32);
    loop {
        let mut packet = ff::Packet::empty();
        match packet.read(&mut ictx) {
            Ok(()) => bad = 0,
            Err(ff::Error::Eof) => break,
            Err(e @ ff::Error::InvalidData) => {
                bad += 1;
                if bad > limits.max_bad_packets {
                    return Err(ff_error(&item, "container", e));
                }
                continue;
            }
            // A cut file ends with an I/O error on most demuxers: keep what was read.
            Err(_) if !packets.is_empty() => break,
            Err(e) => return Err(ff_error(&item, "container", e)),
        }
        read += 1;
        if read > limits.max_packets {
            return Err(Error::LimitExceeded { item, what: "packets".into(), value: read, limit: limits.max_packets });
        }
        if packet.stream() != index {
            continue;
        }
        // Decode order: once a decode timestamp reaches the window's end, every later packet's
        // presentation timestamp does too.
        if packet.dts().or(packet.pts()).is_some_and(|t| t >= window.1) {
            break;
        }
        bytes += packet.size() as u64;
        if bytes > limits.max_packet_bytes {
            return Err(Error::LimitExceeded {
                item,
                what: "packet bytes".into(),
                value: bytes,
                limit: limits.max_packet_bytes,
            });
        }
        packets.push(wrap_packet(packet));
    }
    if packets.is_empty() {
        // Even a window past the end keeps the packets from the last keyframe on: no packet at all means
        // the stream's index or data is damaged (or the stream is empty).
        return Err(Error::Decode {
            item,
            format: codec_name,
            cause: "the video stream has no readable packets".into(),
        });
    }
    let codec = codec_from_params(Params(params), MediaType::Video, frac(time_base), frac(rate));
    Ok(Packets { item, codec, packets, window, frame_rate, width, height, limits })
}
