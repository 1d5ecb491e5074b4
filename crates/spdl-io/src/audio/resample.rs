//! Sample-rate conversion with rubato's synchronous FFT resampler (band-limited, no hand-written
//! interpolation), aligned so output frame `k` is at time `k / out_rate` of the input.

use rubato::{FftFixedInOut, Resampler};

use crate::types::audio::render::Planes;
use crate::{Error, Result};

/// Input frames per resampler chunk (rubato rounds it to a multiple of `in_rate / gcd`).
const CHUNK: usize = 1024;

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a.max(1) } else { gcd(b, a % b) }
}

/// Input and output frames of one resampler chunk: the FFT lengths. rubato's input length is a multiple of
/// `in_rate / gcd` (an even one: see [`resample`]), so the output length is a multiple of `out_rate / gcd`
/// and grows with the rate ratio, not with the data: 1 Hz to 44.1 kHz would be a 45 M-point FFT.
pub(crate) fn chunk_frames(in_rate: u32, out_rate: u32) -> (u64, u64) {
    let (in_r, out_r) = (in_rate.max(1) as usize, out_rate.max(1) as usize);
    let g = gcd(in_r, out_r);
    let unit = in_r / g;
    let chunks = CHUNK.div_ceil(unit).max(2).next_multiple_of(2) as u64;
    (chunks * unit as u64, chunks * (out_r / g) as u64)
}

/// Bytes rubato holds for a resampler of `channels` channels (an upper estimate: input and output chunk
/// buffers, their spectra and the filter, per channel), checked against
/// [`super::AudioLimits::max_resampler_bytes`] before it is built.
pub(crate) fn state_bytes(in_rate: u32, out_rate: u32, channels: usize) -> u64 {
    let (chunk_in, chunk_out) = chunk_frames(in_rate, out_rate);
    // f32 samples and complex (2 x f32) spectra of both lengths, about 4 of each.
    chunk_in.saturating_add(chunk_out).saturating_mul(32).saturating_mul(channels.max(1) as u64)
}

/// Output length for `frames` input frames: `ceil(frames * out_rate / in_rate)` (torchaudio's rule).
pub(crate) fn output_len(frames: usize, in_rate: u32, out_rate: u32) -> usize {
    let n = (frames as u128 * u128::from(out_rate)).div_ceil(u128::from(in_rate.max(1)));
    usize::try_from(n).unwrap_or(usize::MAX)
}

fn resample_error(item: &str, cause: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Decode { item: item.to_owned(), format: "resample".into(), cause: Box::new(cause) }
}

/// Resamples every plane of `src` from `in_rate` to `out_rate`, producing `out_len` frames (the first
/// `out_len` of the full output; callers that truncate ask for fewer and save the work).
pub(crate) fn resample(src: &Planes, in_rate: u32, out_rate: u32, out_len: usize, item: &str) -> Result<Planes> {
    let channels = src.planes.len();
    if out_len == 0 || channels == 0 {
        return Ok(Planes::new(vec![Vec::new(); channels]));
    }
    // rubato's FFT length is a multiple of `in_rate / gcd`; an even multiple makes its filter delay a whole
    // number of output frames, so dropping `output_delay()` frames aligns the output exactly (an odd one
    // leaves a fraction of a frame: a phase error).
    let (in_r, out_r) = (in_rate as usize, out_rate as usize);
    let (chunk_in, _) = chunk_frames(in_rate, out_rate);
    let mut r =
        FftFixedInOut::<f32>::new(in_r, out_r, chunk_in as usize, channels).map_err(|e| resample_error(item, e))?;
    let delay = r.output_delay();
    let total = out_len + delay;
    let chunk_out = r.output_frames_max();
    let mut out: Vec<Vec<f32>> = vec![vec![0.0f32; total + chunk_out]; channels];
    let input: Vec<&[f32]> =
        src.planes.iter().map(|p| p.get(src.offset..src.offset + src.len).unwrap_or(&[])).collect();
    let n_in = src.len;
    let (mut consumed, mut produced) = (0usize, 0usize);
    while produced < total {
        let need = r.input_frames_next();
        let mut outs: Vec<&mut [f32]> = out.iter_mut().map(|p| &mut p[produced..]).collect();
        let (_, written) = if consumed + need <= n_in {
            let ins: Vec<&[f32]> = input.iter().map(|p| p.get(consumed..consumed + need).unwrap_or(&[])).collect();
            r.process_into_buffer(&ins, &mut outs, None)
        } else if consumed < n_in {
            let ins: Vec<&[f32]> = input.iter().map(|p| p.get(consumed..).unwrap_or(&[])).collect();
            r.process_partial_into_buffer(Some(&ins), &mut outs, None)
        } else {
            // Past the input: zeros flush the filter's tail out.
            r.process_partial_into_buffer(None::<&[&[f32]]>, &mut outs, None)
        }
        .map_err(|e| resample_error(item, e))?;
        if written == 0 {
            break;
        }
        consumed += need;
        produced += written;
    }
    Ok(Planes { planes: out, offset: delay, len: out_len.min(produced.saturating_sub(delay)) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::audio::render::ClipSource;

    #[test]
    fn lengths() {
        assert_eq!(output_len(44_100, 44_100, 16_000), 16_000);
        assert_eq!(output_len(1, 44_100, 16_000), 1);
        assert_eq!(output_len(0, 8_000, 16_000), 0);
        assert_eq!(output_len(1001, 8_000, 16_000), 2002);
    }

    #[test]
    fn sine_survives_and_stays_aligned() {
        let (fin, fout, f) = (48_000u32, 16_000u32, 440.0f32);
        let n = 4_800;
        let sine = |rate: u32, i: usize| (2.0 * std::f32::consts::PI * f * i as f32 / rate as f32).sin() * 0.5;
        let src = Planes::new(vec![(0..n).map(|i| sine(fin, i)).collect()]);
        let out_len = output_len(n, fin, fout);
        let out = resample(&src, fin, fout, out_len, "sine").unwrap();
        assert_eq!(out.frames(), 1_600);
        let mut got = vec![0.0; out_len];
        out.read_channel(0, 0, &mut got);
        // Away from the edges (filter warm-up), the resampled wave matches the analytic one.
        let err = (100..1500).map(|i| (got[i] - sine(fout, i)).abs()).fold(0.0, f32::max);
        assert!(err < 0.01, "max error {err}");
    }
}
