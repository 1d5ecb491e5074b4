//! Demuxing: the packets of a video stream that a time window needs, owned and `Send`, so demuxing (I/O
//! bound) and decoding (CPU bound) can run as separate pipeline stages.

use ffmpeg_next as ff;

use super::avio::{ff_error, open_input, rational, seconds_ts, seek_before, ts_seconds};
use crate::input::MediaInput;
use crate::video::{DemuxOptions, VideoLimits};
use crate::{Error, Result};

/// The packets of one video stream, from the keyframe before the window to the window's end, with what is
/// needed to decode them. Owned and `Send`: hand it to another thread (or pipeline stage) for
/// [`crate::video::decode_packets`].
pub struct Packets {
    pub(crate) item: String,
    pub(crate) params: ff::codec::Parameters,
    pub(crate) time_base: ff::Rational,
    pub(crate) packets: Vec<ff::Packet>,
    /// Window in stream time base units, `[start, end)`.
    pub(crate) window: (i64, i64),
    pub(crate) frame_rate: Option<f64>,
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) codec: String,
    pub(crate) limits: VideoLimits,
}

impl std::fmt::Debug for Packets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packets")
            .field("item", &self.item)
            .field("codec", &self.codec)
            .field("width", &self.width)
            .field("height", &self.height)
            .field("frame_rate", &self.frame_rate)
            .field("packets", &self.packets.len())
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl Packets {
    /// The item (path or name) they came from.
    pub fn item(&self) -> &str {
        &self.item
    }

    /// Codec short name (`"h264"`, `"vp9"`, `"mpeg4"`, ...).
    pub fn codec(&self) -> &str {
        &self.codec
    }

    /// Coded width in pixels.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Coded height in pixels.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// Average frame rate, if the container states it.
    pub fn frame_rate(&self) -> Option<f64> {
        self.frame_rate
    }

    /// Number of packets kept (including those before the window that decoding needs).
    pub fn len(&self) -> usize {
        self.packets.len()
    }

    /// True if no packet was kept.
    pub fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }

    /// Bytes of packet data kept.
    pub fn bytes(&self) -> usize {
        self.packets.iter().map(|p| p.size()).sum()
    }

    /// Presentation timestamps (seconds) of the packets inside the window, in presentation order: the
    /// frames a full decode of the window yields.
    pub fn timestamps(&self) -> Vec<f64> {
        self.window_pts().into_iter().map(|t| ts_seconds(t, self.time_base)).collect()
    }

    /// Presentation timestamps (stream units) of the packets in the window, sorted and deduplicated.
    pub(crate) fn window_pts(&self) -> Vec<i64> {
        let mut pts: Vec<i64> = self
            .packets
            .iter()
            .filter_map(|p| p.pts().or(p.dts()))
            .filter(|&t| t >= self.window.0 && t < self.window.1)
            .collect();
        pts.sort_unstable();
        pts.dedup();
        pts
    }
}

/// Reads the packets of the best video stream of `input` that `opts.window` needs.
///
/// Errors: [`Error::UnknownFormat`] (no demuxer recognises it, no video stream), [`Error::Decode`]
/// (corrupt container, e.g. an MP4 without its `moov` atom), [`Error::LimitExceeded`], [`Error::Io`].
pub fn demux_video<'a>(input: impl Into<MediaInput<'a>>, opts: &DemuxOptions) -> Result<Packets> {
    let input = input.into();
    let item = input.name().into_owned();
    if let Some(w) = &opts.window {
        w.validate()?;
    }
    let limits = opts.limits;
    let mut ictx = open_input(&input, &item)?;
    let (index, time_base, params, frame_rate) = {
        let stream = ictx
            .streams()
            .best(ff::media::Type::Video)
            .ok_or_else(|| Error::UnknownFormat { item: item.clone(), detail: "no video stream".into() })?;
        let fr = rational(stream.avg_frame_rate()).or_else(|| rational(stream.rate()));
        // A clone owns its AVCodecParameters: it does not keep the demuxer (and its I/O) alive.
        (stream.index(), stream.time_base(), stream.parameters().clone(), fr)
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
    let codec = params.id().name().to_owned();
    let window = match &opts.window {
        None => (i64::MIN, i64::MAX),
        Some(w) => (seconds_ts(w.start_s, time_base), w.end_s().map_or(i64::MAX, |e| seconds_ts(e, time_base))),
    };
    if let Some(w) = opts.window.filter(|w| w.start_s > 0.0)
        && !seek_before(&mut ictx, w.start_s)
    {
        // The demuxer may be left mid-stream by a failed seek: start over and read from the beginning.
        drop(ictx);
        ictx = open_input(&input, &item)?;
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
        packets.push(packet);
    }
    if packets.is_empty() {
        // Even a window past the end keeps the packets from the last keyframe on: no packet at all means
        // the stream's index or data is damaged (or the stream is empty).
        return Err(Error::Decode { item, format: codec, cause: "the video stream has no readable packets".into() });
    }
    Ok(Packets { item, params, time_base, packets, window, frame_rate, width, height, codec, limits })
}
