//! Clips: many short runs of frames from one video, each GOP decoded once for every clip that needs it.
//!
//! A [`ClipRequest`] names where clips start (frame indices or times), how many frames each has, and how far
//! apart they are (a stride in frames or a target fps). [`plan_clips`] turns it, with the packets of the video
//! ([`super::demux_video`] over the whole stream), into a [`ClipPlan`]: the frames to keep, in presentation
//! order, and the runs of packets that hold them, each from the keyframe it needs. [`decode_clips`] then
//! decodes each run once, in order, and serves every clip from the same decoded frames:
//!
//! - packets of frames that no clip keeps are sent with FFmpeg's `skip_frame` at "non-reference", so the
//!   decoder drops them where the codec can tell they are not needed by any other frame;
//! - packets past the last kept frame of a run, and runs no clip needs, are never sent;
//! - only kept frames are converted, in one swscale pass (conversion and resize together) straight into
//!   their slot of one `[clips, frames, H, W, C]` buffer; a frame that several clips share is converted once
//!   and copied.
//!
//! Frames are identified by their presentation timestamp (and, among equal timestamps, their place in decode
//! order), not by the order they come out of the decoder, so files whose timestamps go backwards or zigzag
//! lose no frame: every kept frame comes out, or the call fails naming how many did not. Frames before the
//! first keyframe (in decode order) cannot be decoded and are not part of the video's frame indices. Requests are checked
//! against [`VideoLimits`] (frames and output bytes) before anything is allocated.
//!
//! [`ClipSampler`] picks clip starts from a seed and the video alone (random or regular, by index or by
//! time, or every frame at an fps).

use spdl_buffer::{Buffer, DType, Layout, SharedAllocator};

use crate::input::MediaInput;
pub use crate::types::clips::{ClipOptions, ClipPlan, ClipStats};
use crate::types::clips::{FrameMatch, KeptFrame};
use crate::types::media::{Packets, ts_seconds};
use crate::{Error, Result};

/// Where each clip starts.
#[derive(Debug, Clone, PartialEq)]
pub enum ClipStarts {
    /// Frame indices, in presentation order from the first decodable frame (0).
    Indices(Vec<u64>),
    /// Presentation times in seconds: a clip starts at the frame on screen then.
    Times(Vec<f64>),
}

impl ClipStarts {
    /// Number of clips.
    pub fn len(&self) -> usize {
        match self {
            ClipStarts::Indices(v) => v.len(),
            ClipStarts::Times(v) => v.len(),
        }
    }

    /// True when no clip is asked for.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How far apart the frames of a clip are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ClipStep {
    /// Every `k`-th frame from the start (`k >= 1`; 1: consecutive frames).
    Stride(usize),
    /// A target rate: frame `i` is the one on screen at `start + i / fps` (frames repeat above the source
    /// rate, and are skipped below it).
    Fps(f64),
}

impl Default for ClipStep {
    fn default() -> Self {
        ClipStep::Stride(1)
    }
}

/// What a clip does when it runs past the last frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PastEnd {
    /// Fail, naming the clip (default).
    #[default]
    Error,
    /// Repeat the clip's last frame (torchcodec's `"repeat_last"`).
    RepeatLast,
    /// Start the clip's frames over (torchcodec's `"wrap"`).
    Wrap,
}

impl PastEnd {
    /// The policy named `name`: `"error"`, `"repeat_last"` or `"wrap"`.
    pub fn from_name(name: &str) -> Result<PastEnd> {
        match name {
            "error" => Ok(PastEnd::Error),
            "repeat_last" | "pad" => Ok(PastEnd::RepeatLast),
            "wrap" => Ok(PastEnd::Wrap),
            other => Err(Error::InvalidOptions(format!(
                "past-the-end policy must be \"error\", \"repeat_last\" or \"wrap\", got {other:?}"
            ))),
        }
    }
}

