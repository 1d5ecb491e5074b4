//! `spdl_rs.io.parse_wav` and `load_wav`, native half: the RIFF/WAVE chunk walk (the first `fmt ` chunk, then
//! the first `data` chunk after it), every chunk size checked against the data before it is used, and the
//! sample window `load_wav` views: its NumPy type string, byte offset and frame count. Python makes the array
//! interface over the caller's buffer (no copy). Errors are `ValueError`s with SPDL's messages.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::array::PyRegion;
use super::npy::Region;

/// RIFF header (12) + a 16-byte fmt chunk (24) + a data chunk header (8).
const MIN_SIZE: u64 = 44;
const PCM: u16 = 1;
const IEEE_FLOAT: u16 = 3;
const EXTENSIBLE: u16 = 0xFFFE;
/// The tail of the KSDATAFORMAT_SUBTYPE_* GUIDs; their first two bytes are the format code.
const GUID_TAIL: &[u8; 14] = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71";

/// Why WAV data cannot be read or viewed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WavError {
    /// A header, a chunk or a window that does not fit (the message says which).
    #[error("{0}")]
    Invalid(String),
}

fn invalid<T>(message: String) -> Result<T, WavError> {
    Err(WavError::Invalid(message))
}

/// The header of WAV data, from [`parse`].
#[pyclass(module = "spdl_rs._native.io", name = "WAVHeader", frozen, skip_from_py_object)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WavHeader {
    /// The format code of the fmt chunk (1: PCM, 3: IEEE float, 65534: WAVE_FORMAT_EXTENSIBLE, ...).
    #[pyo3(get)]
    pub(crate) audio_format: u16,
    /// Number of channels.
    #[pyo3(get)]
    pub(crate) num_channels: u16,
    /// Sample rate in Hz.
    #[pyo3(get)]
    pub(crate) sample_rate: u32,
    /// Bytes per second, as the header states (`sample_rate * block_align` in valid data).
    #[pyo3(get)]
    pub(crate) byte_rate: u32,
    /// Bytes per sample frame, as the header states (`num_channels * bits_per_sample / 8` in valid data).
    #[pyo3(get)]
    pub(crate) block_align: u16,
    /// Bits per sample.
    #[pyo3(get)]
    pub(crate) bits_per_sample: u16,
    /// Size of the sample data (the `data` chunk) in bytes.
    #[pyo3(get)]
    pub(crate) data_size: u32,
    subformat: Option<u16>,
    data_offset: u64,
}

#[pymethods]
impl WavHeader {
    fn __repr__(&self) -> String {
        format!(
            "WAVHeader(audio_format={}, num_channels={}, sample_rate={}, byte_rate={}, block_align={}, \
             bits_per_sample={}, data_size={})",
            self.audio_format,
            self.num_channels,
            self.sample_rate,
            self.byte_rate,
            self.block_align,
            self.bits_per_sample,
            self.data_size
        )
    }
}

/// Python's `repr` of a `bytes` object.
fn bytes_repr(b: &[u8]) -> String {
    let quote = if b.contains(&b'\'') && !b.contains(&b'"') { '"' } else { '\'' };
    let mut out = format!("b{quote}");
    for &c in b {
        match c {
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            c if char::from(c) == quote => {
                out.push('\\');
                out.push(quote);
            }
            0x20..=0x7E => out.push(char::from(c)),
            c => out.push_str(&format!("\\x{c:02x}")),
        }
    }
    out.push(quote);
    out
}

fn read(src: &(impl Region + ?Sized), offset: u64, len: usize) -> Result<std::borrow::Cow<'_, [u8]>, WavError> {
    src.read(offset, len).map_err(WavError::Invalid)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The chunk at `pos`: `(tag, size, body offset)`, or `None` when fewer than 8 bytes are left.
fn chunk_at(src: &(impl Region + ?Sized), pos: u64) -> Result<Option<([u8; 4], u64, u64)>, WavError> {
    if pos.saturating_add(8) > src.len() {
        return Ok(None);
    }
    let header = read(src, pos, 8)?;
    Ok(Some(([header[0], header[1], header[2], header[3]], u64::from(u32_at(&header, 4)), pos + 8)))
}

