//! The WAV fast path: PCM and IEEE-float WAV samples are read straight from the file's bytes into the
//! output (no decoder, no intermediate buffer). With a time window only the window's bytes are read.
//!
//! Everything here is a pure function of the input bytes (no shared state, no locks), so it scales
//! linearly with threads. Formats it does not handle (ADPCM, A-law, RF64, ...) go to symphonia.

use std::borrow::Cow;
use std::fs::File;

use crate::input::MediaInput;
use crate::input::TimeWindow;
use crate::types::audio::AudioLimits;
use crate::types::audio::render::ClipSource;
use crate::{Error, Result};

/// Bytes of the header read in one go (by the caller of [`parse`], which also sniffs them for the decoder);
/// the `data` chunk usually starts within it.
pub(crate) const HEAD: usize = 4096;
/// Chunks walked before giving up (a hostile file of tiny chunks).
const MAX_CHUNKS: usize = 1024;

/// Sample encodings of the fast path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PcmKind {
    U8,
    S16,
    S24,
    S32,
    F32,
    F64,
}

impl PcmKind {
    fn bytes(self) -> usize {
        match self {
            PcmKind::U8 => 1,
            PcmKind::S16 => 2,
            PcmKind::S24 => 3,
            PcmKind::S32 | PcmKind::F32 => 4,
            PcmKind::F64 => 8,
        }
    }

    pub fn codec_name(self) -> &'static str {
        match self {
            PcmKind::U8 => "pcm_u8",
            PcmKind::S16 => "pcm_s16le",
            PcmKind::S24 => "pcm_s24le",
            PcmKind::S32 => "pcm_s32le",
            PcmKind::F32 => "pcm_f32le",
            PcmKind::F64 => "pcm_f64le",
        }
    }
}

/// What the RIFF header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WavHeader {
    pub kind: PcmKind,
    pub channels: usize,
    pub sample_rate: u32,
    /// Offset of the first sample.
    pub data_offset: u64,
    /// Whole frames actually present (the declared size clamped to the input's length).
    pub frames: u64,
    /// Frames the header declares (larger than `frames` for a truncated file).
    pub declared_frames: u64,
}

