//! Frame sampling: which frames of a window come out, decided from their timestamps before decoding.
//!
//! The length of a selection comes from an argument (`Uniform(n)`, `Fps(f)`), so it is computed first and
//! held to a bound before anything is allocated: `Uniform(10^9)` used to build a 10^9-entry vector (8 GB)
//! before the output-size check could refuse it.
// The FFmpeg backend (`ffmpeg-linked`) samples with these; the run-time loader only holds the API.
#![cfg_attr(not(feature = "ffmpeg-linked"), allow(dead_code))]

use super::video::FrameSampling;

/// The number of frames `sampling` selects from `count` keys whose ticks span `span_s` seconds (used by
/// `Fps` only), computed without building the selection; `u64::MAX` when it does not fit.
pub(crate) fn selection_len(count: usize, sampling: FrameSampling, span_s: f64) -> u64 {
    if count == 0 {
        return 0;
    }
    match sampling {
        FrameSampling::All => count as u64,
        FrameSampling::Every(k) => count.div_ceil(k.max(1)) as u64,
        FrameSampling::Uniform(n) => n as u64,
        FrameSampling::Fps(fps) => {
            let ticks = (span_s.max(0.0) * fps).ceil();
            if ticks.is_finite() && ticks < u64::MAX as f64 { (ticks as u64).max(1) } else { u64::MAX }
        }
    }
}

/// The frame keys to output, non-decreasing (repeats allowed), from the sorted frame keys of the window.
/// At most `max` entries: a longer selection is `Err(its length)`, before it is built.
pub(crate) fn select_keys<K: Copy>(
    keys: &[K],
    time: impl Fn(K) -> f64,
    sampling: FrameSampling,
    window: (f64, Option<f64>),
    max: u64,
) -> Result<Vec<K>, u64> {
    let count = keys.len();
    if count == 0 {
        return Ok(Vec::new());
    }
    let check = |len: u64| if len > max { Err(len) } else { Ok(()) };
    Ok(match sampling {
        FrameSampling::All => {
            check(count as u64)?;
            keys.to_vec()
        }
        FrameSampling::Every(k) => {
            check(selection_len(count, sampling, 0.0))?;
            keys.iter().step_by(k.max(1)).copied().collect()
        }
        FrameSampling::Uniform(n) => {
            check(n as u64)?;
            (0..n)
                .filter_map(|i| {
                    let idx = if n == 1 { 0 } else { ((i * (count - 1)) as f64 / (n - 1) as f64).round() as usize };
                    keys.get(idx).copied()
                })
                .collect()
        }
        FrameSampling::Fps(fps) => {
            let times: Vec<f64> = keys.iter().map(|&k| time(k)).collect();
            let first = times.first().copied().unwrap_or(0.0);
            let last = times.last().copied().unwrap_or(0.0);
            // The last frame lasts one source frame interval (the median gap), or one output tick.
            let mut gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
            gaps.sort_by(f64::total_cmp);
            let frame_dur = gaps.get(gaps.len() / 2).copied().unwrap_or(1.0 / fps);
            let t0 = if window.0 > 0.0 { window.0 } else { first };
            let t_end = window.1.unwrap_or(last + frame_dur).min(last + frame_dur);
            check(selection_len(count, sampling, t_end - t0))?;
            let eps = 1e-6;
            let mut out = Vec::new();
            let mut j = 0usize;
            // At most `max` ticks (checked above, from the span).
            for i in 0u64..=max {
                let t = t0 + i as f64 / fps;
                if t >= t_end - eps {
                    break;
                }
                while j + 1 < times.len() && times[j + 1] <= t + eps {
                    j += 1;
                }
                out.push(keys[j]);
            }
            out
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    #[test]
    fn selection() {
        let keys: Vec<i64> = (0..10).map(|i| i * 100).collect();
        let t = |k: i64| k as f64 / 1000.0; // 10 fps
        assert_eq!(select_keys(&keys, t, FrameSampling::Every(3), (0.0, None), M), Ok(vec![0, 300, 600, 900]));
        assert_eq!(select_keys(&keys, t, FrameSampling::Uniform(4), (0.0, None), M), Ok(vec![0, 300, 600, 900]));
        assert_eq!(select_keys(&keys, t, FrameSampling::Uniform(1), (0.0, None), M), Ok(vec![0]));
        assert_eq!(select_keys(&keys[..2], t, FrameSampling::Uniform(3), (0.0, None), M), Ok(vec![0, 100, 100]));
        assert_eq!(select_keys(&keys, t, FrameSampling::Fps(5.0), (0.0, None), M), Ok(vec![0, 200, 400, 600, 800]));
        assert_eq!(select_keys(&keys, t, FrameSampling::Fps(20.0), (0.0, None), M).map(|v| v.len()), Ok(20));
        assert_eq!(select_keys(&keys[2..6], t, FrameSampling::Fps(5.0), (0.2, Some(0.6)), M), Ok(vec![200, 400]));
        assert!(select_keys(&[], t, FrameSampling::All, (0.0, None), M).is_ok_and(|v| v.is_empty()));
    }

    #[test]
    fn huge_selections_are_refused_before_they_are_built() {
        let keys: Vec<i64> = (0..10).collect();
        let t = |k: i64| k as f64 / 10.0;
        assert_eq!(select_keys(&keys, t, FrameSampling::Uniform(1_000_000_000), (0.0, None), M), Err(1_000_000_000));
        assert_eq!(select_keys(&keys, t, FrameSampling::Fps(1e12), (0.0, None), M), Err(1_000_000_000_000));
        assert_eq!(select_keys(&keys, t, FrameSampling::All, (0.0, None), 9), Err(10));
        assert_eq!(selection_len(10, FrameSampling::Every(3), 0.0), 4);
    }
}
