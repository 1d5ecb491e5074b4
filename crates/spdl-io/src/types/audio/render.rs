//! The last pass of every decode: channel selection/mix-down, sample conversion and layout, written
//! straight into the output slot (a clip's buffer or its slot of a batch).
//!
//! Work goes in blocks of [`BLOCK`] frames per channel through a small `f32` row that stays in L1: the
//! only full-size writes are the ones into the output.

use super::options::{AudioLayout, ChannelSelect};

/// Frames per block of the render loop (16 KiB of `f32`).
const BLOCK: usize = 4096;

/// Decoded (or directly readable) audio at the source rate.
pub(crate) trait ClipSource {
    /// Source channels.
    fn channels(&self) -> usize;
    /// Frames available.
    fn frames(&self) -> usize;
    /// Writes source channel `ch`, frames `from..from + out.len()` (all within `frames()`), into `out` as
    /// `f32` in `[-1, 1]`.
    fn read_channel(&self, ch: usize, from: usize, out: &mut [f32]);
}

/// Planar `f32` scratch, optionally starting `offset` frames in (a resampler's delay).
#[derive(Debug, Default)]
pub(crate) struct Planes {
    pub planes: Vec<Vec<f32>>,
    pub offset: usize,
    pub len: usize,
}

impl Planes {
    pub fn new(planes: Vec<Vec<f32>>) -> Planes {
        let len = planes.iter().map(Vec::len).min().unwrap_or(0);
        Planes { planes, offset: 0, len }
    }
}

/// Most scratch samples a thread keeps for its next clip (16 MiB of `f32`: a minute of 44.1 kHz stereo).
const MAX_SPARE_SAMPLES: usize = 4 << 20;

thread_local! {
    /// Scratch planes of clips this thread has rendered, kept for its next clip. A fresh plane of a few MB
    /// is mmapped, page-faulted and zeroed by the kernel on every clip, then unmapped: 10-15% of an MP3
    /// decode's profile went to those page faults.
    static SPARE_PLANES: std::cell::RefCell<Vec<Vec<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An empty plane, with the capacity of one this thread used before when it has one.
pub(crate) fn spare_plane() -> Vec<f32> {
    SPARE_PLANES.try_with(|s| s.borrow_mut().pop()).ok().flatten().unwrap_or_default()
}

impl Drop for Planes {
    fn drop(&mut self) {
        let _ = SPARE_PLANES.try_with(|spare| {
            let mut spare = spare.borrow_mut();
            let mut kept: usize = spare.iter().map(Vec::capacity).sum();
            for mut p in self.planes.drain(..) {
                if p.capacity() == 0 || kept + p.capacity() > MAX_SPARE_SAMPLES {
                    continue;
                }
                kept += p.capacity();
                p.clear();
                spare.push(p);
            }
        });
    }
}

impl ClipSource for Planes {
    fn channels(&self) -> usize {
        self.planes.len()
    }

    fn frames(&self) -> usize {
        self.len
    }

    fn read_channel(&self, ch: usize, from: usize, out: &mut [f32]) {
        let start = self.offset + from;
        match self.planes.get(ch).and_then(|p| p.get(start..start + out.len())) {
            Some(src) => out.copy_from_slice(src),
            None => out.fill(0.0),
        }
    }
}

/// An output sample type.
pub(crate) trait OutSample: spdl_buffer::Element + Default {
    fn from_f32(x: f32) -> Self;
}

impl OutSample for f32 {
    #[inline(always)]
    fn from_f32(x: f32) -> f32 {
        x
    }
}

impl OutSample for i16 {
    #[inline(always)]
    fn from_f32(x: f32) -> i16 {
        // `as` saturates (and maps NaN to 0); exact for samples that came from i16 (x = k / 32768).
        (x * 32768.0).round() as i16
    }
}

/// A channel selection resolved against a source's channel count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mapping {
    /// Output channel `k` is source channel `v[k]`.
    Pick(Vec<usize>),
    /// One output channel: the mean of the `n` source channels.
    Mean(usize),
}

impl Mapping {
    /// Resolves `sel` for a source with `source` channels; `None` if a picked channel does not exist.
    pub fn resolve(sel: &ChannelSelect, source: usize) -> Option<Mapping> {
        match sel {
            ChannelSelect::All => Some(Mapping::Pick((0..source).collect())),
            ChannelSelect::Mono if source == 1 => Some(Mapping::Pick(vec![0])),
            ChannelSelect::Mono => Some(Mapping::Mean(source)),
            ChannelSelect::Pick(v) => v.iter().all(|&c| c < source).then(|| Mapping::Pick(v.clone())),
        }
    }

    pub fn identity(n: usize) -> Mapping {
        Mapping::Pick((0..n).collect())
    }

    pub fn out_channels(&self) -> usize {
        match self {
            Mapping::Pick(v) => v.len(),
            Mapping::Mean(_) => 1,
        }
    }

    /// Output channel `k`, frames `from..from + row.len()`, into `row`. `tmp` is scratch of `row`'s length.
    fn fill_row<S: ClipSource + ?Sized>(&self, src: &S, k: usize, from: usize, row: &mut [f32], tmp: &mut [f32]) {
        match self {
            Mapping::Pick(v) => match v.get(k) {
                Some(&c) => src.read_channel(c, from, row),
                None => row.fill(0.0),
            },
            Mapping::Mean(n) => {
                src.read_channel(0, from, row);
                for c in 1..*n {
                    src.read_channel(c, from, tmp);
                    row.iter_mut().zip(tmp.iter()).for_each(|(r, t)| *r += t);
                }
                let scale = 1.0 / (*n).max(1) as f32;
                row.iter_mut().for_each(|r| *r *= scale);
            }
        }
    }