/// The clips to take from one video.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipRequest {
    /// Where each clip starts.
    pub starts: ClipStarts,
    /// Frames per clip (`>= 1`).
    pub num_frames: usize,
    /// How far apart a clip's frames are.
    pub step: ClipStep,
    /// What a clip does past the last frame.
    pub past_end: PastEnd,
}

impl ClipRequest {
    /// Checks what does not depend on the video.
    pub fn validate(&self) -> Result<()> {
        if self.num_frames == 0 {
            return Err(Error::InvalidOptions("num_frames must be >= 1".into()));
        }
        match self.step {
            ClipStep::Stride(0) => return Err(Error::InvalidOptions("stride must be >= 1".into())),
            ClipStep::Fps(f) if !(f.is_finite() && f > 0.0) => {
                return Err(Error::InvalidOptions(format!("fps must be finite and > 0, got {f}")));
            }
            _ => {}
        }
        if let ClipStarts::Times(ts) = &self.starts
            && let Some(t) = ts.iter().find(|t| !t.is_finite() || **t < 0.0)
        {
            return Err(Error::InvalidOptions(format!("clip start times must be finite and >= 0, got {t}")));
        }
        Ok(())
    }
}

/// Decoded clips.
#[derive(Debug)]
#[non_exhaustive]
pub struct Clips {
    /// `[clips, frames, H, W, C]` `u8`.
    pub buffer: Buffer,
    /// Frame index (presentation order) of each frame, clip-major.
    pub indices: Vec<u64>,
    /// Presentation time (seconds) of each frame, clip-major.
    pub pts_s: Vec<f64>,
    /// Average frame rate of the source, if stated.
    pub frame_rate: Option<f64>,
    /// Codec short name.
    pub codec: String,
    /// The item (path or name).
    pub item: String,
    /// What decoding did.
    pub stats: ClipStats,
}

/// The frames of a video in presentation order, from its packets: what plans and samplers index.
#[derive(Debug, Clone)]
pub struct Timeline {
    item: String,
    matching: FrameMatch,
    /// Per frame in presentation order: (timestamp, packet index in decode order).
    frames: Vec<(i64, usize)>,
    /// Per frame: presentation time in seconds.
    times: Vec<f64>,
    /// How long the last frame lasts (the median frame interval), seconds.
    frame_dur: f64,
    /// Decode-order indices of the keyframe packets that start decodable runs, ascending.
    keys: Vec<usize>,
    /// The keys' timestamps rise in decode order (runs can start at any of them).
    keys_monotonic: bool,
    known_ts: Vec<i64>,
    num_packets: usize,
}