fn beyond(tag: [u8; 4], size: u64, body: u64, n: u64) -> WavError {
    WavError::Invalid(format!(
        "WAV chunk extends beyond file size (chunk {}: {size} bytes at offset {body}, data {n})",
        bytes_repr(&tag)
    ))
}

/// Reads the header of the WAV data in `src`.
pub(crate) fn parse(src: &(impl Region + ?Sized)) -> Result<WavHeader, WavError> {
    let n = src.len();
    if n < MIN_SIZE {
        return invalid(format!("WAV data too small to contain valid header ({n} bytes, at least {MIN_SIZE} needed)"));
    }
    let riff = read(src, 0, 12)?;
    if &riff[0..4] != b"RIFF" {
        return invalid("Missing RIFF header".into());
    }
    if &riff[8..12] != b"WAVE" {
        return invalid("Missing WAVE format identifier".into());
    }
    // The fmt chunk: the first one, wherever it is.
    let mut pos = 12;
    let mut fmt = None;
    while let Some((tag, size, body)) = chunk_at(src, pos)? {
        if &tag == b"fmt " {
            if size < 16 {
                return invalid(format!("fmt chunk too small ({size} bytes, at least 16 needed)"));
            }
            if size > n - body {
                return invalid(format!(
                    "fmt chunk extends beyond file size ({size} bytes at offset {body}, data {n})"
                ));
            }
            fmt = Some(read(src, body, size.min(40) as usize)?.into_owned());
            pos = body + size + (size & 1);
            break;
        }
        if size > n - body {
            return Err(beyond(tag, size, body, n));
        }
        pos = body + size + (size & 1);
    }
    let Some(fmt) = fmt else {
        return invalid("fmt chunk not found".into());
    };
    let audio_format = u16_at(&fmt, 0);
    let subformat =
        (audio_format == EXTENSIBLE && fmt.len() >= 40 && u16_at(&fmt, 16) >= 22 && fmt[26..40] == GUID_TAIL[..])
            .then(|| u16_at(&fmt, 24));
    // The data chunk: the first one after fmt.
    while let Some((tag, size, body)) = chunk_at(src, pos)? {
        if &tag == b"data" {
            if size > n - body {
                return invalid(format!(
                    "WAV data chunk extends beyond the input buffer ({size} bytes at offset {body}, {} present)",
                    n - body
                ));
            }
            return Ok(WavHeader {
                audio_format,
                num_channels: u16_at(&fmt, 2),
                sample_rate: u32_at(&fmt, 4),
                byte_rate: u32_at(&fmt, 8),
                block_align: u16_at(&fmt, 12),
                bits_per_sample: u16_at(&fmt, 14),
                data_size: size as u32,
                subformat,
                data_offset: body,
            });
        }
        if size > n - body {
            return Err(beyond(tag, size, body, n));
        }
        pos = body + size + (size & 1);
    }
    invalid("data chunk not found".into())
}

/// The samples `load_wav` views.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Samples {
    /// NumPy's type string of a sample.
    pub(crate) typestr: &'static str,
    /// Where the first frame of the window starts in the data.
    pub(crate) offset: u64,
    /// Frames in the window.
    pub(crate) frames: u64,
    /// Samples per frame.
    pub(crate) channels: u16,
}

/// `repr()` of a Python float.
fn py_float(x: f64) -> String {
    match x {
        x if x.is_nan() => "nan".into(),
        x if x.is_infinite() => (if x > 0.0 { "inf" } else { "-inf" }).into(),
        x => format!("{x:?}"),
    }
}

