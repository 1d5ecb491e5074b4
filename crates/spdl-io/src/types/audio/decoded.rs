//! Planar `f32` scratch filled by the decoders (symphonia, FFmpeg), restricted to the time window.

use super::options::AudioLimits;
use super::render::Planes;
use crate::input::TimeWindow;
use crate::{Error, Result};

/// Gaps between packets (a damaged packet was skipped) up to this long are filled with silence so later
/// samples keep their time; longer jumps are closed up.
const MAX_GAP_S: f64 = 10.0;

/// The most frames per channel [`WindowCollector::reserve`] allocates from a stated duration (95 s at
/// 44.1 kHz, 16 MiB of `f32`): a tiny file whose header claims hours costs no more.
const MAX_RESERVE: u64 = 1 << 22;

/// A decoded window of a stream, at the source rate.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub planes: Planes,
    pub sample_rate: u32,
    /// Time of the first frame, in seconds.
    pub start_s: f64,
    pub codec: String,
    pub container: String,
}

impl Decoded {
    pub fn empty(channels: usize, sample_rate: u32, start_s: f64, codec: &str, container: &str) -> Decoded {
        Decoded {
            planes: Planes::new(vec![Vec::new(); channels]),
            sample_rate,
            start_s,
            codec: codec.to_owned(),
            container: container.to_owned(),
        }
    }
}

pub(crate) fn check_channels(item: &str, channels: usize, limits: &AudioLimits) -> Result<()> {
    if channels == 0 {
        return Err(Error::Decode { item: item.to_owned(), format: "audio".into(), cause: "0 channels".into() });
    }
    if channels as u64 > u64::from(limits.max_channels) {
        return Err(Error::LimitExceeded {
            item: item.to_owned(),
            what: "channels".into(),
            value: channels as u64,
            limit: limits.max_channels.into(),
        });
    }
    Ok(())
}