impl Timeline {
    /// The timeline of `packets` (the whole stream, as [`super::demux_video`] reads it without a window).
    pub fn new(packets: &Packets) -> Timeline {
        let ps = &packets.packets;
        let tb = packets.codec.time_base;
        let with_ts = ps.iter().filter(|p| p.time().is_some()).count();
        let matching = if !ps.is_empty() && with_ts * 2 >= ps.len() { FrameMatch::Pts } else { FrameMatch::Ordinal };
        let fps = packets.frame_rate.filter(|r| *r > 0.0);
        if matching == FrameMatch::Ordinal {
            let frames: Vec<(i64, usize)> = (0..ps.len()).map(|i| (i as i64, i)).collect();
            let times = (0..ps.len()).map(|i| fps.map_or(i as f64, |r| i as f64 / r)).collect();
            return Timeline {
                item: packets.item.clone(),
                matching,
                frames,
                times,
                frame_dur: fps.map_or(1.0, |r| 1.0 / r),
                keys: vec![0],
                keys_monotonic: true,
                known_ts: Vec::new(),
                num_packets: ps.len(),
            };
        }
        let first_key = ps.iter().position(|p| p.key && p.time().is_some());
        // Frames from the first keyframe on, in decode order (those before it cannot be decoded).
        let start = first_key.unwrap_or(0);
        let mut frames: Vec<(i64, usize)> =
            ps.iter().enumerate().skip(start).filter_map(|(i, p)| p.time().map(|t| (t, i))).collect();
        frames.sort_unstable();
        let times: Vec<f64> = frames.iter().map(|&(t, _)| ts_seconds(t, tb)).collect();
        let mut gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).filter(|g| *g > 0.0).collect();
        gaps.sort_by(f64::total_cmp);
        let frame_dur = gaps.get(gaps.len() / 2).copied().or(fps.map(|r| 1.0 / r)).unwrap_or(1.0 / 30.0);
        let keys: Vec<usize> = match first_key {
            Some(k) => (k..ps.len()).filter(|&i| ps[i].key && ps[i].time().is_some()).collect(),
            None => vec![0],
        };
        let keys_monotonic = keys.windows(2).all(|w| ps[w[0]].time() < ps[w[1]].time());
        let mut known_ts: Vec<i64> = ps.iter().filter_map(|p| p.time()).collect();
        known_ts.sort_unstable();
        known_ts.dedup();
        Timeline {
            item: packets.item.clone(),
            matching,
            frames,
            times,
            frame_dur,
            keys,
            keys_monotonic,
            known_ts,
            num_packets: ps.len(),
        }
    }

    /// Number of frames (from the first keyframe).
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// True when the video has no decodable frame.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Presentation time (seconds) of each frame, in presentation order.
    pub fn times(&self) -> &[f64] {
        &self.times
    }

    /// The time the video ends: the last frame's time plus one frame interval.
    pub fn end_s(&self) -> f64 {
        self.times.last().map_or(0.0, |t| t + self.frame_dur)
    }

    /// The frame on screen at `t` seconds (the last one at or before it; the first before the first).
    fn on_screen(&self, t: f64) -> usize {
        let eps = 1e-6;
        self.times.partition_point(|&x| x <= t + eps).saturating_sub(1)
    }

    /// The frame indices of one clip: `None` where the clip runs past the end.
    fn clip_indices(&self, start: ClipStart, req: &ClipRequest, out: &mut Vec<Option<usize>>) {
        let n = self.frames.len();
        out.clear();
        let (i0, t0) = match start {
            ClipStart::Index(i) => {
                let i = usize::try_from(i).unwrap_or(usize::MAX);
                (i, self.times.get(i).copied().unwrap_or(f64::INFINITY))
            }
            ClipStart::Time(t) => {
                if t >= self.end_s() {
                    (usize::MAX, t)
                } else {
                    (self.on_screen(t), t)
                }
            }
        };
        for f in 0..req.num_frames {
            let idx = match req.step {
                ClipStep::Stride(k) => i0.checked_add(f.saturating_mul(k)).filter(|&i| i < n),
                ClipStep::Fps(fps) => {
                    let t = t0 + f as f64 / fps;
                    (i0 < n && t < self.end_s() - 1e-6).then(|| self.on_screen(t))
                }
            };
            out.push(idx);
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum ClipStart {
    Index(u64),
    Time(f64),
}

/// Plans `request` over the video whose packets (the whole stream) are `packets`, for output frames as
/// `opts` gives them.
///
/// Errors: [`Error::InvalidOptions`] (a bad request, a clip past the end under [`PastEnd::Error`], a start
/// past the end), [`Error::LimitExceeded`] (more frames or output bytes than `opts.limits` allow, refused
/// before anything of that size is allocated), [`Error::Decode`] (no decodable frame).
///
/// ```no_run
/// use spdl_io::video::{ClipOptions, ClipRequest, ClipStarts, ClipStep, DemuxOptions, PastEnd, demux_video, plan_clips};
/// use std::path::Path;
///
/// let packets = demux_video(Path::new("clip.mp4"), &DemuxOptions::default())?;
/// let request = ClipRequest {
///     starts: ClipStarts::Indices(vec![0, 8, 100]),
///     num_frames: 16,
///     step: ClipStep::Stride(1),
///     past_end: PastEnd::Error,
/// };
/// let plan = plan_clips(&packets, &request, &ClipOptions::default())?;
/// assert!(plan.frames_kept() <= 48);
/// # Ok::<(), spdl_io::Error>(())
/// ```
pub fn plan_clips(packets: &Packets, request: &ClipRequest, opts: &ClipOptions) -> Result<ClipPlan> {
    plan_on(&Timeline::new(packets), packets, request, opts)
}

/// [`plan_clips`] on a timeline already made from `packets`.
pub fn plan_on(timeline: &Timeline, packets: &Packets, request: &ClipRequest, opts: &ClipOptions) -> Result<ClipPlan> {
    request.validate()?;
    opts.validate()?;
    let item = &timeline.item;
    let limits = &opts.limits;
    let (w, h) = opts.output_size(packets)?;
    let frame_bytes = u64::from(w) * u64::from(h) * opts.pixel_format.channels() as u64;
    let num_clips = request.starts.len();
    // The output's size comes from the arguments: held to the limits before anything is built.
    let slots_n = (num_clips as u64).saturating_mul(request.num_frames as u64);
    if slots_n > limits.max_frames {
        return Err(Error::LimitExceeded {
            item: item.clone(),
            what: format!("clip frames ({num_clips} clips x {} frames)", request.num_frames),
            value: slots_n,
            limit: limits.max_frames,
        });
    }
    let bytes = slots_n.saturating_mul(frame_bytes);
    if bytes > limits.max_output_bytes {
        return Err(Error::LimitExceeded {
            item: item.clone(),
            what: format!("output bytes ({num_clips} clips x {} frames of {w}x{h})", request.num_frames),
            value: bytes,
            limit: limits.max_output_bytes,
        });
    }
    // And to the process's decode memory budget: an output that could never fit is refused now.
    crate::decode_memory::check_fits(item, "clip output bytes", bytes)?;
    let n = timeline.frames.len();
    if n == 0 && num_clips > 0 {
        return Err(Error::Decode {
            item: item.clone(),
            format: packets.codec().to_owned(),
            cause: "the video has no decodable frame".into(),
        });
    }

    // Each slot's frame index in presentation order.
    let mut slot_index: Vec<usize> = Vec::with_capacity(slots_n as usize);
    let mut clip = Vec::with_capacity(request.num_frames);
    for c in 0..num_clips {
        let start = match &request.starts {
            ClipStarts::Indices(v) => ClipStart::Index(v[c]),
            ClipStarts::Times(v) => ClipStart::Time(v[c]),
        };
        timeline.clip_indices(start, request, &mut clip);
        let valid: Vec<usize> = clip.iter().map_while(|i| *i).collect();
        if valid.is_empty() {
            let what = match start {
                ClipStart::Index(i) => format!("frame {i}"),
                ClipStart::Time(t) => format!("{t} s"),
            };
            return Err(Error::InvalidOptions(format!(
                "{item}: clip {c} starts at {what}, past the end of the video ({n} frames, {:.3} s)",
                timeline.end_s()
            )));
        }
        if valid.len() < clip.len() {
            match request.past_end {
                PastEnd::Error => {
                    return Err(Error::InvalidOptions(format!(
                        "{item}: clip {c} runs past the end of the video: it has {} of its {} frames ({n} frames, \
                         {:.3} s); ask for policy \"repeat_last\" or \"wrap\" to pad it",
                        valid.len(),
                        clip.len(),
                        timeline.end_s()
                    )));
                }
                PastEnd::RepeatLast => {
                    let last = valid[valid.len() - 1];
                    slot_index.extend(valid.iter().copied().chain(std::iter::repeat(last)).take(clip.len()));
                }
                PastEnd::Wrap => slot_index.extend(valid.iter().copied().cycle().take(clip.len())),
            }
        } else {
            slot_index.extend(valid);
        }
    }

    // The distinct frames, and each slot's entry among them.
    let mut uniq = slot_index.clone();
    uniq.sort_unstable();
    uniq.dedup();
    let kept: Vec<KeptFrame> = uniq
        .iter()
        .map(|&i| KeptFrame { ts: timeline.frames[i].0, index: i as u64, pts_s: timeline.times[i] })
        .collect();
    let slots: Vec<u32> = slot_index.iter().map(|i| uniq.partition_point(|u| u < i) as u32).collect();

    let mut keep_packet = vec![false; timeline.num_packets];
    for &i in &uniq {
        keep_packet[timeline.frames[i].1] = true;
    }
    let runs = match timeline.matching {
        // Output ordinals say nothing about which packet holds a frame (B-frames come out reordered): one
        // run from the first packet, stopped as soon as every kept frame is out.
        FrameMatch::Ordinal => {
            if uniq.is_empty() {
                Vec::new()
            } else {
                vec![(0, timeline.num_packets.saturating_sub(1))]
            }
        }
        FrameMatch::Pts => plan_runs(timeline, packets, &uniq),
    };
    Ok(ClipPlan {
        item: item.clone(),
        num_clips,
        num_frames: request.num_frames,
        matching: timeline.matching,
        kept,
        slots,
        runs,
        keep_packet,
        known_ts: timeline.known_ts.clone(),
        frames_in_video: n as u64,
    })
}

/// The packet runs that decode the frames `uniq` (presentation indices): each frame needs the packets from
/// the last keyframe at or before it (in decode order, and not shown after it) through its own; overlapping
/// needs merge into one run.
fn plan_runs(timeline: &Timeline, packets: &Packets, uniq: &[usize]) -> Vec<(usize, usize)> {
    let ps = &packets.packets;
    let keys = &timeline.keys;
    let first = keys.first().copied().unwrap_or(0);
    if !timeline.keys_monotonic {
        // Keyframe timestamps that do not rise: a frame's keyframe cannot be told from timestamps, so one
        // run from the first keyframe through the last packet needed.
        let end = uniq.iter().map(|&i| timeline.frames[i].1).max().unwrap_or(first);
        return vec![(first, end)];
    }
    let mut needs: Vec<(usize, usize)> = uniq
        .iter()
        .map(|&i| {
            let (ts, p) = timeline.frames[i];
            // The last keyframe at or before the packet (decode order) that is not shown after the frame
            // (frames shown before their GOP's keyframe, open-GOP leading frames, need the GOP before).
            let upto = keys.partition_point(|&k| k <= p);
            let k = keys[..upto].iter().rev().find(|&&k| ps[k].time().is_some_and(|kt| kt <= ts)).copied();
            (k.unwrap_or(first), p)
        })
        .collect();
    needs.sort_unstable();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (s, e) in needs {
        match runs.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => runs.push((s, e)),
        }
    }
    runs
}

/// Decodes `plan` (made from `packets`) into one `[clips, frames, H, W, C]` buffer from `allocator`.
///
/// Errors: [`Error::Decode`] (a kept frame did not decode, named with how many), [`Error::LimitExceeded`],
/// [`Error::Unavailable`] (no FFmpeg).
pub fn decode_clips(
    packets: Packets,
    plan: &ClipPlan,
    opts: &ClipOptions,
    allocator: &SharedAllocator,
) -> Result<Clips> {
    let (w, h) = opts.output_size(&packets)?;
    let c = opts.pixel_format.channels();
    let shape = [plan.num_clips, plan.num_frames, h as usize, w as usize, c];
    let mut buffer = Buffer::zeros(DType::U8, &shape, Layout::Nhwc, allocator)?;
    let frame_rate = packets.frame_rate;
    let codec = packets.codec().to_owned();
    let item = packets.item().to_owned();
    let stats = decode_clips_into(packets, plan, opts, buffer.as_bytes_mut())?;
    Ok(Clips { buffer, indices: plan.frame_indices(), pts_s: plan.pts_s(), frame_rate, codec, item, stats })
}

/// Decodes `plan` into `dst`, `clips * frames * H * W * C` bytes (clip-major), e.g. one video's slot of a
/// batch.
pub fn decode_clips_into(packets: Packets, plan: &ClipPlan, opts: &ClipOptions, dst: &mut [u8]) -> Result<ClipStats> {
    let (w, h) = opts.output_size(&packets)?;
    let need = plan.slots.len() * w as usize * h as usize * opts.pixel_format.channels();
    if dst.len() != need {
        return Err(Error::InvalidOptions(format!(
            "{}: the clips need {need} output bytes, the destination has {}",
            plan.item,
            dst.len()
        )));
    }
    if plan.slots.is_empty() {
        return Ok(ClipStats { frames_in_video: plan.frames_in_video, ..Default::default() });
    }
    crate::media::backend()?.decode_clips(packets, plan, opts, dst)
}

/// Demuxes `input` (the whole video stream), plans `request` and decodes it ([`plan_clips`] +
/// [`decode_clips`]).
///
/// ```no_run
/// use spdl_buffer::system_allocator;
/// use spdl_io::video::{ClipOptions, ClipRequest, ClipStarts, ClipStep, PastEnd, load_clips};
/// use std::path::Path;
///
/// let request = ClipRequest {
///     starts: ClipStarts::Times(vec![0.0, 1.5, 3.0, 4.5]),
///     num_frames: 16,
///     step: ClipStep::Stride(2),
///     past_end: PastEnd::RepeatLast,
/// };
/// let opts = ClipOptions { size: Some((112, 112)), ..Default::default() };
/// let clips = load_clips(Path::new("clip.mp4"), &request, &opts, &system_allocator())?;
/// assert_eq!(clips.buffer.shape(), &[4, 16, 112, 112, 3]);
/// # Ok::<(), spdl_io::Error>(())
/// ```
pub fn load_clips<'a>(
    input: impl Into<MediaInput<'a>>,
    request: &ClipRequest,
    opts: &ClipOptions,
    allocator: &SharedAllocator,
) -> Result<Clips> {
    request.validate()?;
    opts.validate()?;
    let packets = super::demux_video(input, &super::DemuxOptions { window: None, limits: opts.limits })?;
    let plan = plan_clips(&packets, request, opts)?;
    decode_clips(packets, &plan, opts, allocator)
}

