//! `probe` through FFmpeg: every stream of any container FFmpeg reads.

use ffmpeg_next as ff;

use super::avio::{ff_error, open_input, rational, ts_seconds};
use crate::Result;
use crate::input::MediaInput;
use crate::types::probe::{MediaInfo, StreamInfo, StreamKind};

pub(crate) fn probe_ffmpeg(input: &MediaInput<'_>, item: &str, size_bytes: u64) -> Result<MediaInfo> {
    let ictx = open_input(input, item)?;
    let mut streams = Vec::new();
    for stream in ictx.streams() {
        let params = stream.parameters();
        let codec = params.id().name().to_owned();
        let kind = match params.medium() {
            ff::media::Type::Video if stream.disposition().contains(ff::format::stream::Disposition::ATTACHED_PIC) => {
                StreamKind::Image
            }
            ff::media::Type::Video => StreamKind::Video,
            ff::media::Type::Audio => StreamKind::Audio,
            ff::media::Type::Subtitle => StreamKind::Subtitle,
            _ => StreamKind::Other,
        };
        let mut s = StreamInfo::new(stream.index(), kind, codec);
        let tb = stream.time_base();
        s.duration_s = (stream.duration() > 0).then(|| ts_seconds(stream.duration(), tb));
        s.start_s = (stream.start_time() != ff::ffi::AV_NOPTS_VALUE).then(|| ts_seconds(stream.start_time(), tb));
        s.num_frames = u64::try_from(stream.frames()).ok().filter(|&n| n > 0);
        // The typed pixel/sample format lives in a codec context; filling one from the parameters opens no
        // decoder.
        let ctx = ff::codec::Context::from_parameters(params).map_err(|e| ff_error(item, "codec parameters", e))?;
        // SAFETY: `ctx` owns a valid AVCodecContext, filled from the stream's parameters above; only plain
        // fields are read.
        let (bit_rate, width, height, sample_rate, channels, pix_fmt, sample_fmt) = unsafe {
            let c = ctx.as_ptr();
            (
                (*c).bit_rate,
                (*c).width,
                (*c).height,
                (*c).sample_rate,
                (*c).ch_layout.nb_channels,
                ff::format::Pixel::from((*c).pix_fmt),
                ff::format::Sample::from((*c).sample_fmt),
            )
        };
        s.bit_rate = u64::try_from(bit_rate).ok().filter(|&b| b > 0);
        match kind {
            StreamKind::Video | StreamKind::Image => {
                s.width = u32::try_from(width).ok().filter(|&w| w > 0);
                s.height = u32::try_from(height).ok().filter(|&h| h > 0);
                s.pixel_format = pix_fmt.descriptor().map(|d| d.name().to_owned());
                if kind == StreamKind::Video {
                    s.frame_rate = rational(stream.avg_frame_rate()).or_else(|| rational(stream.rate()));
                }
            }
            StreamKind::Audio => {
                s.sample_rate = u32::try_from(sample_rate).ok().filter(|&r| r > 0);
                s.channels = u32::try_from(channels).ok().filter(|&c| c > 0);
                if sample_fmt != ff::format::Sample::None {
                    s.sample_format = Some(sample_fmt.name().to_owned());
                }
            }
            _ => {}
        }
        streams.push(s);
    }
    // FFmpeg's extension-based demuxers (image2, raw pipes) "open" any bytes named like a media file; a stream
    // without dimensions or without a sample rate/channel count was never parsed from real data.
    let usable = |s: &StreamInfo| match s.kind {
        StreamKind::Video | StreamKind::Image => s.width.is_some() && s.height.is_some(),
        StreamKind::Audio => s.sample_rate.is_some() && s.channels.is_some(),
        _ => true,
    };
    if !streams.iter().any(|s| usable(s) && matches!(s.kind, StreamKind::Video | StreamKind::Image | StreamKind::Audio))
    {
        return Err(crate::Error::UnknownFormat {
            item: item.to_owned(),
            detail: format!(
                "FFmpeg's `{}` reader found no video or audio stream with valid parameters",
                ictx.format().name()
            ),
        });
    }
    let duration = ictx.duration();
    Ok(MediaInfo {
        item: item.to_owned(),
        format: ictx.format().name().to_owned(),
        prober: "ffmpeg".into(),
        size_bytes,
        duration_s: (duration > 0).then(|| duration as f64 / f64::from(ff::ffi::AV_TIME_BASE)),
        bit_rate: u64::try_from(ictx.bit_rate()).ok().filter(|&b| b > 0),
        streams,
    })
}