/// The window of `header`'s samples from `time_offset` seconds, `duration` seconds long (to the end by default),
/// after checking that the format is one `load_wav` views.
pub(crate) fn samples(h: &WavHeader, time_offset: Option<f64>, duration: Option<f64>) -> Result<Samples, WavError> {
    let (channels, rate, bits) = (h.num_channels, h.sample_rate, h.bits_per_sample);
    if channels == 0 {
        return invalid("Invalid number of channels: 0".into());
    }
    if rate == 0 {
        return invalid("Invalid sample rate: 0".into());
    }
    let format = if h.audio_format == EXTENSIBLE { h.subformat.unwrap_or(h.audio_format) } else { h.audio_format };
    let typestr = match (format, bits) {
        (PCM, 8) => "|u1",
        (PCM, 16) => "<i2",
        (PCM, 32) => "<i4",
        (PCM, _) => return invalid(format!("Unsupported PCM bits per sample: {bits}")),
        (IEEE_FLOAT, 32) => "<f4",
        (IEEE_FLOAT, 64) => "<f8",
        (IEEE_FLOAT, _) => return invalid(format!("Unsupported IEEE float bits per sample: {bits}")),
        _ => return invalid(format!("Unsupported WAV audio format: {}", h.audio_format)),
    };
    let block_align = u64::from(channels) * u64::from(bits) / 8;
    if u64::from(h.block_align) != block_align {
        return invalid(format!("Invalid block align: expected {block_align}, found {}", h.block_align));
    }
    if u64::from(h.byte_rate) != u64::from(rate) * block_align {
        return invalid(format!(
            "Invalid byte rate: expected {}, found {}",
            u64::from(rate) * block_align,
            h.byte_rate
        ));
    }
    let data_size = u64::from(h.data_size);
    if data_size % block_align != 0 {
        return invalid(format!(
            "WAV data chunk does not contain a whole number of sample frames ({data_size} bytes, {block_align} per frame)"
        ));
    }
    let num_frames = data_size / block_align;
    let (mut start, mut count) = (0, num_frames);
    if time_offset.is_some() || duration.is_some() {
        let offset = time_offset.unwrap_or(0.0);
        if !offset.is_finite() {
            return invalid(format!("Time offset must be finite, got {}", py_float(offset)));
        }
        if offset < 0.0 {
            return invalid(format!("Time offset cannot be negative, got {}", py_float(offset)));
        }
        let first = (offset * f64::from(rate)).floor();
        if first >= num_frames as f64 {
            return invalid(format!(
                "Time offset exceeds audio duration ({} s, the audio has {num_frames} frames at {rate} Hz)",
                py_float(offset)
            ));
        }
        start = first as u64;
        count = num_frames - start;
        if let Some(duration) = duration {
            if !duration.is_finite() {
                return invalid(format!("Duration must be finite, got {}", py_float(duration)));
            }
            if duration < 0.0 {
                return invalid(format!("Duration cannot be negative, got {}", py_float(duration)));
            }
            let frames = (duration * f64::from(rate)).floor();
            if frames < count as f64 {
                count = frames as u64;
            }
        }
    }
    Ok(Samples { typestr, offset: h.data_offset + start * block_align, frames: count, channels })
}