/// Demuxes `input` (the whole video stream), lets `sampler` place `num_frames`-frame clips `step` apart on
/// its timeline, and decodes them ([`ClipSampler::request`] + [`plan_on`] + [`decode_clips`]).
///
/// ```no_run
/// use spdl_buffer::system_allocator;
/// use spdl_io::video::{ClipOptions, ClipSampler, ClipStep, PastEnd, load_sampled_clips};
/// use std::path::Path;
///
/// let sampler = ClipSampler::RandomIndices { num_clips: 4, seed: 7 };
/// let clips = load_sampled_clips(Path::new("clip.mp4"), sampler, 16, ClipStep::Stride(1), PastEnd::RepeatLast,
///     &ClipOptions::default(), &system_allocator())?;
/// assert_eq!(clips.buffer.shape()[..2], [4, 16]);
/// # Ok::<(), spdl_io::Error>(())
/// ```
pub fn load_sampled_clips<'a>(
    input: impl Into<MediaInput<'a>>,
    sampler: ClipSampler,
    num_frames: usize,
    step: ClipStep,
    past_end: PastEnd,
    opts: &ClipOptions,
    allocator: &SharedAllocator,
) -> Result<Clips> {
    opts.validate()?;
    let packets = super::demux_video(input, &super::DemuxOptions { window: None, limits: opts.limits })?;
    let timeline = Timeline::new(&packets);
    let request = sampler.request(&timeline, num_frames, step, past_end)?;
    let plan = plan_on(&timeline, &packets, &request, opts)?;
    decode_clips(packets, &plan, opts, allocator)
}