pub(crate) fn check_rate(item: &str, rate: u32, limits: &AudioLimits) -> Result<()> {
    if rate == 0 {
        return Err(Error::Decode { item: item.to_owned(), format: "audio".into(), cause: "sample rate 0 Hz".into() });
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

/// Keeps the decoded frames that fall in the window, checking the sample limit as it grows.
#[derive(Debug)]
pub(crate) struct WindowCollector {
    item: String,
    planes: Vec<Vec<f32>>,
    rate: u32,
    win_start: i64,
    win_end: i64,
    /// Frame index of the first kept frame.
    first: Option<i64>,
    max_samples: u64,
}

impl WindowCollector {
    pub fn new(
        item: &str,
        channels: usize,
        rate: u32,
        window: Option<&TimeWindow>,
        limits: &AudioLimits,
    ) -> WindowCollector {
        let r = f64::from(rate);
        let (win_start, win_end) = match window {
            None => (i64::MIN, i64::MAX),
            Some(w) => {
                let s = (w.start_s * r).round() as i64;
                (s, w.duration_s.map_or(i64::MAX, |d| s.saturating_add((d * r).round() as i64)))
            }
        };
        WindowCollector {
            item: item.to_owned(),
            planes: (0..channels).map(|_| super::render::spare_plane()).collect(),
            rate,
            win_start,
            win_end,
            first: None,
            max_samples: limits.max_samples,
        }
    }

    pub fn rate(&self) -> u32 {
        self.rate
    }

    pub fn channels(&self) -> usize {
        self.planes.len()
    }

    /// The part `[a, b)` of a packet of `n` frames starting at frame `start` that lies in the window.
    pub fn overlap(&self, start: i64, n: usize) -> Option<(usize, usize)> {
        let end = start.saturating_add(n as i64);
        let a = self.win_start.max(start);
        let b = self.win_end.min(end);
        (a < b).then(|| ((a - start) as usize, (b - start) as usize))
    }

    /// Drops every frame before `frame` (the encoder delay the container says to skip, now at negative
    /// positions), whatever the window.
    pub fn drop_before(&mut self, frame: i64) {
        self.win_start = self.win_start.max(frame);
    }

    /// True once decoding has reached the end of the window.
    pub fn done(&self, pos: i64) -> bool {
        pos >= self.win_end
    }

    /// Reserves room for about `frames` frames per channel (the stream's stated duration), clipped to the
    /// window and the sample limit, so that growing the planes does not move them.
    pub fn reserve(&mut self, frames: u64) {
        let window = u64::try_from(self.win_end.saturating_sub(self.win_start)).unwrap_or(u64::MAX);
        let per_channel = self.max_samples / (self.planes.len().max(1) as u64);
        // A stated duration is a hint: a few packets more or less than it are normal, and a header may lie,
        // so at most MAX_RESERVE frames are taken up front (longer clips grow as they decode).
        let frames = frames.min(window).min(per_channel).min(MAX_RESERVE).saturating_add(4096);
        for p in &mut self.planes {
            p.reserve(usize::try_from(frames).unwrap_or(0).saturating_sub(p.len()));
        }
    }

    /// Checks the sample limit and the gap for `len` frames that start at frame `at`; returns the silence
    /// to insert first and the planes' length once they are added.
    fn grow(&mut self, at: i64, len: usize) -> Result<(usize, usize)> {
        let have = self.planes.first().map_or(0, Vec::len);
        let gap = match self.first {
            None => {
                self.first = Some(at);
                0
            }
            Some(first) => {
                let expected = first.saturating_add(have as i64);
                let gap = at.saturating_sub(expected);
                if gap > 0 && (gap as f64) <= MAX_GAP_S * f64::from(self.rate) { gap as usize } else { 0 }
            }
        };
        let new_len = have + gap + len;
        let total = (new_len as u64).saturating_mul(self.planes.len() as u64);
        if total > self.max_samples {
            return Err(Error::LimitExceeded {
                item: self.item.clone(),
                what: "decoded samples".into(),
                value: total,
                limit: self.max_samples,
            });
        }
        Ok((gap, new_len))
    }

    /// Grows every plane by `len` frames that start at frame `at` and returns the new tails to fill.
    pub fn extend(&mut self, at: i64, len: usize) -> Result<Vec<&mut [f32]>> {
        let have = self.planes.first().map_or(0, Vec::len);
        let (gap, new_len) = self.grow(at, len)?;
        Ok(self
            .planes
            .iter_mut()
            .map(|p| {
                p.resize(new_len, 0.0);
                &mut p[have + gap..]
            })
            .collect())
    }

    /// Appends `len` frames that start at frame `at`: `push(channel, plane)` appends that channel's
    /// samples to `plane` (after any silence for a gap); a plane left short is padded with silence, a long
    /// one cut, so every plane ends `len` frames longer. Nothing is zeroed first. (The FFmpeg path's.)
    #[cfg(feature = "ffmpeg-linked")]
    pub fn append(&mut self, at: i64, len: usize, mut push: impl FnMut(usize, &mut Vec<f32>)) -> Result<()> {
        let have = self.planes.first().map_or(0, Vec::len);
        let (gap, new_len) = self.grow(at, len)?;
        for (c, p) in self.planes.iter_mut().enumerate() {
            p.resize(have + gap, 0.0);
            push(c, p);
            p.resize(new_len, 0.0);
        }
        Ok(())
    }

    pub fn finish(self, codec: &str, container: &str) -> Decoded {
        let r = f64::from(self.rate.max(1));
        let start_s = match self.first {
            Some(f) => f as f64 / r,
            None if self.win_start > i64::MIN => self.win_start as f64 / r,
            None => 0.0,
        };
        Decoded {
            planes: Planes::new(self.planes),
            sample_rate: self.rate,
            start_s,
            codec: codec.to_owned(),
            container: container.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_overlap_and_gaps() {
        let w = TimeWindow::new(1.0, 0.5);
        let mut c = WindowCollector::new("x", 1, 100, Some(&w), &AudioLimits::default());
        assert_eq!(c.overlap(0, 100), None);
        assert_eq!(c.overlap(90, 20), Some((10, 20)));
        assert_eq!(c.overlap(140, 20), Some((0, 10)));
        assert!(c.done(150) && !c.done(149));
        c.extend(100, 10).unwrap().iter_mut().for_each(|t| t.fill(1.0));
        c.extend(115, 5).unwrap().iter_mut().for_each(|t| t.fill(2.0)); // 5-frame gap becomes silence
        let d = c.finish("pcm", "wav");
        assert_eq!(d.start_s, 1.0);
        assert_eq!(d.planes.planes[0][9..16], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0]);
    }

    #[test]
    fn sample_limit() {
        let limits = AudioLimits { max_samples: 10, ..AudioLimits::default() };
        let mut c = WindowCollector::new("x", 2, 100, None, &limits);
        assert!(c.extend(0, 5).is_ok());
        assert!(matches!(c.extend(5, 1), Err(Error::LimitExceeded { value: 12, .. })));
    }

    #[test]
    #[cfg(feature = "ffmpeg-linked")]
    fn append_pads_cuts_and_fills_gaps_and_reserve_is_bounded() {
        let mut c = WindowCollector::new("x", 2, 100, None, &AudioLimits::default());
        // A header claiming years reserves no more than MAX_RESERVE (+ slack).
        c.reserve(u64::MAX);
        assert!(c.planes.iter().all(|p| p.capacity() <= (MAX_RESERVE + 4096) as usize));
        c.append(0, 3, |ch, p| p.extend_from_slice(if ch == 0 { &[1.0, 1.0, 1.0] } else { &[2.0] })).unwrap();
        // A 2-frame gap becomes silence; a channel that pushes too much is cut to the frame count.
        c.append(5, 2, |_, p| p.extend_from_slice(&[3.0, 3.0, 3.0, 3.0])).unwrap();
        let d = c.finish("mp3", "mp3");
        assert_eq!(d.planes.planes[0], [1.0, 1.0, 1.0, 0.0, 0.0, 3.0, 3.0]);
        assert_eq!(d.planes.planes[1], [2.0, 0.0, 0.0, 0.0, 0.0, 3.0, 3.0]);
    }
}