/// `wav_header(data) -> WAVHeader`: the header of the WAV data in `data` (`bytes` or a flat byte
/// `memoryview`). Raises `ValueError` when the data is not RIFF/WAVE, is shorter than a header, lacks a fmt or
/// data chunk, or a chunk declares more bytes than the data holds.
#[pyfunction]
pub(crate) fn wav_header(data: &Bound<'_, PyAny>) -> PyResult<WavHeader> {
    parse(&PyRegion::new(data)?).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// `wav_samples(data, time_offset_seconds, duration_seconds) -> (typestr, offset, frames, channels)`: the
/// window of samples `load_wav` views in `data` (`bytes` or a flat byte `memoryview`): the first frame at byte
/// `offset`, `frames` frames of `channels` samples of NumPy type `typestr`. Raises `ValueError` (see
/// [`wav_header`], and a format `load_wav` does not view or a window outside the data).
#[pyfunction]
#[pyo3(signature = (data, time_offset_seconds=None, duration_seconds=None))]
pub(crate) fn wav_samples(
    data: &Bound<'_, PyAny>,
    time_offset_seconds: Option<f64>,
    duration_seconds: Option<f64>,
) -> PyResult<(&'static str, u64, u64, u16)> {
    let window = parse(&PyRegion::new(data)?).and_then(|h| samples(&h, time_offset_seconds, duration_seconds));
    let s = window.map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok((s.typestr, s.offset, s.frames, s.channels))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(tag: &[u8; 4], body: &[u8], size: Option<u32>) -> Vec<u8> {
        let mut out = tag.to_vec();
        out.extend(size.unwrap_or(body.len() as u32).to_le_bytes());
        out.extend(body);
        if body.len() % 2 == 1 {
            out.push(0);
        }
        out
    }

    fn fmt(format: u16, channels: u16, rate: u32, bits: u16) -> Vec<u8> {
        let align = channels * bits / 8;
        let mut body = Vec::new();
        for v in [format, channels] {
            body.extend(v.to_le_bytes());
        }
        body.extend(rate.to_le_bytes());
        body.extend((rate * u32::from(align)).to_le_bytes());
        body.extend(align.to_le_bytes());
        body.extend(bits.to_le_bytes());
        chunk(b"fmt ", &body, None)
    }

    fn riff(chunks: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = [b"WAVE".to_vec()].into_iter().chain(chunks.iter().cloned()).flatten().collect();
        [b"RIFF".to_vec(), (body.len() as u32).to_le_bytes().to_vec(), body].concat()
    }

    #[test]
    fn reads_the_first_fmt_and_data_chunks() {
        let data = riff(&[fmt(1, 2, 8000, 16), chunk(b"LIST", b"odd", None), chunk(b"data", &[0; 40], None)]);
        let h = parse(data.as_slice()).expect("valid");
        assert_eq!((h.num_channels, h.sample_rate, h.data_size, h.data_offset), (2, 8000, 40, 56));
        let s = samples(&h, Some(0.00025), Some(0.0005)).expect("window");
        assert_eq!(s, Samples { typestr: "<i2", offset: 56 + 2 * 4, frames: 4, channels: 2 });
        assert!(h.__repr__().contains("num_channels=2"));
    }

    #[test]
    fn hostile_headers_are_errors() {
        let data = [0u8; 32];
        let good = riff(&[fmt(1, 1, 8000, 16), chunk(b"data", &data, None)]);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (good[..43].to_vec(), "too small"),
            ([b"RIFX", &good[4..]].concat(), "Missing RIFF header"),
            (good[..good.len() - 10].to_vec(), "data chunk extends beyond the input buffer"),
            (riff(&[chunk(b"fmt ", &[1, 0, 1, 0], None), chunk(b"data", &data, None)]), "fmt chunk too small"),
            (riff(&[chunk(b"data", &data, None), fmt(1, 1, 8000, 16)]), "data chunk not found"),
            (riff(&[chunk(b"data", &data, None), chunk(b"LIST", &data, None)]), "fmt chunk not found"),
            (
                riff(&[fmt(1, 1, 8000, 16), chunk(b"junk", b"", Some(0xFFFF_FFF0)), chunk(b"data", &data, None)]),
                "chunk b'junk': 4294967280 bytes",
            ),
        ];
        for (bad, words) in cases {
            let err = parse(bad.as_slice()).expect_err(words).to_string();
            assert!(err.contains(words), "{err}");
        }
        let h = parse(good.as_slice()).expect("valid");
        for ((offset, duration), words) in [
            ((Some(1.0), None), "exceeds audio duration"),
            ((Some(f64::INFINITY), None), "must be finite, got inf"),
            ((Some(-1.0), None), "cannot be negative"),
            ((None, Some(f64::NAN)), "Duration must be finite, got nan"),
        ] {
            let err = samples(&h, offset, duration).expect_err(words).to_string();
            assert!(err.contains(words), "{err}");
        }
        let wide = WavHeader { num_channels: 65535, block_align: 2, byte_rate: 16000, ..h.clone() };
        assert!(samples(&wide, None, None).expect_err("align").to_string().contains("expected 131070, found 2"));
        let odd = WavHeader { bits_per_sample: 24, ..h };
        assert!(samples(&odd, None, None).expect_err("24-bit").to_string().contains("PCM bits per sample: 24"));
    }
}