/// How clip starts are chosen from a video: from a seed and the video alone, so a run can be reproduced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ClipSampler {
    /// `num_clips` start indices drawn uniformly (with replacement) among those whose clip fits, sorted.
    RandomIndices {
        /// Clips to draw.
        num_clips: usize,
        /// The seed.
        seed: u64,
    },
    /// `num_clips` start indices evenly spaced over those whose clip fits.
    RegularIndices {
        /// Clips.
        num_clips: usize,
    },
    /// `num_clips` start times drawn uniformly (with replacement) over the times whose clip fits, sorted.
    RandomTimes {
        /// Clips to draw.
        num_clips: usize,
        /// The seed.
        seed: u64,
    },
    /// `num_clips` start times evenly spaced over the times whose clip fits.
    RegularTimes {
        /// Clips.
        num_clips: usize,
    },
    /// The whole video at `fps`, cut into consecutive clips (the last padded by the request's policy).
    AllAtFps {
        /// Frames per second.
        fps: f64,
    },
}

impl ClipSampler {
    /// The request this sampler makes for a video with `timeline`, clips of `num_frames` frames `step`
    /// apart (an [`ClipSampler::AllAtFps`] sampler sets the step to its fps).
    pub fn request(
        self,
        timeline: &Timeline,
        num_frames: usize,
        step: ClipStep,
        past_end: PastEnd,
    ) -> Result<ClipRequest> {
        let step = match self {
            ClipSampler::AllAtFps { fps } => ClipStep::Fps(fps),
            _ => step,
        };
        let starts =
            sample_starts(self, timeline.len() as u64, timeline.times(), num_frames, step).map_err(|e| match e {
                Error::InvalidOptions(m) => Error::InvalidOptions(format!("{}: {m}", timeline.item)),
                other => other,
            })?;
        Ok(ClipRequest { starts, num_frames, step, past_end })
    }
}

