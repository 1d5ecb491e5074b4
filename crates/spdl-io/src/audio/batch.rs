//! Batch decoding: N clips into one `[N, C, T]` (or `[N, T, C]`) buffer, each clip padded or truncated to
//! the same length and written straight into its slot, on scoped threads.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use spdl_buffer::{Buffer, DType, SharedAllocator};

use super::{AudioLayout, AudioOptions, Clip, MediaInput, SampleType, open_clip, plan, render_clip};
use crate::types::audio::render::OutSample;
use crate::{Error, Result};

/// How to decode a batch of clips.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioBatchOptions {
    /// Per-clip options (window, rate, channels, sample type, layout, limits). Its `num_frames` is ignored:
    /// the batch's [`Self::num_frames`] applies.
    pub audio: AudioOptions,
    /// Every clip is padded with zeros or truncated to this many frames (at the output rate).
    pub num_frames: usize,
    /// `true` (default): any failed clip fails the call with [`Error::BatchItem`]. `false`: failed slots
    /// stay zero and are listed in [`AudioBatch::failures`].
    pub strict: bool,
    /// Decoding threads, the caller's included: `Some(1)` decodes on the caller's thread; `None` uses the
    /// available parallelism.
    pub threads: Option<usize>,
}

impl Default for AudioBatchOptions {
    fn default() -> Self {
        AudioBatchOptions { audio: AudioOptions::default(), num_frames: 16_000, strict: true, threads: None }
    }
}

/// A decoded batch.
#[derive(Debug)]
#[non_exhaustive]
pub struct AudioBatch {
    /// `[N, C, T]` ([`spdl_buffer::Layout::Nct`]) or `[N, T, C]` ([`spdl_buffer::Layout::Ntc`]).
    pub buffer: Buffer,
    /// Sample rate of every clip, in Hz (0 if no clip decoded and none was asked for).
    pub sample_rate: u32,
    /// Frames of each clip that hold decoded audio (the rest of its slot is zero padding).
    pub frames: Vec<usize>,
    /// Clips that failed, in input order (only with `strict: false`), each an [`Error::BatchItem`] with
    /// the clip's position ([`Error::batch_item`]) and name ([`Error::item`]); their slots are zero.
    pub failures: Vec<Error>,
}

/// Decodes `inputs` into one batch buffer from `allocator`.
///
/// The channel count is fixed by [`AudioOptions::channels`] (`Mono`, `Pick`) or, with `All`, by the first
/// clip that decodes; the sample rate by [`AudioOptions::sample_rate`] or the first clip. A clip that does
/// not match (another channel count or rate) is a failed item.
///
/// ```
/// use spdl_buffer::{Layout, system_allocator};
/// use spdl_io::audio::{AudioBatchOptions, AudioOptions, ChannelSelect, decode_audio_batch, encode_wav_i16};
/// use spdl_io::MediaInput;
///
/// let short = encode_wav_i16(&[1000; 800], 1, 8000); // 0.1 s
/// let long = encode_wav_i16(&[-1000; 8000], 1, 8000); // 1 s
/// let inputs = [MediaInput::bytes(&short, "short.wav"), MediaInput::bytes(&long, "long.wav")];
/// let opts = AudioBatchOptions {
///     audio: AudioOptions { channels: ChannelSelect::Mono, ..AudioOptions::default() },
///     num_frames: 4000,
///     ..AudioBatchOptions::default()
/// };
/// let batch = decode_audio_batch(&inputs, &opts, &system_allocator())?;
/// assert_eq!(batch.buffer.shape(), &[2, 1, 4000]);
/// assert_eq!(batch.buffer.layout(), Layout::Nct);
/// assert_eq!(batch.frames, vec![800, 4000]); // padded, truncated
/// let v = batch.buffer.as_slice::<f32>()?;
/// assert_eq!((v[799], v[800], v[4000]), (1000.0 / 32768.0, 0.0, -1000.0 / 32768.0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn decode_audio_batch(
    inputs: &[MediaInput<'_>],
    opts: &AudioBatchOptions,
    allocator: &SharedAllocator,
) -> Result<AudioBatch> {
    let mut audio = opts.audio.clone();
    audio.num_frames = Some(opts.num_frames);
    audio.validate()?;
    if opts.threads == Some(0) {
        return Err(Error::InvalidOptions("threads must be at least 1".into()));
    }
    match audio.sample_type {
        SampleType::F32 => run::<f32>(inputs, &audio, opts, DType::F32, allocator),
        SampleType::I16 => run::<i16>(inputs, &audio, opts, DType::I16, allocator),
    }
}

type Outcome = std::result::Result<usize, Error>;