    /// Materializes the mapped channels as planes (before resampling, so fewer channels are resampled).
    pub fn to_planes<S: ClipSource + ?Sized>(&self, src: &S) -> Planes {
        let n = src.frames();
        let mut tmp = vec![0.0f32; if matches!(self, Mapping::Mean(_)) { BLOCK.min(n) } else { 0 }];
        let planes = (0..self.out_channels())
            .map(|k| {
                let mut plane = vec![0.0f32; n];
                for (b, row) in plane.chunks_mut(BLOCK).enumerate() {
                    let len = if tmp.is_empty() { 0 } else { row.len() };
                    let t = &mut tmp[..len];
                    self.fill_row(src, k, b * BLOCK, row, t);
                }
                plane
            })
            .collect();
        Planes::new(planes)
    }
}

/// Writes `src` through `map` into `dst` (`out_frames` frames of `map.out_channels()` channels, in
/// `layout`): frames past the source's end are zero (padding), source frames past `out_frames` are
/// dropped (truncation). Returns the number of frames taken from the source.
pub(crate) fn render<S: ClipSource + ?Sized, T: OutSample>(
    src: &S,
    map: &Mapping,
    dst: &mut [T],
    out_frames: usize,
    layout: AudioLayout,
) -> usize {
    let channels = map.out_channels();
    debug_assert_eq!(dst.len(), channels * out_frames);
    let valid = src.frames().min(out_frames);
    let mut row = vec![0.0f32; BLOCK.min(valid)];
    let mut tmp = vec![0.0f32; if matches!(map, Mapping::Mean(_)) { row.len() } else { 0 }];
    for k in 0..channels {
        let mut from = 0;
        while from < valid {
            let n = BLOCK.min(valid - from);
            let t = if tmp.is_empty() { &mut tmp[..] } else { &mut tmp[..n] };
            map.fill_row(src, k, from, &mut row[..n], t);
            match layout {
                AudioLayout::ChannelsFirst => {
                    let start = k * out_frames + from;
                    if let Some(out) = dst.get_mut(start..start + n) {
                        out.iter_mut().zip(&row[..n]).for_each(|(o, &x)| *o = T::from_f32(x));
                    }
                }
                AudioLayout::Interleaved => {
                    let start = from * channels + k;
                    if let Some(out) = dst.get_mut(start..) {
                        out.iter_mut().step_by(channels).zip(&row[..n]).for_each(|(o, &x)| *o = T::from_f32(x));
                    }
                }
            }
            from += n;
        }
    }
    // Padding: zero whatever the source did not cover (the slot may come from a reused allocation).
    if valid < out_frames {
        match layout {
            AudioLayout::ChannelsFirst => {
                for k in 0..channels {
                    if let Some(pad) = dst.get_mut(k * out_frames + valid..(k + 1) * out_frames) {
                        pad.fill(T::default());
                    }
                }
            }
            AudioLayout::Interleaved => {
                if let Some(pad) = dst.get_mut(valid * channels..) {
                    pad.fill(T::default());
                }
            }
        }
    }
    valid
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(ch: usize, n: usize) -> Planes {
        Planes::new((0..ch).map(|c| (0..n).map(|t| (c * 1000 + t) as f32 / 32768.0).collect()).collect())
    }

    #[test]
    fn channels_first_pad_and_truncate() {
        let src = ramp(2, 5);
        let mut out = vec![7.0f32; 2 * 8];
        assert_eq!(render(&src, &Mapping::identity(2), &mut out, 8, AudioLayout::ChannelsFirst), 5);
        assert_eq!(out[4] * 32768.0, 4.0);
        assert_eq!(&out[5..8], &[0.0; 3]);
        assert_eq!(out[8] * 32768.0, 1000.0);
        let mut short = vec![0i16; 2 * 3];
        assert_eq!(render(&src, &Mapping::identity(2), &mut short, 3, AudioLayout::ChannelsFirst), 3);
        assert_eq!(short, vec![0, 1, 2, 1000, 1001, 1002]);
    }

    #[test]
    fn interleaved_pick_and_mean() {
        let src = ramp(3, BLOCK + 10);
        let n = BLOCK + 10;
        let mut out = vec![0i16; 2 * n];
        render(&src, &Mapping::Pick(vec![2, 0]), &mut out, n, AudioLayout::Interleaved);
        assert_eq!(&out[..4], &[2000, 0, 2001, 1]);
        assert_eq!(out[2 * (BLOCK + 5)], 2000 + (BLOCK + 5) as i16);
        let mut mono = vec![0i16; n + 2];
        render(&src, &Mapping::Mean(3), &mut mono, n + 2, AudioLayout::Interleaved);
        assert_eq!(mono[BLOCK + 1], 1000 + (BLOCK + 1) as i16);
        assert_eq!(&mono[n..], &[0, 0]);
        let planes = Mapping::Mean(3).to_planes(&src);
        assert_eq!(planes.frames(), n);
        assert_eq!(planes.planes[0][7] * 32768.0, 1007.0);
    }

    #[test]
    fn i16_conversion_saturates() {
        assert_eq!(i16::from_f32(1.5), i16::MAX);
        assert_eq!(i16::from_f32(-1.0), i16::MIN);
        assert_eq!(i16::from_f32(f32::NAN), 0);
        assert_eq!(i16::from_f32(-3.0 / 32768.0), -3);
    }
}
