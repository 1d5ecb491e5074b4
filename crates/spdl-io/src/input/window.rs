//! Which part of an input to read: a time range, for every timed medium (audio and video).

use crate::{Error, Result};

/// A time range of a media file, in seconds from its start.
///
/// Decoders seek to `start_s` (audio: to the packet before it, then drop the samples before `start_s`;
/// video: to the keyframe before it) instead of decoding from the beginning, when the container allows.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TimeWindow {
    /// Start, in seconds (`>= 0`).
    pub start_s: f64,
    /// Length, in seconds (`> 0`); `None` reads to the end.
    pub duration_s: Option<f64>,
}

impl TimeWindow {
    /// The window `[start_s, start_s + duration_s)`.
    pub fn new(start_s: f64, duration_s: f64) -> TimeWindow {
        TimeWindow { start_s, duration_s: Some(duration_s) }
    }

    /// From `start_s` to the end of the stream.
    pub fn from_start(start_s: f64) -> TimeWindow {
        TimeWindow { start_s, duration_s: None }
    }

    /// The end in seconds (`None`: the end of the stream).
    pub fn end_s(&self) -> Option<f64> {
        self.duration_s.map(|d| self.start_s + d)
    }

    /// Checks that the numbers make sense.
    pub fn validate(&self) -> Result<()> {
        if !self.start_s.is_finite() || self.start_s < 0.0 {
            return Err(Error::InvalidOptions(format!("window start {} s must be finite and >= 0", self.start_s)));
        }
        if let Some(d) = self.duration_s
            && (!d.is_finite() || d <= 0.0)
        {
            return Err(Error::InvalidOptions(format!("window duration {d} s must be finite and > 0")));
        }
        Ok(())
    }
}