/// A counter-based generator (SplitMix64): the same seed gives the same draws on every platform.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..=hi`.
    fn below_incl(&mut self, hi: u64) -> u64 {
        match hi.checked_add(1) {
            Some(n) => ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64,
            None => self.next_u64(),
        }
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Largest number of clips a sampler makes (a request over it is refused, not truncated).
pub const MAX_SAMPLED_CLIPS: usize = 1 << 16;

/// The clip starts `sampler` picks for a video of `num_frames_in_video` frames whose presentation times are
/// `times` (seconds, ascending; may be empty when only index samplers are used), for clips of `num_frames`
/// frames `step` apart.
///
/// ```
/// use spdl_io::video::{ClipSampler, ClipStarts, ClipStep, sample_starts};
///
/// // 300 frames; 4 random clips of 16 consecutive frames, seeded.
/// let sampler = ClipSampler::RandomIndices { num_clips: 4, seed: 7 };
/// let ClipStarts::Indices(v) = sample_starts(sampler, 300, &[], 16, ClipStep::Stride(1))? else { unreachable!() };
/// assert!(v.len() == 4 && v.iter().all(|&i| i + 16 <= 300));
/// # Ok::<(), spdl_io::Error>(())
/// ```
pub fn sample_starts(
    sampler: ClipSampler,
    num_frames_in_video: u64,
    times: &[f64],
    num_frames: usize,
    step: ClipStep,
) -> Result<ClipStarts> {
    let n = num_frames_in_video;
    let (t_first, t_end) = clip_span_times(times);
    let count = match sampler {
        ClipSampler::RandomIndices { num_clips, .. }
        | ClipSampler::RegularIndices { num_clips }
        | ClipSampler::RandomTimes { num_clips, .. }
        | ClipSampler::RegularTimes { num_clips } => num_clips,
        ClipSampler::AllAtFps { fps } => {
            if !(fps.is_finite() && fps > 0.0) {
                return Err(Error::InvalidOptions(format!("fps must be finite and > 0, got {fps}")));
            }
            let per_clip = num_frames.max(1) as f64 / fps;
            let clips = ((t_end - t_first) / per_clip).ceil();
            if clips.is_finite() && clips <= MAX_SAMPLED_CLIPS as f64 { clips.max(1.0) as usize } else { usize::MAX }
        }
    };
    if count > MAX_SAMPLED_CLIPS {
        return Err(Error::InvalidOptions(format!("{count} clips requested (at most {MAX_SAMPLED_CLIPS})")));
    }
    if num_frames == 0 {
        return Err(Error::InvalidOptions("num_frames must be >= 1".into()));
    }
    if n == 0 {
        return Err(Error::InvalidOptions("the video has no decodable frame".into()));
    }
    // Index span of one clip, and the last start whose clip fits (0 when none fits: the clip is then
    // padded or refused by the request's policy).
    let by_index_last = |stride: usize| -> u64 {
        let span = (num_frames as u64 - 1).saturating_mul(stride as u64);
        n.saturating_sub(1).saturating_sub(span)
    };
    let clip_dur = match step {
        ClipStep::Fps(f) => (num_frames as f64 - 1.0) / f,
        ClipStep::Stride(k) => {
            let i = (num_frames as u64 - 1).saturating_mul(k as u64) as usize;
            match (times.first(), times.get(i)) {
                (Some(a), Some(b)) => b - a,
                _ => t_end - t_first,
            }
        }
    };
    // The last start time whose clip ends before the video does (one frame of the clip is on screen).
    let frame_dur = (t_end - times.last().copied().unwrap_or(t_first)).max(0.0);
    let t_last = (t_end - frame_dur - clip_dur).max(t_first);
    let stride = match step {
        ClipStep::Stride(k) => k.max(1),
        ClipStep::Fps(_) => 1,
    };
    Ok(match sampler {
        ClipSampler::RandomIndices { num_clips, seed } => {
            let mut rng = SplitMix64(seed);
            let hi = by_index_last(stride);
            let mut v: Vec<u64> = (0..num_clips).map(|_| rng.below_incl(hi)).collect();
            v.sort_unstable();
            ClipStarts::Indices(v)
        }
        ClipSampler::RegularIndices { num_clips } => {
            let hi = by_index_last(stride);
            ClipStarts::Indices(
                (0..num_clips)
                    .map(|i| {
                        if num_clips <= 1 {
                            0
                        } else {
                            ((i as f64 * hi as f64) / (num_clips - 1) as f64).round() as u64
                        }
                    })
                    .collect(),
            )
        }
        ClipSampler::RandomTimes { num_clips, seed } => {
            let mut rng = SplitMix64(seed);
            let mut v: Vec<f64> = (0..num_clips).map(|_| t_first + rng.unit() * (t_last - t_first)).collect();
            v.sort_by(f64::total_cmp);
            ClipStarts::Times(v)
        }
        ClipSampler::RegularTimes { num_clips } => ClipStarts::Times(
            (0..num_clips)
                .map(|i| {
                    if num_clips <= 1 {
                        t_first
                    } else {
                        t_first + (t_last - t_first) * i as f64 / (num_clips - 1) as f64
                    }
                })
                .collect(),
        ),
        ClipSampler::AllAtFps { fps } => {
            let per_clip = num_frames as f64 / fps;
            ClipStarts::Times((0..count).map(|i| t_first + i as f64 * per_clip).collect())
        }
    })
}

/// `(first frame time, end time)` of `times` (the end one median frame interval past the last frame).
fn clip_span_times(times: &[f64]) -> (f64, f64) {
    let first = times.first().copied().unwrap_or(0.0);
    let last = times.last().copied().unwrap_or(first);
    let mut gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).filter(|g| *g > 0.0).collect();
    gaps.sort_by(f64::total_cmp);
    let dur = gaps.get(gaps.len() / 2).copied().unwrap_or(0.0);
    (first, last + dur)
}