impl WavHeader {
    fn block_align(&self) -> usize {
        self.kind.bytes() * self.channels
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn wav_error(item: &str, msg: String) -> Error {
    Error::Decode { item: item.to_owned(), format: "wav".into(), cause: msg.into() }
}

/// Parses the header of a RIFF/WAVE input, given its first [`HEAD`] bytes (`head`). `Ok(None)`: not a WAV the
/// fast path handles (another format, or a WAV codec symphonia decodes). Errors: a WAV header that is broken or
/// over the limits.
pub(crate) fn parse(
    input: &MediaInput<'_>,
    file: Option<&mut File>,
    head: &[u8],
    item: &str,
    limits: &AudioLimits,
) -> Result<Option<WavHeader>> {
    let total = input.len()?;
    let mut file = file;
    if head.len() < 12 || &head[0..4] != b"RIFF" || &head[8..12] != b"WAVE" {
        return Ok(None);
    }
    let mut fmt: Option<(PcmKind, usize, u32)> = None;
    let mut pos: u64 = 12;
    for _ in 0..MAX_CHUNKS {
        let hdr: Cow<'_, [u8]> = match usize::try_from(pos).ok().and_then(|p| head.get(p..p + 8)) {
            Some(h) => Cow::Borrowed(h),
            None => input.read_at(file.as_deref_mut(), pos, 8)?,
        };
        let (Some(id), Some(size)) = (hdr.get(0..4), u32_at(&hdr, 4)) else {
            return Err(wav_error(item, format!("no `data` chunk before the end of the file at byte {pos}")));
        };
        let body = pos + 8;
        match id {
            b"fmt " => {
                let f = input.read_at(file.as_deref_mut(), body, (size as usize).min(64))?;
                // The limits hold for every WAV, also those left to symphonia (whose header arithmetic
                // overflows on absurd channel counts).
                if let (Some(channels), Some(rate)) = (u16_at(&f, 2), u32_at(&f, 4)) {
                    check_limits(item, usize::from(channels), rate, limits)?;
                }
                let parsed = parse_fmt(&f).ok_or_else(|| {
                    wav_error(item, format!("`fmt ` chunk of {size} bytes is malformed (or 0 channels / 0 Hz)"))
                })?;
                match parsed {
                    // The limits were checked above, on the same header fields.
                    Some(format) => fmt = Some(format),
                    None => return Ok(None),
                }
            }
            b"data" => {
                let Some((kind, channels, sample_rate)) = fmt else {
                    return Err(wav_error(item, "`data` chunk before the `fmt ` chunk".into()));
                };
                let block = (kind.bytes() * channels) as u64;
                // Streamed WAVs write 0 or 0xFFFFFFFF as the size: read to the end of the input.
                let declared = if size == 0 || size == u32::MAX { total.saturating_sub(body) } else { u64::from(size) };
                let present = declared.min(total.saturating_sub(body));
                return Ok(Some(WavHeader {
                    kind,
                    channels,
                    sample_rate,
                    data_offset: body,
                    frames: present / block,
                    declared_frames: declared / block,
                }));
            }
            _ => {}
        }
        pos = body + u64::from(size) + u64::from(size & 1);
        if pos >= total {
            break;
        }
    }
    Err(wav_error(item, "no `data` chunk".into()))
}

/// The channel count the `fmt ` chunk of a RIFF/WAVE input states, checked against `limits` (`Ok(None)`: not
/// a WAV, or no `fmt ` chunk before the `data` chunk). The count is at the same place in every `fmt `
/// chunk, WAVE_FORMAT_EXTENSIBLE (tag 0xFFFE) included. For decoders that read the header their own way:
/// symphonia takes an extensible header's count from its channel mask, and a 1000-channel header came
/// out as 8 scrambled channels instead of a limit error.
pub(crate) fn stated_channels(input: &MediaInput<'_>, item: &str, limits: &AudioLimits) -> Result<Option<usize>> {
    let mut file = match *input {
        MediaInput::Path(p) => Some(MediaInput::open_file(p)?),
        MediaInput::Bytes { .. } => None,
    };
    let head = input.read_at(file.as_mut(), 0, HEAD)?;
    if head.len() < 12 || &head[0..4] != b"RIFF" || &head[8..12] != b"WAVE" {
        return Ok(None);
    }
    let total = input.len()?;
    let mut pos: u64 = 12;
    for _ in 0..MAX_CHUNKS {
        let hdr: Cow<'_, [u8]> = match usize::try_from(pos).ok().and_then(|p| head.get(p..p + 8)) {
            Some(h) => Cow::Borrowed(h),
            None => input.read_at(file.as_mut(), pos, 8)?,
        };
        let (Some(id), Some(size)) = (hdr.get(0..4), u32_at(&hdr, 4)) else { return Ok(None) };
        match id {
            b"fmt " => {
                let f = input.read_at(file.as_mut(), pos + 8, (size as usize).min(64))?;
                let (Some(channels), Some(rate)) = (u16_at(&f, 2), u32_at(&f, 4)) else { return Ok(None) };
                check_limits(item, usize::from(channels), rate, limits)?;
                return Ok(Some(usize::from(channels)));
            }
            b"data" => return Ok(None),
            _ => {}
        }
        pos = pos + 8 + u64::from(size) + u64::from(size & 1);
        if pos >= total {
            break;
        }
    }
    Ok(None)
}

fn check_limits(item: &str, channels: usize, rate: u32, limits: &AudioLimits) -> Result<()> {
    if channels as u64 > u64::from(limits.max_channels) {
        return Err(Error::LimitExceeded {
            item: item.to_owned(),
            what: "channels".into(),
            value: channels as u64,
            limit: limits.max_channels.into(),
        });
    }
    if rate > limits.max_sample_rate {
        return Err(Error::LimitExceeded {
            item: item.to_owned(),
            what: "sample rate".into(),
            value: rate.into(),
            limit: limits.max_sample_rate.into(),
        });
    }
    Ok(())
}