fn run<T: OutSample>(
    inputs: &[MediaInput<'_>],
    audio: &AudioOptions,
    opts: &AudioBatchOptions,
    dtype: DType,
    allocator: &SharedAllocator,
) -> Result<AudioBatch> {
    let n = inputs.len();
    let mut outcomes: Vec<Option<Outcome>> = (0..n).map(|_| None).collect();
    let mut channels = audio.channels.fixed_channels();
    let mut rate = audio.sample_rate;
    // Without a fixed channel count or rate, the first clip that opens decides; it is kept and rendered
    // into its slot below, so it is decoded once.
    let mut first: Option<(usize, Clip<'_>)> = None;
    if channels.is_none() || rate.is_none() {
        for (i, input) in inputs.iter().enumerate() {
            match open_clip(input, audio) {
                Ok(clip) => {
                    channels = channels.or(Some(clip.channels()));
                    rate = rate.or(Some(clip.rate()));
                    first = Some((i, clip));
                    break;
                }
                Err(e) if opts.strict => return Err(Error::BatchItem { index: i, source: Box::new(e) }),
                Err(e) => outcomes[i] = Some(Err(e)),
            }
        }
    }
    let channels = channels.unwrap_or(0);
    let rate = rate.unwrap_or(0);
    // Bounded before the buffer exists: one clip's slot by the per-clip sample limit, the whole batch by
    // the decode memory budget (a batch whose every clip failed must not still cost gigabytes of zeros).
    let slot = (opts.num_frames as u64).saturating_mul(channels.max(1) as u64);
    if slot > audio.limits.max_samples {
        return Err(Error::InvalidOptions(format!(
            "num_frames {} x {} channels is {slot} samples per clip, above AudioLimits::max_samples {}",
            opts.num_frames,
            channels.max(1),
            audio.limits.max_samples
        )));
    }
    let batch_bytes = slot.saturating_mul(n as u64).saturating_mul(dtype.size() as u64);
    crate::decode_memory::check_fits(&format!("a batch of {n} clips"), "batch buffer bytes", batch_bytes)?;
    let dims = match audio.layout {
        AudioLayout::ChannelsFirst => [n, channels, opts.num_frames],
        AudioLayout::Interleaved => [n, opts.num_frames, channels],
    };
    let mut buffer = Buffer::zeros(dtype, &dims, audio.layout.batch_layout(), allocator)?;
    {
        let slots: Vec<Mutex<Option<&mut [T]>>> =
            buffer.outer_slots_mut_as::<T>()?.into_iter().map(|s| Mutex::new(Some(s))).collect();
        let take = |i: usize| slots.get(i).and_then(|m| m.lock().unwrap_or_else(PoisonError::into_inner).take());
        let decode_one = |i: usize, preopened: Option<Clip<'_>>| -> Outcome {
            let input = inputs.get(i).ok_or_else(|| Error::InvalidOptions(format!("no input {i}")))?;
            let item = input.name();
            let clip = match preopened {
                Some(c) => c,
                None => open_clip(input, audio)?,
            };
            let (map, plan) = plan(&clip, audio, &item)?;
            if plan.channels != channels {
                return Err(Error::InvalidOptions(format!(
                    "{item}: {} output channels, the batch has {channels} (set AudioOptions::channels)",
                    plan.channels
                )));
            }
            if plan.out_rate != rate {
                return Err(Error::InvalidOptions(format!(
                    "{item}: sample rate {} Hz, the batch has {rate} Hz (set AudioOptions::sample_rate)",
                    plan.out_rate
                )));
            }
            let slot = take(i).ok_or_else(|| Error::InvalidOptions(format!("{item}: batch slot {i} missing")))?;
            let result = render_clip(&clip, &map, &plan, audio.layout, slot, &item);
            if result.is_err() {
                slot.fill(T::default());
            }
            result
        };
        if let Some((i, clip)) = first {
            outcomes[i] = Some(decode_one(i, Some(clip)));
        }
        let todo: Vec<usize> = (0..n).filter(|&i| outcomes[i].is_none()).collect();
        let workers = opts
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |p| p.get()))
            .clamp(1, todo.len().max(1));
        if workers == 1 {
            for &i in &todo {
                let outcome = decode_one(i, None);
                let stop = opts.strict && outcome.is_err();
                outcomes[i] = Some(outcome);
                if stop {
                    break;
                }
            }
        } else {
            // Work-stealing by index: clips differ in length, so a shared counter balances better than
            // fixed chunks.
            let next = AtomicUsize::new(0);
            // Strict mode: after the first failure the batch has no output, so stop taking work.
            let failed = AtomicBool::new(false);
            let results: Vec<Vec<(usize, Outcome)>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..workers)
                    .map(|_| {
                        s.spawn(|| {
                            let mut done = Vec::new();
                            while let Some(&i) = todo.get(next.fetch_add(1, Ordering::Relaxed)) {
                                if failed.load(Ordering::Relaxed) {
                                    break;
                                }
                                let outcome = decode_one(i, None);
                                if opts.strict && outcome.is_err() {
                                    failed.store(true, Ordering::Relaxed);
                                }
                                done.push((i, outcome));
                            }
                            done
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            vec![] // decoders run under catch_unwind; a worker panic leaves its items undone
                        })
                    })
                    .collect()
            });
            for (i, o) in results.into_iter().flatten() {
                outcomes[i] = Some(o);
            }
        }
    }
    if opts.strict
        && let Some(i) = outcomes.iter().position(|o| matches!(o, Some(Err(_))))
        && let Some(Some(Err(e))) = outcomes.get_mut(i).map(Option::take)
    {
        return Err(Error::BatchItem { index: i, source: Box::new(e) });
    }
    let mut frames = vec![0; n];
    let mut failures = Vec::new();
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let name = || inputs.get(i).map(|x| x.name().into_owned()).unwrap_or_default();
        match outcome {
            Some(Ok(f)) => frames[i] = f,
            Some(Err(e)) if opts.strict => return Err(Error::BatchItem { index: i, source: Box::new(e) }),
            Some(Err(error)) => failures.push(Error::BatchItem { index: i, source: Box::new(error) }),
            None => {
                let error =
                    Error::Decode { item: name(), format: "audio".into(), cause: "worker thread panicked".into() };
                if opts.strict {
                    return Err(Error::BatchItem { index: i, source: Box::new(error) });
                }
                failures.push(Error::BatchItem { index: i, source: Box::new(error) });
            }
        }
    }
    Ok(AudioBatch { buffer, sample_rate: rate, frames, failures })
}
