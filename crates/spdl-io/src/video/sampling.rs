//! Frame sampling: which frames of a window come out, decided from their timestamps before decoding.

use super::FrameSampling;

/// The frame keys to output, non-decreasing (repeats allowed), from the frame keys of the window.
pub(crate) fn select_keys(
    keys: &[i64],
    time: impl Fn(i64) -> f64,
    sampling: FrameSampling,
    window: (f64, Option<f64>),
) -> Vec<i64> {
    let count = keys.len();
    if count == 0 {
        return Vec::new();
    }
    match sampling {
        FrameSampling::All => keys.to_vec(),
        FrameSampling::Every(k) => keys.iter().step_by(k.max(1)).copied().collect(),
        FrameSampling::Uniform(n) => (0..n)
            .filter_map(|i| {
                let idx = if n == 1 { 0 } else { ((i * (count - 1)) as f64 / (n - 1) as f64).round() as usize };
                keys.get(idx).copied()
            })
            .collect(),
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
            let eps = 1e-6;
            let mut out = Vec::new();
            let mut j = 0usize;
            // Bounded by the limits: at most max_frames ticks are considered below.
            for i in 0u64.. {
                let t = t0 + i as f64 / fps;
                if t >= t_end - eps || out.len() >= 1 << 20 {
                    break;
                }
                while j + 1 < times.len() && times[j + 1] <= t + eps {
                    j += 1;
                }
                out.push(keys[j]);
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection() {
        let keys: Vec<i64> = (0..10).map(|i| i * 100).collect();
        let t = |k: i64| k as f64 / 1000.0; // 10 fps
        assert_eq!(select_keys(&keys, t, FrameSampling::Every(3), (0.0, None)), vec![0, 300, 600, 900]);
        assert_eq!(select_keys(&keys, t, FrameSampling::Uniform(4), (0.0, None)), vec![0, 300, 600, 900]);
        assert_eq!(select_keys(&keys, t, FrameSampling::Uniform(1), (0.0, None)), vec![0]);
        assert_eq!(select_keys(&keys[..2], t, FrameSampling::Uniform(3), (0.0, None)), vec![0, 100, 100]);
        assert_eq!(select_keys(&keys, t, FrameSampling::Fps(5.0), (0.0, None)), vec![0, 200, 400, 600, 800]);
        assert_eq!(select_keys(&keys, t, FrameSampling::Fps(20.0), (0.0, None)).len(), 20);
        assert_eq!(select_keys(&keys[2..6], t, FrameSampling::Fps(5.0), (0.2, Some(0.6))), vec![200, 400]);
        assert!(select_keys(&[], t, FrameSampling::All, (0.0, None)).is_empty());
    }
}