/// `Some(Some(..))`: a fast-path format; `Some(None)`: valid but for symphonia; `None`: malformed.
fn parse_fmt(f: &[u8]) -> Option<Option<(PcmKind, usize, u32)>> {
    let mut code = u16_at(f, 0)?;
    let channels = usize::from(u16_at(f, 2)?);
    let rate = u32_at(f, 4)?;
    let block_align = usize::from(u16_at(f, 12)?);
    let bits = u16_at(f, 14)?;
    if channels == 0 || rate == 0 {
        return None;
    }
    if code == 0xFFFE {
        // WAVE_FORMAT_EXTENSIBLE: the real code is the first two bytes of the sub-format GUID.
        code = u16_at(f, 24)?;
    }
    let kind = match (code, bits) {
        (1, 8) => PcmKind::U8,
        (1, 16) => PcmKind::S16,
        (1, 24) => PcmKind::S24,
        (1, 32) => PcmKind::S32,
        (3, 32) => PcmKind::F32,
        (3, 64) => PcmKind::F64,
        _ => return Some(None),
    };
    if block_align != kind.bytes() * channels {
        // Padded containers (e.g. 24-bit in 4 bytes) are left to symphonia.
        return Some(None);
    }
    Some(Some((kind, channels, rate)))
}

/// The samples of a window of a WAV file, borrowed from in-memory bytes or read from the file.
#[derive(Debug)]
pub(crate) struct WavClip<'a> {
    pub header: WavHeader,
    data: Cow<'a, [u8]>,
    frames: usize,
    /// Time of the first frame, in seconds.
    pub start_s: f64,
}

/// Reads the window's bytes of a parsed WAV.
pub(crate) fn open_window<'a>(
    input: &MediaInput<'a>,
    file: Option<&mut File>,
    header: WavHeader,
    window: Option<&TimeWindow>,
    item: &str,
    limits: &AudioLimits,
) -> Result<WavClip<'a>> {
    let rate = f64::from(header.sample_rate);
    let (start, count) = match window {
        None => (0, header.frames),
        Some(w) => {
            let start = ((w.start_s * rate).round() as u64).min(header.frames);
            let count = w.duration_s.map_or(u64::MAX, |d| (d * rate).round() as u64);
            (start, count.min(header.frames - start))
        }
    };
    let samples = count.saturating_mul(header.channels as u64);
    if samples > limits.max_samples {
        return Err(Error::LimitExceeded {
            item: item.to_owned(),
            what: "samples".into(),
            value: samples,
            limit: limits.max_samples,
        });
    }
    let block = header.block_align() as u64;
    let len =
        usize::try_from(count * block).map_err(|_| wav_error(item, format!("{count} frames do not fit in memory")))?;
    let data = input.read_at(file, header.data_offset + start * block, len)?;
    let frames = data.len() / header.block_align();
    Ok(WavClip { header, data, frames, start_s: start as f64 / rate })
}

impl ClipSource for WavClip<'_> {
    fn channels(&self) -> usize {
        self.header.channels
    }

    fn frames(&self) -> usize {
        self.frames
    }

    fn read_channel(&self, ch: usize, from: usize, out: &mut [f32]) {
        let kind = self.header.kind;
        let stride = self.header.block_align();
        let start = from * stride + ch * kind.bytes();
        let Some(bytes) = self.data.get(start..) else {
            out.fill(0.0);
            return;
        };
        // One loop per encoding so each compiles to a tight strided load + convert.
        let frames = out.iter_mut().zip(bytes.chunks(stride));
        match kind {
            PcmKind::U8 => frames.for_each(|(o, f)| *o = f.first().map_or(0.0, |&b| (f32::from(b) - 128.0) / 128.0)),
            PcmKind::S16 => frames.for_each(|(o, f)| {
                *o = match f {
                    [a, b, ..] => f32::from(i16::from_le_bytes([*a, *b])) / 32768.0,
                    _ => 0.0,
                }
            }),
            PcmKind::S24 => frames.for_each(|(o, f)| {
                *o = match f {
                    [a, b, c, ..] => (i32::from_le_bytes([0, *a, *b, *c]) >> 8) as f32 / 8_388_608.0,
                    _ => 0.0,
                }
            }),
            PcmKind::S32 => frames.for_each(|(o, f)| {
                *o = match f {
                    [a, b, c, d, ..] => i32::from_le_bytes([*a, *b, *c, *d]) as f32 / 2_147_483_648.0,
                    _ => 0.0,
                }
            }),
            PcmKind::F32 => frames.for_each(|(o, f)| {
                *o = match f {
                    [a, b, c, d, ..] => f32::from_le_bytes([*a, *b, *c, *d]),
                    _ => 0.0,
                }
            }),
            PcmKind::F64 => frames.for_each(|(o, f)| {
                *o = match f.get(..8).and_then(|s| <[u8; 8]>::try_from(s).ok()) {
                    Some(b) => f64::from_le_bytes(b) as f32,
                    None => 0.0,
                }
            }),
        }
    }
}

