//! Options for audio decoding: time window, rate, channels, sample type, layout, limits.

use crate::{Error, Result};

use crate::input::TimeWindow;

/// Which channels come out, and how.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ChannelSelect {
    /// Every channel of the source, in its order (default).
    #[default]
    All,
    /// One channel: the mean of all source channels (mix-down).
    Mono,
    /// The listed source channels (0-based), in this order; an index may repeat (e.g. mono to stereo
    /// with `[0, 0]`).
    Pick(Vec<usize>),
}

impl ChannelSelect {
    /// The number of output channels for a source with `source` channels (`None` if a picked index does
    /// not exist in the source).
    pub fn output_channels(&self, source: usize) -> Option<usize> {
        match self {
            ChannelSelect::All => Some(source),
            ChannelSelect::Mono => Some(1),
            ChannelSelect::Pick(v) => v.iter().all(|&c| c < source).then_some(v.len()),
        }
    }

    /// The number of output channels when it does not depend on the source.
    pub fn fixed_channels(&self) -> Option<usize> {
        match self {
            ChannelSelect::All => None,
            ChannelSelect::Mono => Some(1),
            ChannelSelect::Pick(v) => Some(v.len()),
        }
    }
}

/// Element type of the output samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum SampleType {
    /// `f32` in `[-1, 1]` (default).
    #[default]
    F32,
    /// `i16`: full scale is `[-32768, 32767]`; float sources are rounded and clipped.
    I16,
}

/// Axis order of the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum AudioLayout {
    /// Channels first, `[C, T]` (batches: `[N, C, T]`), as torchaudio (default).
    #[default]
    ChannelsFirst,
    /// Interleaved, `[T, C]` (batches: `[N, T, C]`), as soundfile and SPDL.
    Interleaved,
}

impl AudioLayout {
    /// The buffer layout of one clip.
    pub fn clip_layout(self) -> spdl_buffer::Layout {
        match self {
            AudioLayout::ChannelsFirst => spdl_buffer::Layout::Ct,
            AudioLayout::Interleaved => spdl_buffer::Layout::Tc,
        }
    }

    /// The buffer layout of a batch.
    pub fn batch_layout(self) -> spdl_buffer::Layout {
        self.clip_layout().batched()
    }
}

/// Which decoder reads the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum AudioBackend {
    /// The WAV fast path for PCM WAV, symphonia for the rest, and FFmpeg (feature `ffmpeg`) for what
    /// symphonia cannot read (audio in video containers, Opus, ...) and for MP3 and Ogg Vorbis read from
    /// their start, which it decodes faster (symphonia then is their fallback). Default.
    #[default]
    Auto,
    /// Symphonia only, even for PCM WAV (no fast path, no FFmpeg fallback).
    Symphonia,
    /// FFmpeg only (feature `ffmpeg`; an error without it).
    Ffmpeg,
}

/// Upper bounds on the work and memory one input may cost: malformed or hostile files (a tiny FLAC that
/// expands to hours of silence, a header claiming 2^32 channels) stop with [`Error::LimitExceeded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AudioLimits {
    /// Decoded samples kept, all channels together, before resampling (default 2^28: 1 GiB of `f32`,
    /// 46 minutes of 48 kHz stereo).
    pub max_samples: u64,
    /// Packets read from the container, including those skipped before the window (default 2^24).
    pub max_packets: u64,
    /// Source channels (default 64).
    pub max_channels: u32,
    /// Source sample rate in Hz (default 768 000).
    pub max_sample_rate: u32,
    /// Consecutive packets that fail to decode before the input is declared corrupt (default 64).
    pub max_bad_packets: u32,
    /// Memory the resampler may hold, in bytes (default 256 MiB). Its FFT lengths grow with the ratio of
    /// the rates, not with the data: a header claiming 1 Hz resampled to 44.1 kHz would need gigabytes.
    /// Every ordinary pair of rates (8 kHz to 768 kHz, 44.1 kHz to 48 kHz) needs a few MB.
    pub max_resampler_bytes: u64,
}

impl Default for AudioLimits {
    fn default() -> Self {
        AudioLimits {
            max_samples: 1 << 28,
            max_packets: 1 << 24,
            max_channels: 64,
            max_sample_rate: 768_000,
            max_bad_packets: 64,
            max_resampler_bytes: 256 << 20,
        }
    }
}

/// How to decode one clip.
///
/// ```
/// use spdl_io::audio::{AudioLayout, AudioOptions, ChannelSelect, SampleType};
/// use spdl_io::TimeWindow;
///
/// // 2 s from 1.5 s in, mixed to mono, resampled to 16 kHz, i16, interleaved.
/// let opts = AudioOptions {
///     window: Some(TimeWindow::new(1.5, 2.0)),
///     sample_rate: Some(16_000),
///     channels: ChannelSelect::Mono,
///     sample_type: SampleType::I16,
///     layout: AudioLayout::Interleaved,
///     ..AudioOptions::default()
/// };
/// opts.validate()?;
/// # Ok::<(), spdl_io::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AudioOptions {
    /// Part of the stream to decode (`None`: all of it).
    pub window: Option<TimeWindow>,
    /// Output sample rate in Hz (`None`: the source's). Resampling uses rubato's FFT resampler; the
    /// output length is `ceil(frames * out_rate / in_rate)`.
    pub sample_rate: Option<u32>,
    /// Channel selection or mix-down.
    pub channels: ChannelSelect,
    /// `f32` or `i16` output.
    pub sample_type: SampleType,
    /// `[C, T]` or `[T, C]` output.
    pub layout: AudioLayout,
    /// Pad with zeros or truncate the output to exactly this many frames (at the output rate).
    pub num_frames: Option<usize>,
    /// Which decoder to use.
    pub backend: AudioBackend,
    /// Bounds on work and memory.
    pub limits: AudioLimits,
}

impl Default for AudioOptions {
    fn default() -> Self {
        AudioOptions {
            window: None,
            sample_rate: None,
            channels: ChannelSelect::All,
            sample_type: SampleType::F32,
            layout: AudioLayout::ChannelsFirst,
            num_frames: None,
            backend: AudioBackend::Auto,
            limits: AudioLimits::default(),
        }
    }
}

impl AudioOptions {
    /// Checks the options that do not depend on the input.
    pub fn validate(&self) -> Result<()> {
        if let Some(w) = &self.window {
            w.validate()?;
        }
        if let Some(sr) = self.sample_rate
            && (sr == 0 || sr > self.limits.max_sample_rate)
        {
            return Err(Error::InvalidOptions(format!(
                "sample rate {sr} Hz must be in 1..={} (AudioLimits::max_sample_rate)",
                self.limits.max_sample_rate
            )));
        }
        if let ChannelSelect::Pick(v) = &self.channels
            && v.is_empty()
        {
            return Err(Error::InvalidOptions("ChannelSelect::Pick needs at least one channel".into()));
        }
        if let Some(n) = self.num_frames
            && let Some(c) = self.channels.fixed_channels()
            && (n as u64).saturating_mul(c as u64) > self.limits.max_samples
        {
            return Err(Error::InvalidOptions(format!(
                "num_frames {n} x {c} channels exceeds AudioLimits::max_samples {}",
                self.limits.max_samples
            )));
        }
        #[cfg(not(feature = "ffmpeg"))]
        if self.backend == AudioBackend::Ffmpeg {
            return Err(Error::InvalidOptions("AudioBackend::Ffmpeg needs spdl-io's `ffmpeg` feature".into()));
        }
        Ok(())
    }
}