/// Writes a canonical 44-byte-header WAV (PCM 16-bit) — used by tests, benches and examples.
pub fn encode_wav_i16(samples_interleaved: &[i16], channels: u16, sample_rate: u32) -> Vec<u8> {
    let data_len = (samples_interleaved.len() * 2) as u32;
    let mut out = Vec::with_capacity(44 + data_len as usize);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data_len).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&channels.to_le_bytes());
    out.extend_from_slice(&sample_rate.to_le_bytes());
    out.extend_from_slice(&(sample_rate * u32::from(channels) * 2).to_le_bytes());
    out.extend_from_slice(&(channels * 2).to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    for s in samples_interleaved {
        out.extend_from_slice(&s.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_of(bytes: &[u8]) -> Result<Option<WavHeader>> {
        parse(
            &MediaInput::bytes(bytes, "t.wav"),
            None,
            bytes.get(..HEAD).unwrap_or(bytes),
            "t.wav",
            &AudioLimits::default(),
        )
    }

    #[test]
    fn parses_canonical_and_reads_window() {
        let samples: Vec<i16> = (0..200).map(|i| i * 10).collect();
        let wav = encode_wav_i16(&samples, 2, 1000);
        let h = header_of(&wav).unwrap().unwrap();
        assert_eq!((h.kind, h.channels, h.sample_rate, h.frames, h.data_offset), (PcmKind::S16, 2, 1000, 100, 44));
        let input = MediaInput::bytes(&wav, "t.wav");
        let clip = open_window(&input, None, h, Some(&TimeWindow::new(0.01, 0.005)), "t.wav", &AudioLimits::default())
            .unwrap();
        assert_eq!(clip.frames(), 5);
        let mut right = [0.0f32; 5];
        clip.read_channel(1, 0, &mut right);
        assert_eq!(right.map(|x| (x * 32768.0) as i32), [210, 230, 250, 270, 290]);
    }

    #[test]
    fn truncated_and_odd_inputs() {
        let wav = encode_wav_i16(&[1, 2, 3, 4, 5, 6], 2, 8000);
        let cut = &wav[..wav.len() - 3];
        let h = header_of(cut).unwrap().unwrap();
        assert_eq!((h.frames, h.declared_frames), (2, 3));
        assert!(header_of(b"RIFF\0\0\0\0WAVE").is_err());
        assert!(header_of(&wav[..30]).is_err());
        assert!(header_of(b"OggS....").unwrap().is_none());
        let mut zero_ch = wav.clone();
        zero_ch[22] = 0;
        assert!(header_of(&zero_ch).is_err());
        let mut many = wav.clone();
        many[22..24].copy_from_slice(&1000u16.to_le_bytes());
        many[32..34].copy_from_slice(&2000u16.to_le_bytes());
        assert!(matches!(header_of(&many), Err(Error::LimitExceeded { .. })));
        let mut alaw = wav.clone();
        alaw[20] = 6;
        assert!(header_of(&alaw).unwrap().is_none());
    }
}
